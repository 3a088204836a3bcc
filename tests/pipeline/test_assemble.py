"""``Pipeline.assemble``: rows in any order, whole batches out in batch order."""

from __future__ import annotations

import random
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline, PipelineError
from asyncflow.pipeline import AssembleSpec, ItemGroup


class Bad(ValueError):
    pass


class Rows:
    """A small assembler: rows ``(pos, value)`` (``value`` an exception for a failed row);
    batches are the values of ``batch_size`` consecutive positions, failed rows left out."""

    def __init__(self, count: int, batch_size: int, *, drop_last: bool = False) -> None:
        self.count, self.batch_size, self.drop_last = count, batch_size, drop_last
        self.open: dict[int, dict[int, Any]] = {}
        self.next = 0
        self.told: list[tuple[int, bool]] = []

    def _rows(self, number: int) -> int:
        return min(self.batch_size, self.count - number * self.batch_size)

    def failure(self, row: tuple[int, Any]) -> Exception | None:
        return row[1] if isinstance(row[1], Exception) else None

    def arrived(self, row: tuple[int, Any], *, ok: bool) -> list[list[Any]]:
        pos, value = row
        self.told.append((pos, ok))
        number, index = divmod(pos, self.batch_size)
        self.open.setdefault(number, {})[index] = value if ok else None
        out = []
        while len(self.open.get(self.next, ())) == self._rows(self.next) > 0:
            done = self.open.pop(self.next)
            short = self._rows(self.next) < self.batch_size
            batch = [done[i] for i in sorted(done) if done[i] is not None]
            if batch and not (short and self.drop_last):
                out.append(batch)
            self.next += 1
        return out


def _shuffled_rows(count: int, seed: int = 0) -> list[tuple[int, Any]]:
    rows: list[tuple[int, Any]] = [(pos, pos * 10) for pos in range(count)]
    random.Random(seed).shuffle(rows)
    return rows


def test_rows_in_any_order_make_batches_in_order(leak_check: None) -> None:
    pipe = Pipeline(_shuffled_rows(10)).assemble(Rows(10, 4), batch_size=4)
    assert list(pipe) == [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]
    stats = pipe.stats()["assemble"]
    assert (stats.kind, stats.items_in, stats.items_out, stats.chunks) == ("assemble", 10, 3, 10)


def test_a_byte_budget_bounds_the_batches_waiting_for_the_consumer() -> None:
    # One batch's bytes (image.folder's batch stage): the consumer's batch, lent, counts.
    pipe = Pipeline(_shuffled_rows(10)).assemble(Rows(10, 2), batch_size=2, buffer_bytes=1)
    assert pipe.describe()[1]["buffer_bytes"] == 1
    seen = []
    for batch in pipe:
        seen.append(batch)
        assert pipe.stats()["assemble"].queue_fill <= 1
    assert seen == [[0, 10], [20, 30], [40, 50], [60, 70], [80, 90]]


def test_drop_last_is_the_assembler_s_and_described() -> None:
    pipe = Pipeline(_shuffled_rows(10)).assemble(Rows(10, 4, drop_last=True), batch_size=4,
                                                  drop_last=True, name="batch")
    assert list(pipe) == [[0, 10, 20, 30], [40, 50, 60, 70]]
    assert pipe.describe()[1] == {
        "kind": "assemble", "name": "batch", "assembler": "Rows", "batch_size": 4,
        "drop_last": True, "max_failures": None, "buffer": None, "buffer_bytes": None,
    }
    assert [(s.name, s.kind) for s in pipe.stats().stages] == [
        (d["name"], d["kind"]) for d in pipe.describe()
    ]


def test_a_failed_row_is_counted_after_the_batches_it_completes() -> None:
    rows = [(1, 10), (0, Bad("row 0")), (3, 30), (2, 20)]
    assembler = Rows(4, 2)
    pipe = Pipeline(rows).assemble(assembler, batch_size=2, max_failures=1)
    assert list(pipe) == [[10], [20, 30]]  # the first batch lost its failed row
    assert assembler.told == [(1, True), (0, False), (3, True), (2, True)]
    (failure,) = pipe.stats().failures
    assert (failure.stage, failure.error_type) == ("assemble", "Bad")
    assert "row 0" in failure.message


def test_a_failed_row_over_the_budget_fails_the_run_after_its_batches() -> None:
    rows = [(1, 10), (0, Bad("row 0")), (2, 20), (3, 30)]
    got = []
    with pytest.raises(PipelineError) as info:
        for batch in Pipeline(rows).assemble(Rows(4, 2), batch_size=2, name="batch"):
            got.append(batch)
    assert got == [[10]]  # released before the failure was counted
    assert info.group_contains(Bad, match="row 0")
    assert "'batch'" in str(info.value.exceptions[0].__notes__)


def test_an_epoch_where_every_row_fails_is_an_error() -> None:
    rows = [(0, Bad("a")), (1, Bad("b"))]
    with pytest.raises(PipelineError) as info:
        list(Pipeline(rows).assemble(Rows(2, 2), batch_size=2, max_failures=1.0))
    assert "every one" in str(info.value.exceptions[0])


def test_rows_grouped_in_an_item_group_are_told_apart() -> None:
    groups = [ItemGroup([(2, 20), (0, 0)]), ItemGroup([(3, 30)]), (1, 10)]
    assembler = Rows(4, 2)
    pipe = Pipeline(groups).assemble(assembler, batch_size=2)
    assert list(pipe) == [[0, 10], [20, 30]]
    assert [pos for pos, _ in assembler.told] == [2, 0, 3, 1]
    assert pipe.stats()["assemble"].items_in == 4


def test_an_error_of_the_assembler_itself_fails_the_stage() -> None:
    class Broken(Rows):
        def arrived(self, row: tuple[int, Any], *, ok: bool) -> list[list[Any]]:
            raise RuntimeError("lost track")

    with pytest.raises(PipelineError) as info:
        list(Pipeline([(0, 0)]).assemble(Broken(1, 1), batch_size=1, max_failures=5))
    assert info.group_contains(RuntimeError, match="lost track")


def test_stages_after_it_see_batches_and_unordered_maps_before_it_are_fine() -> None:
    def double(row: tuple[int, int]) -> tuple[int, int]:
        return row[0], row[1] * 2

    pipe = (
        Pipeline(list((pos, pos) for pos in range(9)))
        .map(double, concurrency=3, ordered=False)
        .assemble(Rows(9, 3), batch_size=3)
        .map(sum)
    )
    assert list(pipe) == [6, 24, 42]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_size": 2, "drop_last": 1}, "drop_last"),
        ({"batch_size": 2, "max_failures": -1}, "max_failures"),
        ({"batch_size": 2, "buffer": 0}, "buffer"),
        ({"batch_size": 2, "buffer_bytes": 0}, "buffer_bytes"),
    ],
)
def test_bad_settings_are_refused_when_the_stage_is_added(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        Pipeline([]).assemble(Rows(0, 2), **kwargs)


def test_an_assembler_without_the_methods_is_refused() -> None:
    class OnlyArrived:
        def arrived(self, row: Any, *, ok: bool) -> list[Any]:
            return []

    with pytest.raises(ConfigError, match="lacks failure"):
        AssembleSpec(assembler=OnlyArrived(), batch_size=2)  # type: ignore[arg-type]
