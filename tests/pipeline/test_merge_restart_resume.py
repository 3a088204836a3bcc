"""A merge whose branches restart within its run (``mix(stop="cycle" | "never")``) resumes
exactly: a state taken before, at or after any number of restarts yields what the
uninterrupted run would have yielded after it."""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncflow import ConfigError, Pipeline, PipelineError, RandomSampler, mix
from asyncflow.pipeline import BranchEnd, Merge
from asyncflow.pipeline import state_checksum as _checksum

Make = Callable[[], Pipeline[Any]]


def _tag(name: str) -> Callable[[int], tuple[str, int]]:
    def tag(x: int) -> tuple[str, int]:
        return (name, x)

    return tag


def _odd(x: int) -> bool:
    return x % 3 != 0


def _weighted(stop: str, seed: int = 3) -> Pipeline[Any]:
    """Three inputs of different lengths (3, 9 of 13 through a filter, 40): the short ones
    restart many times in one run."""
    a = Pipeline(range(3), name="a").map(_tag("a"))
    b = Pipeline(list(range(13)), name="b").filter(_odd).map(_tag("b"))
    c = Pipeline(range(40), name="c").map(_tag("c"), concurrency=3)
    return mix([a, b, c], weights=[0.2, 0.3, 0.5], seed=seed, stop=stop)


def _shuffled(stop: str) -> Pipeline[Any]:
    """An input shuffled per epoch by a buffer: each restart reads it in another order."""
    s = Pipeline(range(6), name="s").shuffle(buffer_size=4, seed=11).map(_tag("s"))
    t = Pipeline(range(25), name="t").map(_tag("t"))
    return mix([s, t], weights=[0.5, 0.5], seed=8, stop=stop)


def _sampled(stop: str) -> Pipeline[Any]:
    """An input read in a random order by index, another each epoch (the sampler counts
    its epochs itself)."""
    s = Pipeline(RandomSampler(6, seed=5), name="s").map(_tag("s"))
    t = Pipeline(range(25), name="t").map(_tag("t"))
    return mix([s, t], seed=8, stop=stop)


@dataclass
class RoundRobin:
    """One item of each live branch in turn; a branch that ran out restarts ``times`` times
    (``-1``: forever), then drops out."""

    times: int = -1

    def open(self, epoch: int, branches: int) -> _Turns:
        return _Turns(self.times, branches)


class _Turns:
    def __init__(self, times: int, branches: int) -> None:
        self.times = times
        self.live = list(range(branches))
        self.turn = -1
        self.restarts = [0] * branches

    def choose(self) -> int | None:
        if not self.live:
            return None
        self.turn = (self.turn + 1) % len(self.live)
        return self.live[self.turn]

    def ended(self, branch: int, *, empty: bool) -> BranchEnd:
        if not empty and (self.times < 0 or self.restarts[branch] < self.times):
            self.restarts[branch] += 1
            return "restart"
        self.live.remove(branch)
        self.turn -= 1
        return "drop"


def _round_robin(times: int = 3) -> Pipeline[Any]:
    a = Pipeline(range(4), name="a").map(_tag("a"))
    b = Pipeline(range(7), name="b").map(_tag("b"))
    return Pipeline(Merge([a, b], RoundRobin(times), name="rr"), name="rr")


def _take(items: Iterable[Any], n: int) -> list[Any]:
    return list(itertools.islice(items, n))


def _state_after(pipe: Pipeline[Any], k: int, *, ahead: int = 0
                 ) -> tuple[list[Any], dict[str, Any]]:
    """The first ``k`` items of a run of ``pipe``, and its state then, through JSON (once
    the merge has put out ``ahead`` items)."""
    with pipe.open() as run:
        head = [next(run) for _ in range(k)]
        if ahead:
            _read_ahead(pipe, ahead)
        state = json.loads(json.dumps(pipe.state_dict()))
    return head, state


def _resumed(make: Make, state: dict[str, Any]) -> Pipeline[Any]:
    pipe = make()
    pipe.load_state_dict(state)
    return pipe


