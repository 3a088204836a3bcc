"""The one checksum of a saved state: what resume, elastic resume (``asyncflow.ranks``) and
any feature that signs a plain-JSON record (a cache's manifest) compute alike; and the one
digest of bytes, :func:`short_digest` (a listing's item tokens, an image file's token, the
journal's digest of a file, a cache's fingerprint).

``state_checksum(body)`` is the first 16 hex digits of the SHA-256 of ``body``'s canonical
JSON (sorted keys, no spaces, ASCII). A pipeline's ``state_dict()`` stores it under
``"check"``; ``load_state_dict`` and ``asyncflow.ranks.remaining`` recompute it over the state
without ``"check"``, so that a state cut or edited by hand is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical_json", "short_digest", "state_checksum"]

#: ``json.dumps(value, sort_keys=True, separators=(",", ":"))``, its encoder made once (a
#: state is never circular: the check for it would only cost time).
canonical_json = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), check_circular=False
).encode
_compact = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def state_checksum(body: Mapping[str, Any], texts: Mapping[str, str] | None = None) -> str:
    """The checksum of ``body`` (a state without its ``"check"``).

    Args:
        body: The state's fields, plain JSON.
        texts: The canonical text of some stages' extras (under ``"nodes"``), already at
            hand: the same checksum, without encoding again what did not change (the
            settled positions, sorted already, are then written directly too).
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
        elif key == "positions":
            text = (f'{{"mark":{value["mark"]},'
                    f'"ranges":{_compact(value["ranges"])}}}')
        else:
            text = canonical_json(value)
        parts.append(f"{json.dumps(key)}:{text}")
    return short_digest(("{" + ",".join(parts) + "}").encode())


def short_digest(data: bytes | bytearray | memoryview) -> str:
    """The first 16 hex digits of ``data``'s SHA-256, fed in pieces under 2 KiB: hashlib lets
    go of the GIL for a longer one, and taking it back while the run's threads work can cost
    a switch interval (5 ms)."""
    if len(data) <= 2000:  # the common case, in one call
        return hashlib.sha256(data).hexdigest()[:16]
    digest = hashlib.sha256()
    view = memoryview(data).cast("B")
    for start in range(0, len(view), 2000):
        digest.update(view[start : start + 2000])
    return digest.hexdigest()[:16]
