"""A stable fingerprint of the pipeline upstream of a cache, and what changed between two.

The fingerprint hashes the upstream pipeline's description (``Pipeline.describe()``: its
source listing and each stage's name and settings) plus an optional user ``key``. Values that
JSON cannot hold are written as their ``repr`` with memory addresses removed, so the
fingerprint of an unchanged pipeline is the same in every process.

A string (or path) that names a local regular file stands with the file's size and
modification time (``st_mtime_ns``): a file rewritten in place, under the same name, changes
the fingerprint. That costs one ``stat`` per listed file when the fingerprint is taken (when
``.cache()`` is called); URLs (``scheme://...``) are left alone.

A long sequence (a source's listing) is described as a resume state identifies it
(``asyncflow/_identity.py``): each item by its value, with the size and time of the
files it names as its content, in parts that say where two listings first differ.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import types
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from .._redact import redact
from ..pipeline import (
    describe_difference,
    item_token,
    sequence_identity,
    short_digest,
    state_checksum,
)

__all__ = ["canonical", "clip_json", "describe_change", "describe_value", "file_stat",
           "summarize", "upstream_fingerprint"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SUMMARY_LIMIT = 256  # characters of a string, or of a list's JSON, kept whole in the manifest
_DEPTH = 4  # how deep describe_value() looks into objects
_SHORT = 64  # sequences longer than this are identified as listings, not listed


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data: dict keys as strings, tuples as lists, others as reprs."""
    if isinstance(value, str):
        return _ADDRESS.sub("", value)  # describe() writes reprs of objects, with addresses
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((canonical(v) for v in value), key=_dumps)
    return _ADDRESS.sub("", repr(value))


def describe_value(value: Any, depth: int = _DEPTH) -> Any:
    """What a stage function or source *is*, as JSON data for the fingerprint.

    ``Pipeline.describe()`` names stage functions; two ``image.folder`` pipelines of another
    ``size`` share those names. This looks inside: a function's code, defaults and closure;
    a ``functools.partial``'s arguments; an object's public attributes (a listing of files,
    decode options); a long sequence as a listing's identity. Private attributes (``_x``)
    are skipped: they hold run-time state such as counters and locks, and so is the
    ``epoch`` of an object with a ``set_epoch()`` method (a sampler: where its runs are). An
    object with a ``describe()`` method is described by what it returns instead (so it can
    leave out what does not change its output, such as a seed it does not use, or the
    counters its runs keep).
    """
    return _what(value, depth, set())


