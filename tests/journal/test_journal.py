"""The journal of a generic pipeline: each output's id and source positions, and rebuild."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import asyncflow as af
from asyncflow import ConfigError, Journal, Pipeline
from asyncflow.journal import Journaled

pytestmark = pytest.mark.usefixtures("leak_check")


def ten_times(x: int) -> int:
    if x in (5, 13):
        raise ValueError(f"bad {x}")
    return 10 * x


def build(n: int = 20) -> Pipeline:
    return Pipeline(list(range(n))).map(ten_times, max_failures=2, concurrency=2).batch(4)


def test_every_output_is_journaled_with_its_positions_and_failures(tmp_path: Path) -> None:
    pipe = build()
    delivered = list(pipe.journal(tmp_path))
    assert delivered[1] == [40, 60, 70, 80]
    record = af.explain(tmp_path, epoch=0, step=1)
    assert (record.epoch, record.step, record.rank, record.kind) == (0, 1, 0, "pipeline")
    assert record.positions == (4, 6, 7, 8)
    assert [(f.position, f.item) for f in record.failed] == [(5, "5")]
    assert "ValueError: bad 5" in record.failed[0].error
    assert af.explain(tmp_path, epoch=0, step=3).positions == (14, 15, 16, 17)
    assert [f.position for f in af.explain(tmp_path, epoch=0, step=3).failed] == [13]
    for step, batch in enumerate(delivered):
        assert af.rebuild(pipe, af.explain(tmp_path, epoch=0, step=step)) == batch


def test_outputs_past_many_compactions_are_traced(tmp_path: Path) -> None:
    # Many more outputs than the lineage keeps between compactions, through an unordered
    # map (whose ledger records each output's input): each is traced to its own items.
    pipe = Pipeline(list(range(6000))).map(str, concurrency=3, ordered=False).batch(3)
    delivered = list(pipe.prefetch(8).journal(tmp_path))
    assert len(delivered) == 2000
    lines = (tmp_path / "rank-00000.jsonl").read_text().splitlines()[1:]
    for batch, line in zip(delivered, lines, strict=True):
        assert [str(p) for p in json.loads(line)["positions"]] == batch


def test_a_later_epoch_and_an_explicit_rank(tmp_path: Path) -> None:
    pipe = build().journal(tmp_path, rank=2)
    list(pipe)
    second = list(pipe)
    assert (tmp_path / "rank-00002.jsonl").exists()
    record = af.explain(Journal(pipe, tmp_path, rank=2), epoch=1, step=4, rank=2)
    assert record.positions == (18, 19) and af.rebuild(pipe, record) == second[4]
    with pytest.raises(LookupError, match="epoch=1, step=5"):
        af.explain(tmp_path, epoch=1, step=5, rank=2)
    with pytest.raises(LookupError):
        af.explain(tmp_path, epoch=0, step=0, rank=0)


def test_a_journal_across_a_resume(tmp_path: Path) -> None:
    full = list(build(40))
    pipe = build(40).journal(tmp_path)
    with pipe.open() as run:
        taken = [next(run) for _ in range(3)]
        state = pipe.state_dict()
        taken += [next(run) for _ in range(2)]  # delivered after the state: again on resume
    resumed = build(40).journal(tmp_path)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = list(resumed)
    assert taken[:3] + rest == full
    for step, batch in enumerate(full):
        record = af.explain(tmp_path, epoch=0, step=step)
        assert af.rebuild(build(40), record) == batch


def test_a_damaged_record_of_the_resumed_epoch_is_named(tmp_path: Path) -> None:
    # A resumed run counts its steps on from the records whose positions the state settled;
    # a record with a position that is not a number failed it with a bare TypeError.
    pipe = build(40).journal(tmp_path)
    with pipe.open() as run:
        [next(run) for _ in range(3)]
        state = json.loads(json.dumps(pipe.state_dict()))
    file = tmp_path / "rank-00000.jsonl"
    lines = file.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace('"positions":[', '"positions":["x",', 1)
    file.write_text("".join(lines))
    resumed = build(40).journal(tmp_path)
    resumed.load_state_dict(state)
    with pytest.raises(ConfigError, match=r"rank-00000\.jsonl:3: the record .* damaged"):
        list(resumed)


@pytest.mark.parametrize(("stage", "name"), [
    (lambda p: p.shuffle(buffer_size=4, seed=1), "shuffle"),
    (lambda p: p.map(int, ordered=False, concurrency=2, name="loose"), "loose"),
])
def test_rebuild_names_the_stage_that_makes_it_impossible(
    tmp_path: Path, stage: object, name: str
) -> None:
    pipe = stage(Pipeline(list(range(8)))).batch(4)  # type: ignore[operator]
    delivered = list(pipe.journal(tmp_path))
    for step, batch in enumerate(delivered):  # the source is range(8): items are positions
        assert af.explain(tmp_path, epoch=0, step=step).positions == tuple(batch)
    record = af.explain(tmp_path, epoch=0, step=0)
    with pytest.raises(ConfigError, match=f"stage '{name}'"):
        af.rebuild(pipe, record)


def test_a_rank_must_be_a_count(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rank"):
        build().journal(tmp_path, rank=-1)


def fails_at_150(x: int) -> int:
    if x == 150:
        raise ValueError("bad 150")
    return x


def keep(x: int) -> bool:
    return x % 7 != 0


def test_a_late_failure_is_placed_in_its_output_and_a_filtered_item_is_not(
    tmp_path: Path,
) -> None:
    pipe = Pipeline(list(range(200))).filter(keep).map(fails_at_150, max_failures=1).batch(4)
    delivered = list(pipe.journal(tmp_path))
    records = [af.explain(tmp_path, epoch=0, step=s) for s in range(len(delivered))]
    assert [list(r.positions or ()) for r in records] == delivered  # items are positions
    failed = [(r.step, f.position) for r in records for f in r.failed]
    assert len(failed) == 1 and failed[0][1] == 150
    step = failed[0][0]
    assert max(delivered[step - 1]) < 150 < max(delivered[step])
    assert all(af.rebuild(pipe, r) == batch for r, batch in zip(records, delivered, strict=True))


def fails_at_c(key: str) -> str:
    if key == "c":
        raise ValueError("bad c")
    return key.upper()


def test_a_mapping_source_is_journaled_by_its_keys(tmp_path: Path) -> None:
    # A dict source yields its keys; the journal took the item at position p as source[p]:
    # the first failure within the budget ended the loop with a bare KeyError: 2, and
    # rebuild() failed so too.
    source = {key: None for key in "abcdefgh"}
    pipe = Pipeline(source).map(fails_at_c, max_failures=1).batch(2)
    delivered = list(pipe.journal(tmp_path))
    assert delivered == [["A", "B"], ["D", "E"], ["F", "G"], ["H"]]
    record = af.explain(tmp_path, epoch=0, step=1)
    assert record.positions == (3, 4)
    assert [(f.position, f.item) for f in record.failed] == [(2, "'c'")]
    assert [af.rebuild(pipe, af.explain(tmp_path, epoch=0, step=s))
            for s in range(4)] == delivered


# -- a journal torn by a crash (issue 25, point 15) ------------------------------------------


def _cut(file: Path, keep: int) -> None:
    """Cut ``file`` ``keep`` bytes into its last line, as a crash mid-write leaves it."""
    data = file.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    file.write_bytes(data[:last + keep])


def test_a_cut_last_record_is_skipped_and_looking_it_up_says_so(tmp_path: Path) -> None:
    pipe = build().journal(tmp_path)
    delivered = list(pipe)  # 5 outputs: steps 0-4
    file = tmp_path / "rank-00000.jsonl"
    _cut(file, 30)
    for step in range(4):
        assert af.rebuild(build(), af.explain(tmp_path, epoch=0, step=step)) == delivered[step]
    with pytest.raises(LookupError, match=r"rank-00000\.jsonl:6: the record of output "
                                          r"\(epoch=0, step=4, rank=0\) is cut"):
        af.explain(tmp_path, epoch=0, step=4)
    again = list(pipe)  # epoch 1 appends after the cut line, not onto it
    assert af.explain(tmp_path, epoch=1, step=4).positions == (18, 19)
    assert af.rebuild(build(), af.explain(tmp_path, epoch=1, step=4)) == again[4]
    assert af.explain(tmp_path, epoch=0, step=3).positions == (14, 15, 16, 17)


def test_a_cut_run_header_fails_only_the_lookups_that_need_it(tmp_path: Path) -> None:
    file = tmp_path / "rank-00000.jsonl"
    pipe = build().journal(tmp_path)
    list(pipe)
    first = file.read_bytes()
    list(pipe)
    second = file.read_bytes()[len(first):]
    # the second run's header cut, and the lines after it glued on (as a journal written
    # before cut lines were ended holds them): its records lost their configuration
    header, rest = second.split(b"\n", 1)
    file.write_bytes(first + header[:25] + rest)
    assert af.explain(tmp_path, epoch=0, step=2).positions == (9, 10, 11, 12)
    with pytest.raises(ConfigError, match=r"rank-00000\.jsonl:7: the header of the run that "
                                          r"wrote output \(epoch=1, step=1, rank=0\) is cut"):
        af.explain(tmp_path, epoch=1, step=1)
    # a header cut as the run crashed, ended by the next run: it holds no records
    file.write_bytes(first + header[:25])
    list(pipe)  # epoch 2
    assert af.explain(tmp_path, epoch=2, step=1).positions == (4, 6, 7, 8)
    assert af.explain(tmp_path, epoch=0, step=1).positions == (4, 6, 7, 8)


def test_a_damaged_record_is_named_and_unknown_fields_are_kept(tmp_path: Path) -> None:
    list(build().journal(tmp_path))
    file = tmp_path / "rank-00000.jsonl"
    lines = file.read_text().splitlines()
    record = json.loads(lines[2])
    lines[2] = json.dumps({**record, "decoder": "nvjpeg"}, separators=(",", ":"))
    lines[3] = lines[3].replace('"positions":[', '"positions":["x",')
    file.write_text("\n".join(lines) + "\n")
    assert af.explain(tmp_path, epoch=0, step=1).extra == {"decoder": "nvjpeg"}
    with pytest.raises(ConfigError, match=r"rank-00000\.jsonl:4: the record of output "
                                          r"\(epoch=0, step=2, rank=0\) is damaged"):
        af.explain(tmp_path, epoch=0, step=2)


class OwnRecords:
    """Stands for a pipeline that records its own outputs, through the public protocol only
    (``image.folder`` is one): each output's record names its items."""

    source = None

    def journal_begin(self) -> dict[str, Any]:
        return {"kind": "pairs", "size": 2}

    def journal_entry(self, output: list[int], cache: dict[int, Any]) -> dict[str, Any]:
        cache[0] = step = cache.get(0, -1) + 1
        return {"epoch": 0, "step": step, "positions": output,
                "items": [[f"item-{x}", x, x] for x in output]}

    def journal_rebuild(self, config: dict[str, Any], epoch: int, items: list[Any]) -> Any:
        assert config == {"kind": "pairs", "size": 2} and epoch == 0
        return [label for _, label, _ in items]


def test_a_pipeline_journals_its_own_outputs_through_the_journaled_protocol(
    tmp_path: Path,
) -> None:
    own = OwnRecords()
    assert isinstance(own, Journaled)
    delivered = list(Pipeline(list(range(6))).batch(2).with_hook(Journal(own, tmp_path)))
    record = af.explain(tmp_path, epoch=0, step=1)
    assert (record.kind, record.positions, record.items) == (
        "pairs", (2, 3), (("item-2", 2, 2), ("item-3", 3, 3)))
    assert af.rebuild(own, record) == delivered[1] == [2, 3]
    with pytest.raises(ConfigError, match="made by pairs: pass that pipeline"):
        af.rebuild(build(), record)
