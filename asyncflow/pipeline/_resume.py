"""A pipeline's state: what its latest run delivered, as plain JSON, and how a new run resumes.

The state holds the *settled source positions* (those whose every output the consumer has
received, or which made none: filtered, failed within the budget, dropped by ``drop_last``):
a watermark below which all are settled, plus the ranges settled above it (``Span``). Its
size follows what was in flight, not the epoch's length. Each stage may add extras (a
``flat_map`` its expansions delivered in part). The pipeline's identity (its stages, and the
source with every item it lists) and a checksum make a state from another pipeline, or an
edited one, fail loudly.

A sampler source (with ``state_dict`` / ``load_state_dict``) has its own state saved too, with
``offset`` at the watermark: it resumes its order from there, and the run leaves out the
settled positions above it. Any other source is read from its start, leaving out the settled
positions (a sequence by slicing, an iterator by reading past them).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Any

from .._errors import ConfigError, check_int
from .._identity import describe_difference, sequence_identity, short_digest, state_checksum
from ._lineage import SourcePlan, received
from ._merge import Merge
from ._protocols import ListedSource, ResumableSource, SplitShare
from ._span import Span, is_count
from ._spec import StageSpec, stage_names

__all__ = ["VERSION", "load_state", "pipeline_identity", "state_of"]

#: The state format's version (states without one are a sampler's state plus ``offset``).
VERSION = 2
_SAMPLED = 16  # items of a sequence source hashed by states saved before every item was


def _length(source: Any) -> int | None:
    try:
        return len(source)
    except TypeError:
        return None


def _sampled(source: Sequence[Any]) -> str:
    """The listing hash of states saved before every item was hashed (16 items of it): such
    a state is still checked against it."""
    length = len(source)
    step = max(1, length // _SAMPLED)
    sample = "\n".join(_old_token(source[i]) for i in range(0, length, step))
    return short_digest(sample.encode())


def _old_token(item: Any) -> str:
    if isinstance(item, str | int | float | bool) or item is None:
        return repr(item)
    if isinstance(item, bytes) and len(item) <= 256:
        return repr(item)
    if isinstance(item, os.PathLike):
        return repr(os.fspath(item))
    if isinstance(item, tuple) and len(item) <= 8:
        return "(" + ",".join(_old_token(x) for x in item) + ")"
    return type(item).__qualname__


def _listing(source: Any) -> dict[str, Any] | None:
    """What ``source`` lists (``_identity.py``): its own ``listing_identity()``, or every
    item of a sequence; ``None`` for a source that lists nothing it could show again (an
    iterator, a factory without the method)."""
    if isinstance(source, ListedSource):
        return source.listing_identity()
    if isinstance(source, Sequence) and not isinstance(source, str | bytes):
        return sequence_identity(source)
    return None


#: Each run's source listing, taken at its first state (a run reads its listing once; a
#: long listing is not hashed again at every ``state_dict()``).
_run_listings: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def pipeline_identity(source: Any, describe: Sequence[dict[str, Any]],
                      run: Any = None) -> dict[str, Any]:
    """What a state must match: each stage's kind and name, the source's type and length,
    and the identity of every item it lists (``_identity.py``), taken once per ``run``."""
    info: dict[str, Any] = {"type": type(source).__qualname__}
    if callable(source) and not hasattr(source, "__iter__"):  # a factory: which one
        info["type"] = getattr(source, "__qualname__", info["type"])
    if isinstance(source, Merge):  # which pipelines it merges
        info["inputs"] = list(source.labels)
    length = _length(source)
    if length is not None:
        info["len"] = length
    try:
        listing = _run_listings[run] if run is not None else _listing(source)
    except KeyError:
        listing = _run_listings[run] = _listing(source)
    if listing is not None:
        info["listing"] = listing
    return {"source": info, "stages": [[d["kind"], d["name"]] for d in describe[1:]]}


def state_of(source: Any, describe: Sequence[dict[str, Any]], last: Any) -> dict[str, Any]:
    """The state of the latest run ``last`` (a ``Runtime``, or ``None``: nothing delivered
    yet) of a pipeline over ``source``; called in the consumer's thread.

    Raises:
        ConfigError: A stage cannot report its position (it is named).
    """
    positions, extras, epoch = Span(), {}, 0
    failed: dict[str, int] = {}
    texts: dict[str, str] = {}
    if last is not None:
        try:
            positions, extras, texts = last.lineage.snapshot(
                Span(received(last.delivered, last.chunk)))
        except LookupError as exc:
            raise ConfigError(
                f"this pipeline cannot be resumed: stage {exc.args[0]!r} does not report its "
                "position (a custom stage implements settled_inputs(), or sets "
                "CustomSpec(items_per_output=...); see asyncflow/pipeline/EXTENDING.md)"
            ) from None
        epoch = last.epoch
        failed = {c.name: c.counters.failures for c in last.contexts if c.counters.failures}
    body: dict[str, Any] = {
        "version": VERSION,
        "pipeline": pipeline_identity(source, describe, last),
        "epoch": epoch,
        "positions": positions.to_json(),
        "nodes": extras,
        "failed": failed,
    }
    if isinstance(source, ResumableSource):
        body["sampler"] = {**source.state_dict(), "offset": positions.mark}
    if isinstance(source, SplitShare):  # for elastic resume
        body["split"] = source.split_state()
    body["offset"] = positions.mark
    return {**body, "check": state_checksum(body, texts)}


def _differs(saved: dict[str, Any], here: dict[str, Any], source: Any) -> str | None:
    """What differs between two pipeline identities, in words, or ``None``.

    Raises:
        ConfigError: The saved identity is not one (a forged or damaged state).
    """
    if not isinstance(saved, dict) or not isinstance(saved.get("source"), dict) \
            or not isinstance(saved.get("stages"), list):
        raise ConfigError("the state's pipeline must hold source and stages")
    for key in ("type", "len", "inputs"):
        a, b = saved["source"].get(key), here["source"].get(key)
        if a != b:
            what = {"type": "type", "len": "length", "inputs": "inputs (the pipelines merged)"}
            return f"the source's {what[key]} differs: {b!r} here, {a!r} in the state"
    difference = _listing_differs(saved["source"].get("listing"),
                                  here["source"].get("listing"), source)
    if difference is not None:
        return f"the source's items differ (its listing changed): {difference}"
    old, new = saved["stages"], here["stages"]
    for index, (a, b) in enumerate(zip(old, new, strict=False), 1):
        if not isinstance(a, list) or list(a) != list(b):
            a = a if isinstance(a, list) and len(a) == 2 else ["?", a]
            return (f"stage {index} is {b[0]} {b[1]!r} here, {a[0]} {a[1]!r} in the state")
    if len(old) != len(new):
        return f"{len(new)} stage(s) here, {len(old)} in the state"
    return None


def _listing_differs(saved: Any, here: Any, source: Any) -> str | None:
    if saved is None and here is None:
        return None
    if isinstance(saved, str):  # a state saved when a sample of 16 items was hashed
        same = isinstance(source, Sequence) and _sampled(source) == saved
        return None if same else f"{saved!r} in the state (a hash of 16 of its items)"
    if saved is None and here.get("items") == 0:
        return None  # an empty source's state saved before: nothing to identify
    if saved is None:
        return ("the state does not identify the listing (it was saved by an older "
                "asyncflow): resume from a state saved by this one")
    if here is None:
        return "the state identifies a listing, this source lists none it can show"
    return describe_difference(saved, here)


def load_state(
    source: Any, describe: Sequence[dict[str, Any]], state: Any, stages: Sequence[StageSpec]
) -> tuple[int | None, SourcePlan]:
    """Check ``state`` against this pipeline (``describe``: its description, ``stages``: the
    specs after its source, each of which checks its own extras); returns the epoch to
    resume (``None``: the pipeline's own) and where the next run's source starts. A sampler
    source has its own state loaded.

    Raises:
        ConfigError: The state is not a dict from :func:`state_of`, it was edited or cut, or
            it is from another pipeline (the message says what differs).
    """
    if not isinstance(state, dict):
        raise ConfigError(f"not a pipeline state: {type(state).__name__}")
    if "version" not in state and "offset" in state and isinstance(source, ResumableSource):
        return _load_legacy(source, state)
    if state.get("version") != VERSION:
        raise ConfigError(
            f"not a pipeline state of version {VERSION}: version {state.get('version')!r}"
        )
    body = {k: v for k, v in state.items() if k != "check"}
    if state.get("check") != state_checksum(body):
        raise ConfigError("the state was edited or damaged: its checksum does not match")
    missing = {"pipeline", "epoch", "positions", "nodes", "offset"} - set(state)
    if missing:
        raise ConfigError(f"the state lacks {sorted(missing)}")
    difference = _differs(state["pipeline"], pipeline_identity(source, describe), source)
    if difference is not None:
        raise ConfigError(f"the state is from another pipeline: {difference}")
    epoch = check_int("the state's epoch", state["epoch"], 0)
    positions = Span.from_json(state["positions"], "the state's positions", _length(source))
    _check_body(state, stages, positions, isinstance(source, ResumableSource))
    first = 0
    if isinstance(source, ResumableSource):
        source.load_state_dict({**state["sampler"], "offset": positions.mark})
        first = positions.mark
    return epoch, SourcePlan(first=first, skip=positions, nodes=state["nodes"])


def _check_body(state: dict[str, Any], stages: Sequence[StageSpec],
                positions: Span, sampler: bool) -> None:
    """The state's fields have the structure :func:`state_of` gives them: a state whose
    checksum was made again after an edit must fail here, naming the field, not mid-run.

    Raises:
        ConfigError: A field is malformed (it is named).
    """
    nodes = state["nodes"]
    if not isinstance(nodes, dict) or not all(isinstance(v, dict) for v in nodes.values()):
        raise ConfigError("the state's nodes must map stage names to dicts")
    for name, spec in zip(stage_names(stages)[1:], stages, strict=True):
        if name in nodes:
            spec.check_state(nodes[name], f"the state's nodes[{name!r}]")
    failed = state.get("failed", {})
    if not isinstance(failed, dict) or not all(map(is_count, failed.values())):
        raise ConfigError("the state's failed must map stage names to counts (ints >= 0)")
    if state["offset"] != positions.mark:
        raise ConfigError(f"the state's offset must be its positions' mark "
                          f"({positions.mark}), got {state['offset']!r}")
    if sampler and not isinstance(state.get("sampler"), dict):
        raise ConfigError("the state's sampler must be the sampler's state (a dict)")


def _load_legacy(source: Any, state: dict[str, Any]) -> tuple[int | None, SourcePlan]:
    """A state of asyncflow before version 2: a sampler's state, ``offset`` source items
    delivered (the pipeline's epoch count is left as it is)."""
    source.load_state_dict(state)
    offset = int(state["offset"])
    return None, SourcePlan(first=offset, skip=Span(offset))
