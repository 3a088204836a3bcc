"""The cache's on-disk format: file names, the ``.npy`` header, the manifest and its checksum.

Layout of a cache at ``PATH``::

    PATH/manifest.json      count, batch size, structure, fields, fingerprint, checksums
                            (written last; it carries a checksum of its own content)
    PATH/field0.npy ...     one array [count, *shape] per field, a standard .npy file whose
                            data starts at byte 4096 (``np.load(f, mmap_mode="r")`` opens it)
    PATH/field0.crc32 ...   per field, the CRC-32 of each block of its data (little-endian
                            uint32; see _checks.py); the manifest holds each table's CRC-32
    PATH.lock               the writer's lock file (see _lock.py)
    PATH.tmp-<pid>-<hex>/   a cache being written; renamed to PATH when its pass completes
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError
from ..pipeline import state_checksum
from ._schema import Field

__all__ = ["BLOCK_BYTES", "FORMAT", "HEADER_BYTES", "LAYOUTS", "MANIFEST", "VERSION",
           "CacheInvalid", "block_rows", "leftovers", "manifest_digest", "npy_header",
           "read_manifest", "remove_cache", "remove_path", "table_name", "write_file",
           "write_manifest"]

FORMAT = "asyncflow-cache"
#: 2: block checksums, a checksummed manifest; 3: long upstream lists identified as a resume
#: state identifies them (``sequence_identity``), the manifest signed by ``state_checksum``.
VERSION = 3
MANIFEST = "manifest.json"
LAYOUTS = ("samples", "batches", "lists")
HEADER_BYTES = 4096  # the .npy header is padded to one page, so the data starts page-aligned
BLOCK_BYTES = 4096  # bytes of a checksummed block, in whole rows (see block_rows, _checks.py)
_OWN_FILE = re.compile(r"manifest\.json|field\d+\.(npy|crc32)")
_SELF = "check"


class CacheInvalid(Exception):
    """The cache exists but must not be used; ``str(exc)`` says why."""


def block_rows(sample_bytes: int) -> int:
    """Rows per checksummed block of a field whose rows take ``sample_bytes`` (0: no data)."""
    if sample_bytes <= 0:
        return 0
    return max(1, BLOCK_BYTES // sample_bytes)


def table_name(index: int) -> str:
    """The file of field ``index``'s checksum table."""
    return f"field{index}.crc32"


def npy_header(field: Field, count: int) -> bytes:
    """The ``.npy`` header of ``field``'s file, padded to :data:`HEADER_BYTES`."""
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(field.dtype)),
        "fortran_order": False,
        "shape": (count, *field.shape),
    }
    text = repr(header).encode("latin1")
    room = HEADER_BYTES - 10  # magic (6) + version (2) + header length (2)
    return b"\x93NUMPY\x01\x00" + room.to_bytes(2, "little") + text.ljust(room - 1) + b"\n"


def leftovers(path: Path) -> list[Path]:
    """Temporary directories of unfinished writers, left next to ``path``."""
    if not path.parent.is_dir():
        return []
    pattern = re.compile(re.escape(path.name) + r"\.tmp-\d+-[0-9a-f]{8}")
    return sorted(p for p in path.parent.iterdir() if pattern.fullmatch(p.name))


def remove_cache(path: Path) -> None:
    """Delete the cache directory at ``path`` (if any), refusing anything that is not one.

    Raises:
        ConfigError: ``path`` holds something a cache never does (a guard against
            ``.cache("data/train")`` deleting a dataset).
    """
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_symlink() or not path.is_dir() or any(
        not _OWN_FILE.fullmatch(p.name) for p in path.iterdir()
    ):
        raise ConfigError(
            f"{path} exists and is not an asyncflow cache; refusing to replace it. "
            "Give .cache() a path of its own"
        )
    remove_path(path)


def remove_path(path: Path) -> None:
    """Delete a file or directory tree; nothing when it is already gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The checksum of ``manifest``'s content, its own entry left out: a resume state's
    (``asyncflow.pipeline.state_checksum``)."""
    return state_checksum({k: v for k, v in manifest.items() if k != _SELF})


def write_file(path: Path, data: bytes, *, durable: bool) -> None:
    """Write ``data`` to a new file at ``path``; with ``durable``, ``fsync`` it."""
    with open(path, "wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())


def write_manifest(directory: Path, manifest: dict[str, Any], *, durable: bool) -> None:
    """Write ``manifest`` with its checksum into ``directory``."""
    text = json.dumps({**manifest, _SELF: manifest_digest(manifest)}, indent=1) + "\n"
    write_file(directory / MANIFEST, text.encode("ascii"), durable=durable)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the cache at ``path``, checked against its checksum.

    Raises:
        FileNotFoundError: No cache at ``path``.
        CacheInvalid: The manifest is unreadable, damaged, or of another format or version.
    """
    try:
        text = (path / MANIFEST).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"no cache at {path}") from None
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise CacheInvalid(f"its manifest is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CacheInvalid("its manifest is not an asyncflow cache manifest")
    if manifest.get("version") != VERSION:
        raise CacheInvalid(
            f"it has format version {manifest.get('version')}, this asyncflow writes {VERSION}"
        )
    if manifest.get(_SELF) != manifest_digest(manifest):
        raise CacheInvalid(f"{path / MANIFEST} does not match its checksum (damaged)")
    return manifest
