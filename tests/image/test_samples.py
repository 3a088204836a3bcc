"""image.sample_folder: public sample data in the ImageFolder layout."""

from __future__ import annotations

from pathlib import Path

from asyncflow import image


def test_sample_folder_makes_a_tree_image_folder_reads(tmp_path: Path) -> None:
    root = image.sample_folder(str(tmp_path / "images"), 6, seed=1)
    assert root == tmp_path / "images"
    files = sorted(p.relative_to(root) for p in root.rglob("*.jpg"))
    assert len(files) == 6 and len({f.parent for f in files}) >= 2
    pipe = image.folder(root, batch_size=4, size=16, workers="threads")
    assert sum(len(y) for _, y in pipe) == 6
    again = image.sample_folder(tmp_path / "again", 6, seed=1)
    assert [(again / f).read_bytes() for f in files] == [(root / f).read_bytes() for f in files]
