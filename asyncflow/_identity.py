"""What identifies a state and its source: the one checksum of a saved state, the one digest
of bytes, and what a resumable source lists, as a small identity that a state carries.

A state resumes a run by source *positions*, so it is only right for the listing it was taken
over: a file added, removed or swapped moves every position after it. Every item therefore
counts, not a sample: each item's *token* (its value, for a list; for ``image.folder``, its
path under the root and label, its size and a fingerprint of its bytes) is hashed, in parts of
a fixed power-of-two size (at most :data:`PARTS` of them), each part keeping its first item's
name and two digests: one of the names, one of the contents. That is about 2 KB however long
the listing, and enough to say where two listings first differ and whether names or contents
changed.

A source says what it lists by a ``listing_identity()`` method returning
:func:`listing_identity`'s dict; a sequence without one is identified by
:func:`sequence_identity`. A cache (``asyncflow/cache/_fingerprint.py``) identifies a long
list in its upstream so too, each item's files by their size and modification time as its
content, and says where two differ with :func:`describe_difference`.

The one checksum of a saved state: what resume, elastic resume (``asyncflow.ranks``) and
any feature that signs a plain-JSON record (a cache's manifest and upstream fingerprint)
compute alike; and the one digest of bytes, :func:`short_digest` (a listing's item tokens, an
image file's token, the journal's digest of a file, the code in a cache's fingerprint).

``state_checksum(body)`` is the first 16 hex digits of the SHA-256 of ``body``'s canonical
JSON (sorted keys, no spaces, ASCII). A pipeline's ``state_dict()`` stores it under
``"check"``; ``load_state_dict`` and ``asyncflow.ranks.remaining`` recompute it over the state
without ``"check"``, so that a state cut or edited by hand is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._errors import ConfigError, check_int
from ._redact import redact

__all__ = ["PARTS", "canonical_json", "describe_difference", "item_token", "listing_identity",
           "sequence_identity", "short_digest", "state_checksum"]

#: ``json.dumps(value, sort_keys=True, separators=(",", ":"))``, its encoder made once (a
#: state is never circular: the check for it would only cost time).
canonical_json = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), check_circular=False
).encode


def state_checksum(body: Mapping[str, Any], texts: Mapping[str, str] | None = None) -> str:
    """The checksum of ``body`` (a state without its ``"check"``).

    Args:
        body: The state's fields, plain JSON.
        texts: The canonical text of some stages' extras (under ``"nodes"``), already at
            hand: the same checksum, without encoding again what did not change.
    """
    if texts is None:
        return short_digest(canonical_json(body).encode())
    parts = []
    for key in sorted(body):
        value = body[key]
        if key == "nodes":
            text = "{" + ",".join(
                f"{json.dumps(name)}:{texts.get(name) or canonical_json(value[name])}"
                for name in sorted(value)) + "}"
        else:
            text = canonical_json(value)
        parts.append(f"{json.dumps(key)}:{text}")
    return short_digest(("{" + ",".join(parts) + "}").encode())


def short_digest(data: bytes | bytearray | memoryview) -> str:
    """The first 16 hex digits of ``data``'s SHA-256, fed in pieces under 2 KiB: hashlib lets
    go of the GIL for a longer one, and taking it back while the run's threads work can cost
    a switch interval (5 ms)."""
    digest = hashlib.sha256()
    view = memoryview(data).cast("B")
    for start in range(0, len(view), 2000):
        digest.update(view[start : start + 2000])
    return digest.hexdigest()[:16]


#: Parts a listing's identity is cut into, at most (each names its first item).
PARTS = 32
_NAME = 80  # characters of a part's first name kept
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SMALL = 256  # characters of a token kept as they are; longer ones are hashed
_OBJECT_REPR: Any = object.__repr__  # an object's default repr: its type and address


def _part_size(n: int) -> int:
    """A power of two, so that one item more or less keeps the parts' bounds."""
    return 1 << max(0, math.ceil(math.log2(max(1, n) / PARTS)))


def _digest(tokens: Sequence[str]) -> str:
    return short_digest("\0".join(tokens).encode("utf-8", "surrogatepass"))[:12]


def _identity(n: int, part: Callable[[int, int], list[Any]]) -> dict[str, Any]:
    """The identity of ``n`` items cut in parts, ``part(start, stop)`` giving each."""
    size = _part_size(n)
    parts = [part(start, min(n, start + size)) for start in range(0, n, size)]
    whole = short_digest(repr((n, parts)).encode("utf-8", "surrogatepass"))
    return {"items": n, "digest": whole, "parts": parts}