def _like(got: list[Any], want: list[Any], *, shuffled: str = "s", era: int = 6) -> bool:
    """``got`` is ``want``, but for the items of the ``shuffled`` input's era delivered in
    part when the state was taken: a resumed buffer shuffle orders what is left of it anew
    (so where the merge ends within that era, other items of it come). The same picks, and
    every later item the same, in the same order: the later eras follow the input's epochs."""
    def of(items: list[Any], name: str) -> list[Any]:
        return [x for x in items if x[0] == name]

    if [x[0] for x in got] != [x[0] for x in want]:
        return False
    names = {x[0] for x in want}
    return all(of(got, n)[era if n == shuffled else 0:] == of(want, n)[era if n == shuffled
                                                                    else 0:] for n in names)


def _read_ahead(pipe: Pipeline[Any], items: int, stage: str = "mix") -> None:
    """Wait (boundedly) until ``stage`` of ``pipe``'s run has put out ``items`` items, so
    that a state taken now has more in flight than the consumer took."""
    for _ in range(1000):
        out = [s.items_out for s in pipe.stats().stages if s.name == stage]
        if out and out[0] >= items:
            return
        time.sleep(0.002)


def _eras(state: dict[str, Any], merge: str = "mix") -> list[int]:
    """How many eras of each branch the state lists (more than one: items of an era that
    ran out were still in flight)."""
    return [len(b["eras"]) for b in state["nodes"][merge]["branches"]]


def _restarts(state: dict[str, Any], merge: str = "mix") -> list[int]:
    """How many times each branch had restarted when the state was taken (at least)."""
    return [sum(n for _, n in b["done"]) + len(b["eras"]) - 1
            for b in state["nodes"][merge]["branches"]]


@pytest.mark.parametrize("make", [lambda: _weighted("cycle"), lambda: _sampled("cycle"),
                                  _round_robin], ids=["weighted", "sampled", "round-robin"])
def test_a_state_at_any_item_resumes_exactly(make: Make, leak_check: None) -> None:
    full = list(make())
    assert len(full) > 40
    restarted = set()
    for k in range(len(full) + 1):
        head, state = _state_after(make(), k)
        assert head == full[:k]
        assert list(_resumed(make, state)) == full[k:], k
        restarted.add(max(_restarts(state, next(iter(state["nodes"])))))
    assert max(restarted) >= 3  # states before, at and after several restarts


def test_a_shuffled_input_resumes_each_era_in_its_epoch_s_order(leak_check: None) -> None:
    full = list(_shuffled("cycle"))
    for k in range(len(full) + 1):
        head, state = _state_after(_shuffled("cycle"), k)
        assert head == full[:k]
        assert _like(list(_resumed(lambda: _shuffled("cycle"), state)), full[k:]), k


@pytest.mark.parametrize("make", [_shuffled, _sampled])
def test_each_restart_reads_the_input_in_a_new_order(make: Callable[[str], Pipeline[Any]]
                                                     ) -> None:
    items = [x for name, x in make("cycle") if name == "s"]
    eras = [tuple(items[i:i + 6]) for i in range(0, len(items) - 5, 6)]
    assert len(eras) >= 3 and len(set(eras)) == len(eras)


@pytest.mark.parametrize("make", [lambda: _weighted("never"), lambda: _shuffled("never"),
                                  lambda: _sampled("never"), lambda: _round_robin(-1)],
                         ids=["weighted", "shuffled", "sampled", "round-robin"])
def test_a_mix_that_never_ends_resumes_exactly(make: Make, leak_check: None) -> None:
    n = 400
    full = _take(make(), n)
    merge = "rr" if "rr" in str(make().describe()) else "mix"
    for k in (0, 1, 5, 17, 60, 123, 250, 399):
        head, state = _state_after(make(), k)
        assert head == full[:k]
        assert _like(_take(_resumed(make, state), n - k), full[k:]), k
    assert min(_restarts(state, merge)) >= 5
    assert len(json.dumps(state)) < 2000  # what is settled in full is a length and a count


