"""A stable fingerprint of the pipeline upstream of a cache, and what changed between two.

The fingerprint hashes the upstream pipeline's description (``Pipeline.describe()``: its
source listing and each stage's name and settings) plus an optional user ``key``. Values that
JSON cannot hold are written as their ``repr`` with memory addresses removed, so the
fingerprint of an unchanged pipeline is the same in every process.

A string (or path) that names a local regular file stands with the file's size and
modification time (``st_mtime_ns``): a file rewritten in place, under the same name, changes
the fingerprint. That costs one ``stat`` per listed file when the fingerprint is taken (when
``.cache()`` is called); URLs (``scheme://...``) are left alone.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
import types
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np

from .._redact import redact
from ._schema import as_array

__all__ = ["canonical", "describe_change", "describe_value", "file_stat", "summarize",
           "upstream_fingerprint"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SUMMARY_LIMIT = 256  # characters of JSON a value may take in the manifest before it is hashed
_DEPTH = 4  # how deep describe_value() looks into objects
_SHORT = 64  # sequences longer than this are digested, not listed
_CHUNK = 65536
_SMALL_ARRAY = 1 << 16  # bytes of an array whose content is hashed (mean/std tables, say)


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
    decode options); a long sequence as a digest of its items. Private attributes (``_x``)
    are skipped: they hold run-time state such as counters and locks, and so is the
    ``epoch`` of an object with a ``set_epoch()`` method (a sampler: where its runs are). An
    object with a ``describe()`` method is described by what it returns instead (so it can
    leave out what does not change its output, such as a seed it does not use, or the
    counters its runs keep).
    """
    return _state(value, depth, set())