def _clip(text: str) -> str:
    return text if len(text) <= _NAME else text[: _NAME // 2 - 2] + "..." + text[-_NAME // 2 + 1:]


def listing_identity(names: Sequence[str], contents: Sequence[str] | None = None
                     ) -> dict[str, Any]:
    """The identity of a listing of ``len(names)`` items.

    Args:
        names: Each item's name, which says which item it is (a path under the root, a
            value's ``repr``).
        contents: Each item's content token (a file's size and a fingerprint of its bytes),
            or ``None`` when the name is the whole item.

    Returns:
        ``{"items": n, "digest": ..., "parts": [[start, first name, names digest, contents
        digest], ...]}``, plain JSON.
    """
    def part(start: int, stop: int) -> list[Any]:
        # The name is shown (and saved with a state): redacted, then cut, so that a cut
        # never leaves a signature's tail without the name that says it is one.
        return [start, _clip(redact(names[start])), _digest(names[start:stop]),
                "" if contents is None else _digest(contents[start:stop])]

    return _identity(len(names), part)


def item_token(item: Any) -> str:
    """An item's value as text: what makes two items of a listing the same one.

    Numbers, text, bytes, paths, and tuples, lists and dicts of them by value (long ones by
    a hash of it); an array by its dtype, shape and bytes; another object by its ``repr``
    without memory addresses (a dataclass's holds its fields), or by its type alone when its
    class defines no ``repr``.
    """
    if isinstance(item, str | int | float | bool) or item is None:
        text = repr(item)
    elif isinstance(item, bytes | bytearray | memoryview):
        text = "b:" + short_digest(item)
    elif isinstance(item, os.PathLike):
        text = repr(os.fspath(item))
    elif isinstance(item, tuple | list):
        text = "(" + ",".join(item_token(x) for x in item) + ")"
    elif isinstance(item, Mapping):
        text = "{" + ",".join(f"{item_token(k)}:{item_token(v)}" for k, v in item.items()) + "}"
    elif hasattr(item, "__array__") and hasattr(item, "dtype") and hasattr(item, "shape"):
        text = _array_token(item)
    elif type(item).__repr__ is _OBJECT_REPR:
        text = type(item).__qualname__
    else:
        try:
            text = _ADDRESS.sub("", repr(item))
        except Exception:
            text = type(item).__qualname__
    if len(text) > _SMALL:
        text = text[:64] + "#" + short_digest(text.encode("utf-8", "replace"))
    return text


def _array_token(item: Any) -> str:
    import numpy as np

    try:
        value = item.detach().cpu().numpy() if hasattr(item, "detach") else np.asarray(item)
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16)
        value = None
    if value is None or value.dtype.hasobject:  # (objects: their bytes are addresses)
        return f"array({item.dtype},{list(item.shape)})"
    digest = short_digest(np.ascontiguousarray(value).tobytes())
    return f"array({value.dtype},{list(value.shape)},{digest})"


def sequence_identity(items: Sequence[Any], contents: Sequence[str] | None = None
                      ) -> dict[str, Any]:
    """:func:`listing_identity` of a sequence source, each item by :func:`item_token` (a
    ``range`` by its bounds, part by part: a million items cost nothing to list), with
    each item's content token where ``contents`` gives them (a cache: the files it names)."""
    if isinstance(items, range):
        return _identity(len(items), lambda start, stop: [
            start, repr(items[start]), _digest([repr(items[start:stop])]), ""])
    return listing_identity([item_token(items[i]) for i in range(len(items))], contents)


def _check(identity: Any, what: str) -> None:
    """``identity`` has :func:`listing_identity`'s structure (it comes from a state file)."""
    if not isinstance(identity, Mapping) or set(identity) != {"items", "digest", "parts"}:
        raise ConfigError(f"{what} must hold items, digest and parts")
    n, parts = identity["items"], identity["parts"]
    check_int(f"{what}['items']", n, 0)
    if not isinstance(identity["digest"], str) or not isinstance(parts, list):
        raise ConfigError(f"{what}: digest must be a str and parts a list")
    for index, part in enumerate(parts):
        if not (isinstance(part, list) and len(part) == 4 and type(part[0]) is int
                and all(isinstance(x, str) for x in part[1:])):
            raise ConfigError(f"{what}['parts'][{index}] must be [start, name, digest, digest]")


def describe_difference(saved: Any, here: Mapping[str, Any],
                        kept: str = "the state") -> str | None:
    """How the listing ``saved`` in ``kept`` (a resume state, a cache's manifest) differs
    from this one, in words, or ``None`` when they are the same.

    Raises:
        ConfigError: ``saved`` is not an identity (the state was forged or damaged).
    """
    _check(saved, f"{kept}'s source listing")
    if saved["digest"] == here["digest"] and saved["items"] == here["items"]:
        return None
    count = (f"{here['items']} items here, {saved['items']} in {kept}; "
             if saved["items"] != here["items"] else "")
    old, new = saved["parts"], here["parts"]
    for a, b in zip(old, new, strict=False):
        if a == b:
            continue
        if a[0] != b[0]:
            break  # parts of other sizes: only the count can be compared
        low = a[0]
        high = min(low + _part_size(max(saved["items"], here["items"])),
                   max(saved["items"], here["items"])) - 1
        where = f"items {low}-{high}" if high > low else f"item {low}"
        if a[1] != b[1]:
            return (f"{count}the listing differs from {where}: item {low} is {b[1]!r} here, "
                    f"{a[1]!r} in {kept}")
        if a[2] != b[2]:
            return f"{count}the listing differs in {where} (from {b[1]!r}): their names differ"
        return (f"{count}the same names, but the content of a file in {where} (from "
                f"{b[1]!r}) changed")
    if count:
        return f"{count}the listing's length changed"
    return "the listing differs (its digest does not match)"