def test_states_list_the_eras_still_in_flight(leak_check: None) -> None:
    # batch(16): when a short input ran out, its last items wait in a batch while its next
    # era is read already, so a state lists both.
    def make() -> Pipeline[Any]:
        return _weighted("cycle").batch(16)

    full = list(make())
    seen = set()
    for k in range(len(full) + 1):
        head, state = _state_after(make(), k, ahead=sum(map(len, full)))
        seen.update(_eras(state))
        assert head + list(_resumed(make, state)) == full, k
    assert max(seen) >= 2


@pytest.mark.parametrize("after", ["shuffle", "unordered"])
def test_stages_after_the_mix_that_reorder_resume_the_same_multiset(after: str) -> None:
    def make() -> Pipeline[Any]:
        pipe = _weighted("cycle")
        if after == "shuffle":
            return pipe.shuffle(buffer_size=24, seed=5).batch(4)
        return pipe.map(lambda x: x, concurrency=4, ordered=False).batch(4)

    def flat(batches: list[Any]) -> Counter[Any]:
        return Counter(x for batch in batches for x in batch)

    batches = list(make())
    full = flat(batches)
    for k in range(0, len(batches) + 1, 3):
        head, state = _state_after(make(), k, ahead=sum(full.values()) // 2)
        assert flat(head) + flat(list(_resumed(make, state))) == full, k


def test_resume_twice_in_a_row_after_restarts() -> None:
    def make() -> Pipeline[Any]:
        return _weighted("cycle")

    full = list(make())
    head, state = _state_after(make(), 23)
    middle, state = _state_after(_resumed(make, state), 31)
    assert _restarts(state)[0] >= 2
    assert head + middle + list(_resumed(make, state)) == full


def test_a_later_epoch_of_the_mix_resumes_its_own_restarts() -> None:
    pipe = _weighted("cycle")
    list(pipe)
    second = list(pipe)
    assert second != list(_weighted("cycle"))  # new picks, later epochs of the inputs
    first = _weighted("cycle")
    list(first)
    head, state = _state_after(first, 45)
    assert state["epoch"] == 1
    assert head + list(_resumed(lambda: _weighted("cycle"), state)) == second


@pytest.mark.parametrize("make", [lambda: _weighted("cycle"), lambda: _sampled("cycle")],
                         ids=["weighted", "sampled"])
def test_the_epoch_after_a_resumed_one_is_the_uninterrupted_run_s_next(make: Make) -> None:
    # The inputs' epoch counts (and a sampler's own) go on from the eras the resumed run read.
    uninterrupted = make()
    first, second = list(uninterrupted), list(uninterrupted)
    for k in (9, len(first) // 2, len(first)):
        head, state = _state_after(make(), k)
        resumed = _resumed(make, state)
        assert head + list(resumed) == first
        assert list(resumed) == second, k


def test_the_same_input_merged_twice_resumes_its_epochs() -> None:
    # Both branches restart the one pipeline: their eras' epochs interleave on its count.
    def make() -> Pipeline[Any]:
        a = Pipeline(range(5), name="a").map(_tag("a"))
        return mix([a, a, Pipeline(range(30), name="b").map(_tag("b"))], seed=4, stop="cycle")

    def epochs(pipe: Pipeline[Any]) -> list[int]:
        return [p._source.runs for p in pipe.source.inputs]

    uninterrupted = make()
    full = list(uninterrupted)
    assert epochs(uninterrupted)[0] >= 8
    for k in (7, 19, 33, 50):
        head, state = _state_after(make(), k)
        resumed = _resumed(make, state)
        assert head + list(resumed) == full, k
        assert epochs(resumed) == epochs(uninterrupted)


def test_a_hand_edited_state_is_refused() -> None:
    _, state = _state_after(_weighted("cycle"), 30)
    branches = state["nodes"]["mix"]["branches"]
    assert branches[0]["done"]  # "a" restarted, its first eras delivered in full
    edited = json.loads(json.dumps(state))
    edited["nodes"]["mix"]["branches"][0]["done"][0][0] += 1
    with pytest.raises(ConfigError, match="edited or damaged"):
        _weighted("cycle").load_state_dict(edited)
    changes: list[Callable[[list[Any]], Any]] = [
        lambda b: b[0].update(done=[[3, 0]]), lambda b: b[0].update(eras=[]),
        lambda b: b[1]["eras"][0].update(epoch=-1), lambda b: b[0].pop("done"),
        lambda b: b[2]["eras"][0].update(sampler="0"), lambda b: b.pop()]
    for change in changes:
        edited = json.loads(json.dumps(state))
        change(edited["nodes"]["mix"]["branches"])
        body = {k: v for k, v in edited.items() if k != "check"}
        edited["check"] = _checksum(body)  # edited past the checksum: still refused
        pipe = _weighted("cycle")
        pipe.load_state_dict(edited)  # its merge's part is read as the run is built
        with pytest.raises(ConfigError, match="merge 'mix'"):
            list(pipe)


def test_a_state_that_does_not_fit_the_policy_is_refused() -> None:
    # Taken after "a" restarted; a policy that never restarts cannot replay it.
    def make(times: int) -> Pipeline[Any]:
        a = Pipeline(range(4), name="a")
        b = Pipeline(range(50), name="b")
        return Pipeline(Merge([a, b], RoundRobin(times), name="rr"), name="rr")

    _, state = _state_after(make(3), 30)
    assert _restarts(state, "rr")[0] >= 2
    with pytest.raises(PipelineError, match="does not fit its policy"):
        list(_resumed(lambda: make(0), state))


def test_a_state_of_the_earlier_format_still_loads() -> None:
    # Before restarts were resumable, each branch was saved as one era's fields.
    def make() -> Pipeline[Any]:
        return mix([Pipeline(range(30), name="a"), Pipeline(range(100, 120), name="b")],
                   seed=1, stop="cycle")

    full = list(make())
    head, state = _state_after(make(), 6)
    for branch in state["nodes"]["mix"]["branches"]:
        assert branch["done"] == [] and len(branch["eras"]) == 1
        era = branch.pop("eras")[0]
        del branch["done"]
        branch.update(era)
    state["check"] = _checksum({k: v for k, v in state.items() if k != "check"})
    assert head + list(_resumed(make, state)) == full


def _cached(root: Path, name: str, count: int, seed: int | None = None) -> Pipeline[Any]:
    """A cache of ``range(count)`` named ``name`` (filled by :func:`_fill`), replayed in
    stored order, or shuffled by ``seed`` and the cache's own epoch count."""
    pipe = Pipeline(range(count), name=name).cache(root / name)
    return pipe if seed is None else pipe.shuffle(seed=seed)


def _ints(items: Iterable[Any]) -> list[int]:
    return [int(x) for x in items]


def test_a_mix_of_cached_inputs_resumes_their_shuffled_replays(tmp_path: Path,
                                                               leak_check: None) -> None:
    for name, count in (("a", 5), ("b", 40)):
        list(_cached(tmp_path, name, count))  # fills the caches

    def make() -> Pipeline[Any]:
        return mix([_cached(tmp_path, "a", 5, seed=3), _cached(tmp_path, "b", 40)], seed=2,
                   stop="cycle").map(lambda x: int(x))

    full = list(make())
    small = [x for x in full if x < 5]
    assert len(small) >= 15 and small[:5] != small[5:10]  # "a" replays anew each restart
    for k in (0, 3, 11, 26, 44, len(full) - 1):
        head, state = _state_after(make(), k)
        assert head + _ints(_resumed(make, state)) == full, k


def test_a_cached_mix_that_restarts_fills_then_resumes_its_replay(tmp_path: Path) -> None:
    def make() -> Pipeline[Any]:
        mixed = mix([Pipeline(range(3), name="a"), Pipeline(range(100, 130), name="b")],
                    seed=6, stop="cycle")
        return mixed.cache(tmp_path / "mixed").shuffle(seed=1)

    filling = make()
    with filling.open() as run:
        next(run)
        with pytest.raises(ConfigError, match="stage 'cache'"):
            filling.state_dict()  # the epoch that fills a cache cannot be resumed
    list(make())  # fills it
    full = _ints(make())
    for k in (0, 7, 20):
        head, state = _state_after(make(), k)
        assert _ints(head) + _ints(_resumed(make, state)) == full, k


def test_a_mix_of_image_folders_resumes_batch_for_batch(tmp_path: Path,
                                                        leak_check: None) -> None:
    # Each restart of "few" lists its images in a new order with new crops (seed, epoch);
    # states taken right after one of its epochs was delivered in full, before its restart,
    # resume too (its next epoch is whole).
    torch = pytest.importorskip("torch")
    from asyncflow import image
    from tests.image._pictures import write_tree

    write_tree(tmp_path / "few", {"cat": 3, "dog": 2})
    write_tree(tmp_path / "many", {"ant": 9, "bee": 8})

    def make() -> Pipeline[Any]:
        few, many = (image.folder(tmp_path / name, batch_size=2, size=size, train=True, seed=7,
                                  workers="threads")
                     for name, size in (("few", 8), ("many", 6)))
        return mix([few, many], seed=1, stop="cycle")

    def same(a: list[Any], b: list[Any]) -> bool:
        return len(a) == len(b) and all(
            torch.equal(xa, xb) and torch.equal(ya, yb)
            for (xa, ya), (xb, yb) in zip(a, b, strict=True))

    full = list(make())
    few = [b for b in full if b[0].shape[-1] == 8]
    assert len(few) >= 9 and not torch.equal(few[0][0], few[3][0])  # new crops each epoch
    listed = set()
    for k in range(len(full) + 1):
        for ahead in (0, len(full)):  # and with every batch made: several eras in flight
            head, state = _state_after(make(), k, ahead=ahead)
            listed.add(_eras(state)[0])
            assert same(head + list(_resumed(make, state)), full), k
    assert max(listed) >= 2


def test_the_last_era_a_state_lists_is_never_folded_away() -> None:
    # A restart has begun the next era but not built it yet: the era before it, delivered
    # in full, stays listed (a resumed run reads it to its end, then restarts); once the next
    # one is built, it is only counted.
    from asyncflow.pipeline._merge_epochs import Era, Track
    from asyncflow.pipeline._span import Span

    ended = Era(0)
    ended.length, ended.settled = 3, Span(3)
    track = Track(eras=[ended, Era()])
    track.era = track.eras[1]
    track.fold()
    assert track.eras[0] is ended and track.done == []
    track.eras[1].epoch, track.eras[1].plan = 1, ended.plan  # no plan: not reported yet
    track.eras[1].lineage = object()  # type: ignore[assignment]  # built
    track.fold()
    assert track.eras == [track.era] and track.done == [[3, 1]]


def test_an_image_folder_resumed_after_its_last_batch_reads_its_next_epoch_whole(
        tmp_path: Path) -> None:
    # The era of a mix input delivered in full but not restarted yet is built again, with
    # every row settled; so is a pipeline resumed from a state taken after its last batch.
    # Its assembler claims no row then, and the next epoch once lost every row to that span.
    pytest.importorskip("torch")
    from asyncflow import image
    from tests.image._pictures import write_tree

    write_tree(tmp_path / "few", {"cat": 3, "dog": 2})

    def make() -> Pipeline[Any]:
        return image.folder(tmp_path / "few", batch_size=2, size=8, train=True, seed=7,
                            workers="threads")

    reference = make()
    epochs = [[y.tolist() for _, y in reference] for _ in range(2)]
    head, state = _state_after(make(), 3)
    resumed = _resumed(make, state)
    assert [y.tolist() for _, y in head] == epochs[0] and list(resumed) == []
    assert [y.tolist() for _, y in resumed] == epochs[1]