def _state(value: Any, depth: int, seen: set[int]) -> Any:
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
        return {str(k): _state(v, inner, seen) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if len(value) <= _SHORT:
            return [_state(v, inner, seen) for v in value]
        return _digest_sequence(value)
    if hasattr(value, "__array__") and hasattr(value, "dtype") and hasattr(value, "shape"):
        return _array_state(value)
    if isinstance(value, functools.partial):
        return {"partial": _state(value.func, inner, seen), "args": _state(value.args, inner, seen),
                "keywords": _state(value.keywords, inner, seen)}
    if isinstance(value, types.MethodType):
        func = value.__func__
        return {"method": func.__qualname__, "code": _code_digest(func.__code__),
                "self": _state(value.__self__, inner, seen)}
    if isinstance(value, types.FunctionType):
        closure = [c.cell_contents for c in value.__closure__ or () if _filled(c)]
        return {"function": f"{value.__module__}.{value.__qualname__}",
                "code": _code_digest(value.__code__),
                "defaults": _state(value.__defaults__, inner, seen),
                "closure": _state(closure, inner, seen)}
    describe = getattr(value, "describe", None)
    if callable(describe) and not isinstance(value, type | types.ModuleType):
        try:
            described = describe()
        except TypeError:  # a describe() that needs arguments is another protocol
            pass
        else:
            return {"object": _type_name(value), "describe": _state(described, inner, seen)}
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(value, type | types.ModuleType):
        public = {k: v for k, v in attrs.items() if not k.startswith("_")}
        if callable(getattr(value, "set_epoch", None)):
            # a sampler's (or any epoch-aware object's) epoch says where its runs are, not
            # what it lists: iterating the upstream before .cache() must not rebuild it
            public.pop("epoch", None)
        return {"object": _type_name(value), **{k: _state(v, inner, seen)
                                                for k, v in sorted(public.items())}}
    return canonical(value)


def file_stat(name: str | PurePath) -> tuple[int, int] | None:
    """The size and ``st_mtime_ns`` of the local regular file ``name`` names, else None."""
    text = os.fspath(name)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        return None
    if not text or len(text) > 4096 or "\0" in text:
        return None
    try:
        found = os.stat(text)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    return found.st_size, found.st_mtime_ns


def _files_state(items: Any) -> dict[str, Any]:
    """The size and modification time of each local file a long sequence's items name
    (an item that is a path, or a tuple or list holding paths: ``(path, label)``)."""
    digest = hashlib.sha256()
    count, newest, newest_time = 0, "", -1
    for index, item in enumerate(items):
        names = item if isinstance(item, tuple | list) else (item,)
        for name in names:
            if not isinstance(name, str | PurePath):
                continue
            found = file_stat(name)
            if found is None:
                continue
            count += 1
            digest.update(f"{index}:{found[0]}:{found[1]};".encode())
            if found[1] > newest_time:
                newest, newest_time = os.fspath(name), found[1]
    if not count:
        return {}
    return {"files": {"sha256": digest.hexdigest(), "items": count, "newest": _clip(newest)}}


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
    digest = hashlib.sha256(code.co_code)
    for const in code.co_consts:
        text = _code_digest(const) if isinstance(const, types.CodeType) else repr(const)
        digest.update(text.encode("utf-8", "backslashreplace"))
    digest.update(repr(code.co_names).encode())
    return digest.hexdigest()[:16]


def _array_state(value: Any) -> Any:
    state = {"array": str(value.dtype), "shape": [int(n) for n in value.shape]}
    try:
        small = _nbytes(value) <= _SMALL_ARRAY
        data = np.ascontiguousarray(as_array(value)).data.cast("B") if small else None
    except (TypeError, ValueError, RuntimeError):
        data = None
    if data is not None:
        state["sha256"] = hashlib.sha256(data).hexdigest()[:16]
    return state


def _nbytes(value: Any) -> int:
    size = getattr(value, "nbytes", None)
    if size is None and hasattr(value, "element_size"):
        size = value.element_size() * value.numel()
    return int(size or 0)


def _digest_sequence(items: Any) -> dict[str, Any]:
    # repr() of a chunk is C-speed (an ImageNet listing of 1.28M (path, label) pairs in about
    # 0.6 s); memory addresses are removed so objects without a value repr hash alike.
    digest = hashlib.sha256()
    for start in range(0, len(items), _CHUNK):
        text = repr(list(items[start:start + _CHUNK]))
        digest.update(_ADDRESS.sub("", text).encode("utf-8", "backslashreplace"))
    return {"sha256": digest.hexdigest(), "items": len(items),
            **_ends(items, lambda item: _ADDRESS.sub("", repr(item))), **_files_state(items)}


def _ends(items: Any, text: Any) -> dict[str, str]:
    """A long sequence's first and last items, as short text: they tell a user what changed
    where the digest only tells that something did (a dataset moved: other paths)."""
    if not len(items):
        return {}
    return {"first": _clip(text(items[0])), "last": _clip(text(items[-1]))}


def _clip(text: str, limit: int = 100) -> str:
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return text[:half] + "..." + text[-half:]


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def upstream_fingerprint(description: Any, key: Any = None) -> str:
    """The SHA-256 (hex) of the canonical JSON of ``description`` and ``key``."""
    payload = _dumps({"upstream": canonical(description), "key": canonical(key)})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def summarize(description: Any) -> Any:
    """A small copy of ``description`` for the manifest: long values (a source listing of a
    million files, say) are replaced by ``{"sha256": ..., "items": n}``, and secrets in
    strings (URL credentials and query strings, keys) are masked."""
    value = canonical(description)

    def shrink(v: Any) -> Any:
        text = _dumps(v)
        if len(text) <= _SUMMARY_LIMIT:
            return _redacted(v)
        if isinstance(v, dict):
            return {k: shrink(x) for k, x in v.items()}
        if isinstance(v, list) and len(v) <= 16:
            return [shrink(x) for x in v]
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if not isinstance(v, list):
            return {"sha256": digest, "items": len(text)}
        return {"sha256": digest, "items": len(v), **_ends(v, lambda x: redact(_dumps(x)))}

    return shrink(value)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def describe_change(old: Any, new: Any, where: str = "upstream") -> str:
    """Where two summaries first differ, in words (``upstream[2]['size']: 224 -> 256``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if _is_digest(old) and _is_digest(new):
            if old["items"] != new["items"]:
                return f"{where} changed ({old['items']} -> {new['items']} entries)"
            if not ({"first", "last"} <= set(old) and {"first", "last"} <= set(new)):
                return f"{where} changed ({new['items']} entries)"  # from an older version
            for end in ("first", "last"):
                if old[end] != new[end]:
                    return (f"{where} changed ({new['items']} entries): the {end} went from "
                            f"{old[end]} to {new[end]}")
            if old["sha256"] == new["sha256"] and old.get("files") != new.get("files"):
                newest = (new.get("files") or {}).get("newest")
                return (f"{where}: listed files changed in place (size or modification time)"
                        + (f"; the last modified is now {newest}" if newest else ""))
            return f"{where} changed ({new['items']} entries; the first and last are the same)"
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
    return f"{where}: {_short(old)} -> {_short(new)}"


def _is_digest(value: dict[str, Any]) -> bool:
    return {"sha256", "items"} <= set(value) <= {"sha256", "items", "first", "last", "files"}


def _short(value: Any) -> str:
    text = _dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