def _what(value: Any, depth: int, seen: set[int]) -> Any:
    if isinstance(value, str | PurePath):
        text = canonical(value) if isinstance(value, str) else str(value)
        found = file_stat(value)
        return text if found is None else {"file": text, "bytes": found[0], "mtime_ns": found[1]}
    if value is None or isinstance(value, bool | int | float):
        return canonical(value)
    if isinstance(value, range):
        return repr(value)
    if depth <= 0 or id(value) in seen:
        return _type_name(value)
    seen = seen | {id(value)}
    inner = depth - 1
    if isinstance(value, Mapping):
        return {str(k): _what(v, inner, seen) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if len(value) <= _SHORT:
            return [_what(v, inner, seen) for v in value]
        return sequence_identity(value, _file_tokens(value))
    if hasattr(value, "__array__") and hasattr(value, "dtype") and hasattr(value, "shape"):
        return item_token(value)  # its dtype, shape and bytes
    if isinstance(value, functools.partial):
        return {"partial": _what(value.func, inner, seen), "args": _what(value.args, inner, seen),
                "keywords": _what(value.keywords, inner, seen)}
    if isinstance(value, types.MethodType):
        func = value.__func__
        return {"method": func.__qualname__, "code": _code_digest(func.__code__),
                "self": _what(value.__self__, inner, seen)}
    if isinstance(value, types.FunctionType):
        closure = [c.cell_contents for c in value.__closure__ or () if _filled(c)]
        return {"function": f"{value.__module__}.{value.__qualname__}",
                "code": _code_digest(value.__code__),
                "defaults": _what(value.__defaults__, inner, seen),
                "closure": _what(closure, inner, seen)}
    describe = getattr(value, "describe", None)
    if callable(describe) and not isinstance(value, type | types.ModuleType):
        try:
            described = describe()
        except TypeError:  # a describe() that needs arguments is another protocol
            pass
        else:
            return {"object": _type_name(value), "describe": _what(described, inner, seen)}
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(value, type | types.ModuleType):
        public = {k: v for k, v in attrs.items() if not k.startswith("_")}
        if callable(getattr(value, "set_epoch", None)):
            # a sampler's (or any epoch-aware object's) epoch says where its runs are, not
            # what it lists: iterating the upstream before .cache() must not rebuild it
            public.pop("epoch", None)
        return {"object": _type_name(value), **{k: _what(v, inner, seen)
                                                for k, v in sorted(public.items())}}
    return canonical(value)


def file_stat(name: str | PurePath) -> tuple[int, int] | None:
    """The size and ``st_mtime_ns`` of the local regular file ``name`` names, else None (a
    URL, or a text that names nothing: ``os.stat`` refuses an empty or long name, or a NUL)."""
    text = os.fspath(name).removeprefix("file://")
    if "://" in text:
        return None
    try:
        found = os.stat(text)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    return found.st_size, found.st_mtime_ns


def _file_tokens(items: Sequence[Any]) -> list[str] | None:
    """Each item's content token: the size and modification time of the local files it
    names (an item that is a path, or a tuple or list holding paths: ``(path, label)``);
    ``None`` when no item names one."""
    tokens = []
    for item in items:
        names = item if isinstance(item, tuple | list) else (item,)
        found = [file_stat(name) for name in names if isinstance(name, str | PurePath)]
        tokens.append(" ".join(f"{f[0]}:{f[1]}" for f in found if f is not None))
    return tokens if any(tokens) else None


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell (a name bound later)
        return False
    return True


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _code_digest(code: types.CodeType) -> str:
    consts = "".join(_code_digest(c) if isinstance(c, types.CodeType) else repr(c)
                     for c in code.co_consts)
    return short_digest(code.co_code + consts.encode("utf-8", "backslashreplace")
                        + repr(code.co_names).encode())


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def upstream_fingerprint(description: Any, key: Any = None) -> str:
    """The checksum of ``description`` and ``key`` as canonical JSON: a plain-JSON record's
    (``state_checksum``, as a resume state's)."""
    return state_checksum({"upstream": canonical(description), "key": canonical(key)})


def summarize(description: Any) -> Any:
    """A small copy of ``description`` for the manifest: a long list (a source listing of
    a million files, say) is kept as a listing's identity (about 2 KB, its names redacted),
    a long string as ``{"sha256": ..., "items": n}``, and secrets in strings (URL
    credentials and query strings, keys) are masked."""
    value = canonical(description)

    def shrink(v: Any) -> Any:
        if _is_listing(v):
            return v
        if isinstance(v, dict):
            return {k: shrink(x) for k, x in v.items()}
        if isinstance(v, list):
            short = len(v) <= 16 or len(_dumps(v)) <= _SUMMARY_LIMIT
            return [shrink(x) for x in v] if short else sequence_identity(v)
        if isinstance(v, str) and len(v) > _SUMMARY_LIMIT:
            return {"sha256": short_digest(v.encode("utf-8")), "items": len(v)}
        return redact(v) if isinstance(v, str) else v

    return shrink(value)


def describe_change(old: Any, new: Any, where: str = "upstream") -> str:
    """Where two summaries first differ, in words (``upstream[2]['size']: 224 -> 256``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if _is_listing(old) and _is_listing(new):
            return f"{where}: {describe_difference(old, new, 'the cache') or 'changed'}"
        for k in sorted(set(old) | set(new)):
            if k not in old:
                return f"{where} gained {k!r}"
            if k not in new:
                return f"{where} lost {k!r}"
            if old[k] != new[k]:
                return describe_change(old[k], new[k], f"{where}[{k!r}]")
        return f"{where} changed"
    if isinstance(old, list) and isinstance(new, list):
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            if a != b:
                return describe_change(a, b, f"{where}[{i}]")
        if len(old) != len(new):
            return f"{where} went from {len(old)} to {len(new)} entries"
        return f"{where} changed"
    return f"{where}: {clip_json(old)} -> {clip_json(new)}"


def _is_listing(value: Any) -> bool:
    """Whether ``value`` is a listing's identity (``sequence_identity``)."""
    return isinstance(value, dict) and set(value) == {"items", "digest", "parts"}


def clip_json(value: Any, limit: int = 80) -> str:
    """``value`` as JSON text of at most ``limit`` characters (``...`` ends a cut one)."""
    text = json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."
