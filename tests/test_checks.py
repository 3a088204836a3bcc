"""The one check of each kind of argument (``asyncflow/_errors.py``: an int, a bool, a number of
seconds, a failure budget), and every caller of them.

Each caller is called with each kind of bad value: of the wrong type (``True``, ``1.5`` for an
int, ``"3"``, ``None`` where it is not allowed) and out of range (below an int's floor; NaN,
infinite or negative seconds or budgets). Every one must be refused with a
:class:`ConfigError` that names the argument, so that moving a caller onto the shared check
cannot silently lose its check.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncflow import ConfigError, ConfigTypeError, DataLoader, Pipeline, image, sources
from asyncflow._blob import check_max_bytes
from asyncflow._errors import (
    check_bool,
    check_budget,
    check_fraction,
    check_int,
    check_seconds,
)
from asyncflow._recycle import Recycler
from asyncflow.journal import Journal
from asyncflow.pipeline import Processes, state_checksum
from asyncflow.ranks import Split, cut
from asyncflow.report import profile
from asyncflow.sources import (
    DistributedSampler,
    RandomSampler,
    Retry,
    SequentialSampler,
    Timeout,
)
from asyncflow.sources._mix import mix
from asyncflow.torch import PinnedPool, even_steps, pad_collate, to_device
from asyncflow.torch._shuffle import ShuffleSampler
from asyncflow.torch._state import LoaderState


def _ident(x: Any) -> Any:
    return x


def _load_epoch(value: Any) -> None:
    pipe = Pipeline(range(3))
    state = pipe.state_dict()
    state["epoch"] = value
    state["check"] = state_checksum({k: v for k, v in state.items() if k != "check"})
    pipe.load_state_dict(state)


async def _session(value: Any) -> None:
    async with sources.session(connections=value):
        pass


def _run(coro: Any) -> None:
    import asyncio

    asyncio.run(coro)


def _recycler(value: Any) -> None:
    Recycler(lambda key, n: bytearray(n), nbytes=len, limit=value)


#: (id, call with the value, the name the message gives, the floor: 1, 0 or None for any int,
#: whether None is accepted).
INT_CALLERS: list[tuple[str, Callable[[Any], Any], str, int | None, bool]] = [
    # the engine
    ("map concurrency", lambda v: Pipeline(range(3)).map(_ident, concurrency=v),
     "concurrency", 1, False),
    ("map buffer", lambda v: Pipeline(range(3)).map(_ident, buffer=v), "buffer", 1, True),
    ("map buffer_bytes", lambda v: Pipeline(range(3)).map(_ident, buffer_bytes=v),
     "buffer_bytes", 1, True),
    ("Pipeline buffer", lambda v: Pipeline(range(3), buffer=v), "buffer", 1, True),
    ("Pipeline buffer_bytes", lambda v: Pipeline(range(3), buffer_bytes=v),
     "buffer_bytes", 1, True),
    ("Pipeline window", lambda v: Pipeline(range(3), window=v), "window", 1, True),
    ("batch size", lambda v: Pipeline(range(3)).batch(v), "batch size", 1, False),
    ("prefetch size", lambda v: Pipeline(range(3)).prefetch(v), "prefetch size", 1, False),
    ("shuffle buffer_size", lambda v: Pipeline(range(3)).shuffle(buffer_size=v),
     "buffer_size", 1, False),
    ("assemble batch_size", lambda v: Pipeline(range(3)).assemble(
        None, batch_size=v), "batch_size", 1, False),  # type: ignore[arg-type]
    ("assemble buffer", lambda v: Pipeline(range(3)).assemble(
        None, batch_size=2, buffer=v), "buffer", 1, True),  # type: ignore[arg-type]
    ("with_source epoch", lambda v: Pipeline(range(3)).with_source(range(2), epoch=v),
     "epoch", 0, False),
    ("with_source start", lambda v: Pipeline(range(3)).with_source(range(2), start=v),
     "start", 0, False),
    ("set_epoch", lambda v: Pipeline(range(3)).set_epoch(v), "epoch", 0, False),
    ("a state's epoch", _load_epoch, "the state's epoch", 0, False),
    ("Processes seed", lambda v: Processes(seed=v), "seed", None, True),
    # ranks
    ("cut n", lambda v: cut(v, 0, 1), "n", 0, False),
    ("cut index", lambda v: cut(4, v, 2), "index", 0, False),
    ("cut count", lambda v: cut(4, 0, v), "count", 1, False),
    ("Split world_size", lambda v: Split(world_size=v), "world_size", 1, True),
    ("Split rank", lambda v: Split(rank=v), "rank", 0, True),
    ("Split seed", lambda v: Split(seed=v), "seed", None, False),
    ("split epoch", lambda v: Split()(range(4), epoch=v), "epoch", 0, False),
    ("Share set_epoch", lambda v: Split()(range(4)).set_epoch(v), "epoch", 0, False),
    # sources
    ("Sampler set_epoch", lambda v: SequentialSampler(range(3)).set_epoch(v), "epoch", 0, False),
    ("RandomSampler seed", lambda v: RandomSampler(range(3), seed=v), "seed", None, True),
    ("DistributedSampler num_replicas",
     lambda v: DistributedSampler(range(4), num_replicas=v, rank=0), "num_replicas", 1, True),
    ("DistributedSampler rank",
     lambda v: DistributedSampler(range(4), num_replicas=2, rank=v), "rank", None, True),
    ("tar_samples max_member_bytes",
     lambda v: sources.tar_samples("shard.tar", max_member_bytes=v), "max_member_bytes", 0, False),
    ("Retry attempts", lambda v: Retry(attempts=v), "attempts", 1, False),
    ("session connections", lambda v: _run(_session(v)), "connections", 1, True),
    ("mix seed", lambda v: mix([Pipeline(range(2))], seed=v), "mix: seed", None, False),
    # torch
    ("to_device pool_size", lambda v: to_device(Pipeline(range(3)), "cpu", pool_size=v),
     "pool_size", 1, False),
    ("PinnedPool max_buffers", lambda v: PinnedPool(v), "max_buffers", 1, False),
    ("PinnedPool granularity", lambda v: PinnedPool(2, granularity=v), "granularity", 1, False),
    ("pad_collate multiple_of", lambda v: pad_collate([], multiple_of=v), "multiple_of", 1, False),
    ("even_steps agree_every", lambda v: even_steps([], agree_every=v), "agree_every", 1, False),
    ("ShuffleSampler set_epoch", lambda v: ShuffleSampler(range(3)).set_epoch(v),
     "epoch", 0, False),
    ("DataLoader set_epoch", lambda v: DataLoader(range(3)).set_epoch(v), "epoch", 0, False),
    ("DataLoader seed", lambda v: DataLoader(range(3), seed=v), "seed", None, True),
    ("a loader state's epoch", lambda v: LoaderState().load({"epoch": v, "batches": 0}),
     "state epoch", 0, False),
    ("a loader state's batches", lambda v: LoaderState().load({"epoch": 0, "batches": v}),
     "state batches", 0, False),
    # image
    ("folder batch_size", lambda v: image.folder("missing", batch_size=v, size=8),
     "batch_size", 1, False),
    ("folder decode_concurrency",
     lambda v: image.folder("missing", batch_size=2, size=8, decode_concurrency=v),
     "decode_concurrency", 1, True),
    ("folder size", lambda v: image.folder("missing", batch_size=2, size=v),
     "size (or a (height, width) pair)", 1, False),
    ("folder size's height", lambda v: image.folder("missing", batch_size=2, size=(v, 8)),
     "size's height", 1, False),
    ("decode_batches batch_size",
     lambda v: image.decode_batches(Pipeline([]), batch_size=v, size=8, device="cpu"),
     "batch_size", 1, False),
    # the rest
    ("profile sample", lambda v: profile(Pipeline(range(3)), sample=v), "sample", 1, False),
    ("profile concurrencies", lambda v: profile(Pipeline(range(3)), concurrencies=[2, v]),
     "each of concurrencies", 1, False),
    ("Journal rank", lambda v: Journal(Pipeline(range(3)), "journal", rank=v), "rank", 0, True),
    ("max_bytes", check_max_bytes, "max_bytes", 0, True),
    ("Recycler limit", _recycler, "limit", 1, False),
]


def _int_cases() -> list[Any]:
    cases = []
    for case_id, call, name, low, allow_none in INT_CALLERS:
        wrong_types: list[Any] = [True, False, 1.5, "3"] + ([] if allow_none else [None])
        for value in wrong_types:
            cases.append(pytest.param(call, name, value, ConfigTypeError,
                                      id=f"{case_id}={value!r}"))
        for value in ([] if low is None else [low - 1, low - 2]):
            cases.append(pytest.param(call, name, value, ConfigError, id=f"{case_id}={value!r}"))
    return cases


@pytest.mark.parametrize(("call", "name", "value", "error"), _int_cases())
def test_every_int_argument_refuses_what_is_not_one(
    call: Callable[[Any], Any], name: str, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match=f"^{re.escape(name)} must be an int") as info:
        call(value)
    assert isinstance(info.value, ConfigError)
    assert info.value.__class__ is error  # a wrong type is a TypeError too; a low int is not


#: A root that does not exist: an argument checked before the scan is refused first.
NO_TREE = "/nonexistent/asyncflow-test-tree"

#: (id, call with the value, the name the message gives, whether None is accepted).
BOOL_CALLERS: list[tuple[str, Callable[[Any], Any], str, bool]] = [
    ("map ordered", lambda v: Pipeline(range(3)).map(_ident, ordered=v), "ordered", False),
    ("batch drop_last", lambda v: Pipeline(range(3)).batch(2, drop_last=v), "drop_last", False),
    ("Processes persistent", lambda v: Processes(persistent=v), "persistent", False),
    ("cache wait", lambda v: Pipeline(range(3)).cache("c", wait=v), "wait", False),
    ("cache durable", lambda v: Pipeline(range(3)).cache("c", durable=v), "durable", False),
    ("cache batched", lambda v: Pipeline(range(3)).cache("c", batched=v), "batched", True),
    ("Split workers", lambda v: Split(workers=v), "workers", False),
    ("Split shuffle", lambda v: Split(shuffle=v), "shuffle", False),
    # checked before the tree is scanned (there is none here)
    ("image.folder shuffle", lambda v: image.folder(NO_TREE, batch_size=2, size=8, shuffle=v),
     "shuffle", True),
]


@pytest.mark.parametrize(
    ("call", "name", "value"),
    [pytest.param(call, name, value, id=f"{case_id}={value!r}")
     for case_id, call, name, allow_none in BOOL_CALLERS
     for value in (1, 0, "no", "yes", *([] if allow_none else [None]))],
)
def test_every_flag_refuses_what_is_not_a_bool(
    call: Callable[[Any], Any], name: str, value: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # the cache and journal paths are relative
    with pytest.raises(ConfigTypeError, match=f"^{re.escape(name)} must be True"):
        call(value)


#: (id, call with the value, the name the message gives, whether 0 is accepted, whether None
#: is accepted). ``Retry``'s caps and patience take inf too (no cap, no end): see below.
SECONDS_CALLERS: list[tuple[str, Callable[[Any], Any], str, bool, bool]] = [
    ("Pipeline stall_timeout", lambda v: Pipeline(range(3), stall_timeout=v),
     "stall_timeout", False, True),
    ("Pipeline report_every", lambda v: Pipeline(range(3), report_every=v),
     "report_every", False, True),
    ("Pipeline stop_timeout", lambda v: Pipeline(range(3), stop_timeout=v),
     "stop_timeout", False, False),
    ("open timeout", lambda v: Pipeline(range(3)).open(timeout=v), "timeout", False, True),
    ("progress interval", lambda v: Pipeline(range(3)).progress(interval=v),
     "interval", True, False),
    *[(f"Retry {name}", lambda v, n=name: Retry(**{n: v}), name, True, False)
      for name in ("backoff", "max_backoff", "max_retry_after", "patience")],
    *[(f"Timeout {name}", lambda v, n=name: Timeout(**{n: v}), name, False, True)
      for name in ("connect", "read", "total")],
]


def _seconds_cases() -> list[Any]:
    cases = []
    for case_id, call, name, zero, allow_none in SECONDS_CALLERS:
        for value in [True, False, "1", *([] if allow_none else [None])]:
            cases.append(pytest.param(call, name, value, ConfigTypeError,
                                      id=f"{case_id}={value!r}"))
        infinite = name in INFINITE
        for value in [float("nan"), *([] if infinite else [float("inf")]), -1, -0.5,
                      *([] if zero else [0, 0.0])]:
            cases.append(pytest.param(call, name, value, ConfigError, id=f"{case_id}={value!r}"))
    return cases


#: ``Retry``'s arguments that take inf: no cap on the back-off or on a ``Retry-After``, and
#: throttling that never ends a run.
INFINITE = ("max_backoff", "max_retry_after", "patience")


@pytest.mark.parametrize(("call", "name", "value", "error"), _seconds_cases())
def test_every_seconds_argument_refuses_what_is_not_a_finite_number_of_them(
    call: Callable[[Any], Any], name: str, value: Any, error: type[Exception]
) -> None:
    finite = "" if name in INFINITE else "finite "
    with pytest.raises(error, match=f"^{re.escape(name)} must be a {finite}number of seconds"
                       ) as info:
        call(value)
    assert info.value.__class__ is error


@pytest.mark.parametrize("name", INFINITE)
def test_retrys_caps_and_patience_take_inf_for_none(name: str) -> None:
    retry = Retry(**{name: float("inf")})
    assert getattr(retry, name) == float("inf")
    assert 0 <= retry.delay(3) <= 0.4 and 1.0 <= retry.delay(1, retry_after=1.0) <= 1.5


#: (id, call with the value, whether None is accepted (the pipeline's budget)).
BUDGET_CALLERS: list[tuple[str, Callable[[Any], Any], bool]] = [
    ("Pipeline", lambda v: Pipeline(range(3), max_failures=v), False),
    ("map", lambda v: Pipeline(range(3)).map(_ident, max_failures=v), True),
    ("filter", lambda v: Pipeline(range(3)).filter(_ident, max_failures=v), True),
    ("flat_map", lambda v: Pipeline(range(3)).flat_map(_ident, max_failures=v), True),
    ("assemble", lambda v: Pipeline(range(3)).assemble(
        None, batch_size=2, max_failures=v), True),  # type: ignore[arg-type]
    ("DataLoader", lambda v: DataLoader(range(3), max_failures=v), False),
    # checked before the tree is scanned (there is none here)
    ("image.folder", lambda v: image.folder(NO_TREE, batch_size=2, size=8, max_failures=v), False),
]


@pytest.mark.parametrize(
    ("call", "value", "error"),
    [pytest.param(call, value, error, id=f"{case_id}={value!r}")
     for case_id, call, allow_none in BUDGET_CALLERS
     for value, error in [
         (True, ConfigTypeError), (False, ConfigTypeError), ("1", ConfigTypeError),
         *([] if allow_none else [(None, ConfigTypeError)]),
         (-1, ConfigError), (-0.1, ConfigError), (1.5, ConfigError),
         (float("nan"), ConfigError), (float("inf"), ConfigError),
     ]],
)
def test_every_failure_budget_refuses_what_is_not_one(
    call: Callable[[Any], Any], value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match=r"^max_failures must be an int >= 0 or a float in \[0, 1\]"
                       ) as info:
        call(value)
    assert info.value.__class__ is error


@pytest.mark.parametrize(
    ("name", "low", "high"), [("hedge", 0.0, 1.0), ("hedge_quantile", 0.5, 0.999)])
def test_retrys_fractions_refuse_what_is_not_one_in_range(
        name: str, low: float, high: float) -> None:
    want = f"^{name} must be a number from {low} to {high}"
    for value in (True, "0.5", None):
        with pytest.raises(ConfigTypeError, match=want):
            Retry(**{name: value})
    for value in (low - 0.01, high + 0.01, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=want) as info:
            Retry(**{name: value})
        assert info.value.__class__ is ConfigError
    assert getattr(Retry(**{name: low}), name) == low
    assert getattr(Retry(**{name: high}), name) == high
    assert check_fraction("f", 1, low=0.0, high=1.0) == 1


def test_check_seconds_and_check_budget_return_the_value_and_say_what_they_want() -> None:
    assert check_seconds("t", 0.5) == 0.5
    assert check_seconds("t", 0, zero=True) == 0
    assert check_seconds("t", None, allow_none=True) is None
    assert check_seconds("t", 10**400) == 10**400  # a huge int is finite: no overflow
    with pytest.raises(ConfigError, match=r"^t must be a finite number of seconds > 0 or None, "
                                          r"got 0$"):
        check_seconds("t", 0, allow_none=True)
    with pytest.raises(ConfigError, match=r"^t must be a finite number of seconds >= 0, got inf$"):
        check_seconds("t", float("inf"), zero=True)
    for budget in (0, 10**400, 0.0, 0.5, 1.0):
        assert check_budget("max_failures", budget) == budget
    assert check_budget("b", None, allow_none=True) is None
    with pytest.raises(ConfigTypeError, match=r"^b must be an int >= 0 or a float in \[0, 1\] "
                                              r"or None, got True$"):
        check_budget("b", True, allow_none=True)


def test_check_int_returns_the_value_and_says_what_it_wants() -> None:
    assert check_int("n", 3) == 3
    assert check_int("n", 0, 0) == 0
    assert check_int("seed", -5, None) == -5
    assert check_int("buffer", None, allow_none=True) is None
    with pytest.raises(ConfigTypeError, match=r"^n must be an int >= 1, got True$"):
        check_int("n", True)
    with pytest.raises(ConfigError, match=r"^n must be an int >= 2 or None, got 1$"):
        check_int("n", 1, 2, allow_none=True)
    with pytest.raises(ConfigTypeError, match=r"^seed must be an int, got 1\.5$"):
        check_int("seed", 1.5, None)
    with pytest.raises(ConfigTypeError, match=r"got 'xxxx") as info:
        check_int("n", "x" * 1000)
    assert len(str(info.value)) < 120  # a huge value is cut short in the message


def test_check_bool_returns_the_value_and_says_what_it_wants() -> None:
    assert check_bool("flag", False) is False
    assert check_bool("flag", None, allow_none=True) is None
    with pytest.raises(ConfigTypeError, match=r"^flag must be True or False, got 1$"):
        check_bool("flag", 1)
    with pytest.raises(ConfigTypeError, match=r"^flag must be True, False or None, got 'no'$"):
        check_bool("flag", "no", allow_none=True)


def test_a_device_is_parsed_in_one_place(tmp_path: Path) -> None:
    """``image`` parses a device with ``asyncflow.torch``'s parser: the same refusal."""
    from asyncflow.torch._transfer import parse_device, resolve_device

    assert parse_device(0) == torch.device("cuda:0")  # an int is a CUDA index, unchecked
    assert resolve_device("cpu") == torch.device("cpu")
    for bad in ("gpu", "cuda:x", 3.5):
        message = f"not a device: {bad!r}"
        for call in (
            lambda b=bad: resolve_device(b),
            lambda b=bad: image.folder(tmp_path, batch_size=2, size=8, device=b),
            lambda b=bad: image.decode_batches(Pipeline([]), batch_size=2, size=8, device=b),
        ):
            with pytest.raises(ConfigError, match=re.escape(message)):
                call()
