"""Listing an image-folder tree as torchvision's ImageFolder does: classes and samples."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .._blob import unreadable_folder
from .._errors import ConfigError, SourceNotFound

__all__ = ["IMG_EXTENSIONS", "scan"]

#: The file extensions torchvision's ImageFolder accepts (compared case-insensitively).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def scan(
    root: str | os.PathLike[str], extensions: str | Sequence[str] = IMG_EXTENSIONS
) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted sub-folder names) and ``(path, class index)`` samples, as torchvision:
    files whose names end with one of ``extensions`` (a str: one), compared case-insensitively.

    Raises:
        SourceNotFound: ``root`` does not exist.
        ConfigError: ``root`` is a file, has no class folder, or a class folder has no image
            file.
        SourceError: A folder under a class cannot be read (``SourcePermissionError`` where
            permission is denied): named, never skipped.
    """
    base = Path(root)
    if not base.is_dir():
        if base.exists():
            raise ConfigError(f"{os.fspath(root)}: is a file, not a directory (expected "
                              "root/<class>/<image>)")
        raise SourceNotFound(f"{os.fspath(root)}: no such directory")
    classes = sorted(entry.name for entry in os.scandir(base) if entry.is_dir())
    if not classes:
        raise ConfigError(f"{os.fspath(root)}: no class folders (expected root/<class>/<image>)")
    # One extension may be a str, as torchvision takes it (not a sequence of its characters).
    exts = tuple(e.lower() for e in ((extensions,) if isinstance(extensions, str) else extensions))
    samples: list[tuple[str, int]] = []
    empty = []
    for idx, name in enumerate(classes):
        found = _walk(base / name, idx, exts, samples)
        if not found:
            empty.append(name)
    if empty:
        raise ConfigError(
            f"{os.fspath(root)}: no image file ({', '.join(exts)}) in class folder(s) "
            f"{', '.join(repr(e) for e in empty[:5])}{' ...' if len(empty) > 5 else ''}"
        )
    return classes, samples


def _walk(folder: Path, label: int, exts: tuple[str, ...],
          samples: list[tuple[str, int]]) -> int:
    """Append the images under ``folder`` (links followed) to ``samples``, in torchvision's
    order (``sorted(os.walk(...))``: by folder path, then by name); how many."""
    walked = []
    seen: set[tuple[int, int]] = set()  # (device, inode) of each folder walked
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True,
                                                onerror=unreadable_folder):
        # Links are followed (as torchvision does), but each folder is walked once: a
        # link back up the tree would otherwise loop until the path is too long.
        try:
            here = os.stat(dirpath)
        except FileNotFoundError:  # vanished since it was listed: it holds nothing
            continue
        if (here.st_dev, here.st_ino) in seen:
            dirnames.clear()
            continue
        seen.add((here.st_dev, here.st_ino))
        dirnames.sort()  # which path reaches a folder linked twice: the first in sorted order
        walked.append((dirpath, filenames))
    before = len(samples)
    for dirpath, filenames in sorted(walked):
        samples.extend((os.path.join(dirpath, fname), label) for fname in sorted(filenames)
                       if fname.lower().endswith(exts))
    return len(samples) - before
