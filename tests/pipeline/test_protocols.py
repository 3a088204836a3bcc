"""The hooks a feature offers the engine: declared in ``_protocols.py``, met by the features.

The engine (and the worker processes below it) asks the objects it is given for no method by a
name of its own making except through these protocols (``test_the_engine_reads_no_undeclared_hook``
holds that).
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
from typing import Any, ClassVar

import pytest

import asyncflow
from asyncflow import ConfigError, Pipeline
from asyncflow.pipeline import CustomSpec, RunPlan, StageSpec, seeding
from asyncflow.pipeline import _protocols as hooks
from asyncflow.pipeline._lineage import node_ledger
from asyncflow.pipeline._span import Span
from asyncflow.pipeline._spec import MapSpec
from asyncflow.sources import RandomSampler

ENGINE = pathlib.Path(asyncflow.__file__).parent / "pipeline"
#: The worker processes below the engine read no hook either (the engine reads a map
#: function's ``round_robin`` marker and tells the pool).
WORKERS = ENGINE.parent / "workers"

#: Names the engine may read by ``getattr`` / ``hasattr`` with a literal: Python's own protocols
#: and attributes, the engine's own objects (its nodes' ``ledger``, its channels, its tag on
#: an exception), the platform. A feature's hook is none of these: it is a protocol.
_NOT_HOOKS = {
    "__name__", "__qualname__", "__notes__", "__dict__", "__call__", "__iter__", "__aiter__",
    "__next__", "__anext__", "__array__", "close", "aclose", "nbytes", "dtype", "shape",
    "detach", "manual_seed", "MAP_POPULATE", "active", "run", "ledger", "lineages",
    "max_bytes", "try_put_many", "_asyncflow_stage",
    "pidfd_open", "posix_fallocate",  # feature probes of the os module, not hooks
}


def _literal_lookups() -> set[tuple[str, str]]:
    found = set()
    for path in [*ENGINE.glob("*.py"), *WORKERS.glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)):
                found.add((path.name, str(node.args[1].value)))
    return found


def test_the_engine_reads_no_undeclared_hook() -> None:
    assert {(f, name) for f, name in _literal_lookups() if name not in _NOT_HOOKS} == set()


def test_the_sources_meet_their_protocols() -> None:
    sampler = RandomSampler(10, seed=1)
    assert isinstance(sampler, hooks.ResumableSource)
    assert isinstance(sampler, hooks.EpochSampler)
    share = asyncflow.Split(rank=0, world_size=2)(list(range(8)))
    assert isinstance(share, hooks.SplitShare)
    assert isinstance(share, hooks.ListedSource)
    assert isinstance(iter(share), hooks.KeyedIterator)
    assert seeding.KeyedIterator is hooks.KeyedIterator  # the public name stays
    assert not isinstance(range(3), hooks.ResumableSource | hooks.ListedSource | hooks.SplitShare)


def test_a_map_functions_markers() -> None:
    def fn(x: int) -> int:
        return x

    assert hooks.runs_inline(fn) and not hooks.round_robin(fn)
    fn.asyncflow_inline = False  # type: ignore[attr-defined]
    fn.asyncflow_round_robin = True  # type: ignore[attr-defined]
    assert not hooks.runs_inline(fn) and hooks.round_robin(fn)
    fn.asyncflow_round_robin = 1  # type: ignore[attr-defined]  # only True deals in turn
    assert not hooks.round_robin(fn)


def test_every_spec_has_the_traits() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Plain(StageSpec):
        kind: ClassVar[str] = "plain"

    plain = Plain()
    assert (plain.buffer, plain.buffer_bytes, plain.executor, plain.items_per_output,
            plain.terminal) == (None, None, None, None, False)
    # a budget of its own only where the spec can take one (what cache and profile test)
    assert not hasattr(plain, "max_failures") and not isinstance(plain, hooks.Budgeted)
    assert isinstance(MapSpec(fn=str, max_failures=2), hooks.Budgeted)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Last(StageSpec):
        kind: ClassVar[str] = "last"
        terminal: bool = True

    with pytest.raises(ConfigError, match="last\\(\\) must be the last stage"):
        Pipeline(range(3)).with_stages((Last(), Plain()))
    spec = CustomSpec(label="x", factory=lambda ctx: None, buffer=3)  # type: ignore[arg-type,return-value]
    assert spec.buffer == 3 and dataclasses.replace(spec, buffer=4).buffer == 4


class _Settling:
    def __init__(self) -> None:
        self.restored: dict[str, Any] | None = None

    @staticmethod
    def settled_inputs(outputs: Span) -> Span:
        return Span(outputs.mark // 2)


class _Full(_Settling):
    @staticmethod
    def inputs_of(ordinal: int) -> list[int]:
        return [ordinal // 2]

    def get_state(self) -> dict[str, Any]:
        return {"n": 1}

    def set_state(self, state: dict[str, Any]) -> None:
        self.restored = state


def test_a_custom_nodes_ledger_uses_only_what_it_declares() -> None:
    bare, full = _Settling(), _Full()
    assert isinstance(bare, hooks.SettlingNode) and not isinstance(bare, hooks.StatefulNode)
    ledger = node_ledger(bare, None)
    assert ledger is not None
    assert ledger.settle([(0, 6)], 6) == [(0, 3)] and ledger.lowest(6) == 3
    assert ledger.inputs_of(5) == [] and ledger.get_state() is None
    ledger.set_state({"n": 2})  # a node without set_state: nothing to restore
    ledger = node_ledger(full, None)
    assert ledger is not None
    assert ledger.inputs_of(5) == [2] and ledger.get_state() == {"n": 1}
    ledger.set_state({"n": 2})
    assert full.restored == {"n": 2}
    assert node_ledger(object(), None) is None
    assert node_ledger(object(), 2) is not None


def test_a_consumer_hook_is_closed_only_when_it_can_be() -> None:
    closed = []

    class Closing:
        def __init__(self, run: Any) -> None:
            pass

        def __call__(self, item: int) -> int:
            return item

        def close(self) -> None:
            closed.append(True)

    class Plain:
        def __init__(self, run: Any) -> None:
            pass

        def __call__(self, item: int) -> int:
            return item + 1

    assert list(Pipeline(range(3)).with_hook(Closing).with_hook(Plain)) == [1, 2, 3]
    assert closed == [True]


def test_a_merge_policy_must_open() -> None:
    with pytest.raises(ConfigError, match="policy must have open"):
        asyncflow.pipeline.Merge([Pipeline(range(2))], object())  # type: ignore[arg-type]


class _Gated:
    """A run plan's source held until its ``gate`` (``opened``) says whether to read it."""

    def __init__(self, read: bool) -> None:
        self.read = read
        self.opens = 0

    def __call__(self) -> Any:
        self.opens += 1
        return iter(range(5))  # an iterator: read on the run's threads, as any source

    async def opened(self) -> bool:
        return self.read


def test_a_run_plans_gate_opens_the_source_only_when_it_allows() -> None:
    class Held(Pipeline):
        def __init__(self, gate: _Gated) -> None:
            super().__init__(range(0))
            self.gate = gate

        def run_plan(self) -> RunPlan:
            return dataclasses.replace(super().run_plan(), open_source=self.gate,
                                       gate=self.gate.opened)

    shut, read = _Gated(False), _Gated(True)
    assert list(Held(shut).map(lambda x: x + 1)) == [] and shut.opens == 0
    assert list(Held(read).map(lambda x: x + 1)) == [1, 2, 3, 4, 5] and read.opens == 1
