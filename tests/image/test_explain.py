"""Rebuild any ``image.folder`` batch from its id: files, failures and crops, bit for bit."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import asyncflow as af
from asyncflow import ConfigError, image
from asyncflow.image import augmentation, decode
from asyncflow.pipeline import CustomSpec, NodeContext, Receiver, Sender, StageTraits

from ._pictures import jpeg, smooth, write_tree

BAD = "cat/002x.jpg"  # truncated; the seeds below put it in a batch with others


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    write_tree(root, {"ant": 3, "cat": 5, "dog": 4})
    (root / BAD).write_bytes(jpeg(96, 72)[:600])  # truncated: a DecodeError
    return root


def _epochs(pipe: image.ImageFolder, journal: Path, epochs: int) -> list[list[tuple]]:
    journaled = pipe.journal(journal)
    return [[batch for batch in journaled] for _ in range(epochs)]


@pytest.mark.parametrize("workers", ["threads", "processes"])
@pytest.mark.parametrize("normalize", [True, False])
def test_every_batch_is_rebuilt_bit_for_bit(
    tree: Path, tmp_path: Path, workers: str, normalize: bool, leak_check: None
) -> None:
    pipe = image.folder(tree, batch_size=4, size=(24, 20), train=True, seed=11,
                        max_failures=1, workers=workers, decode_concurrency=2,
                        normalize=normalize)
    epochs = _epochs(pipe, tmp_path / "journal", 3)
    failed = 0
    for epoch, batches in enumerate(epochs):
        assert sum(len(labels) for _, labels in batches) == 12  # 13 files, one bad
        for step, (images, labels) in enumerate(batches):
            record = af.explain(tmp_path / "journal", epoch=epoch, step=step)
            again, again_labels = af.rebuild(pipe, record)
            assert torch.equal(again, images) and torch.equal(again_labels, labels)
            assert len(record.files) == len(record.crops) == len(labels)
            assert vars(labels) == {}  # the journal took the batch's note off: none is left
            failed += len(record.failed)
            for failure in record.failed:
                assert failure.item == BAD and "DecodeError" in failure.error
                assert failure.position is not None and failure.position not in (
                    record.positions or ())
    assert failed == 3  # once per epoch, in whichever batch the shuffle put it
    del pipe, epochs


def test_explain_names_the_files_labels_and_crops(tree: Path, tmp_path: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=24, train=True, seed=5, max_failures=1,
                        workers="threads")
    _epochs(pipe, tmp_path / "j", 2)
    record = af.explain(tmp_path / "j", epoch=1, step=2)
    order = np.random.default_rng(np.random.SeedSequence([5, 1])).permutation(13)
    assert record.positions == tuple(p for p in range(8, 12)
                                     if pipe.samples[order[p]][0] != str(tree / BAD))
    assert record.files == [pipe.samples[order[p]][0] for p in record.positions]
    assert [label for _, label, _ in record.items] == [
        pipe.samples[order[p]][1] for p in record.positions]
    for (path, _, sample), crop in zip(record.items, record.crops, strict=True):
        assert crop == augmentation(tree / path, size=24, train=True, seed=5, epoch=1,
                                    index=sample)
    assert record.config["seed"] == 5 and record.config["train"] is True


def test_a_record_written_before_crops_were_recorded_draws_them_again(
    tree: Path, tmp_path: Path
) -> None:
    # The journal reads an image.folder record's crops through the "journal_crops" seam
    # asyncflow/__init__.py registers (the journal imports nothing of asyncflow.image).
    pipe = image.folder(tree, batch_size=4, size=24, train=True, seed=5, max_failures=1,
                        workers="threads")
    _epochs(pipe, tmp_path / "j", 1)
    recorded = af.explain(tmp_path / "j", epoch=0, step=1)
    [file] = (tmp_path / "j").glob("rank-*.jsonl")
    lines = [json.loads(line) for line in file.read_text().splitlines()]
    file.write_text("".join(
        json.dumps({k: v for k, v in line.items() if k != "crops"}, separators=(",", ":"))
        + "\n" for line in lines))
    drawn = af.explain(tmp_path / "j", epoch=0, step=1)
    assert drawn.crops == recorded.crops and len(drawn.crops) == len(drawn.items) > 0


def test_the_crop_named_is_the_crop_decoded() -> None:
    data = io.BytesIO()
    Image.fromarray(smooth(90, 60, seed=3)).save(data, "PNG")
    png = data.getvalue()
    flips = set()
    for index in range(12):
        crop = augmentation(png, size=(16, 24), train=True, seed=9, epoch=2, index=index)
        flips.add(crop.flip)
        decoded = decode(png, size=(16, 24), train=True, seed=9, epoch=2, index=index)
        with Image.open(io.BytesIO(png)) as im:
            expected = np.asarray(im.convert("RGB").resize(
                (24, 16), Image.Resampling.BILINEAR, box=crop.box))
        if crop.flip:
            expected = expected[:, ::-1]
        assert np.array_equal(decoded, expected)
    assert flips == {True, False}
    centre = augmentation(png, size=32, train=False)
    assert centre.flip is False and centre.box == (15.0, 0.0, 75.0, 60.0)


def test_rebuild_refuses_another_folder_pipeline(tree: Path, tmp_path: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=24, train=True, seed=5, max_failures=1,
                        workers="threads")
    _epochs(pipe, tmp_path / "j", 1)
    record = af.explain(tmp_path / "j", epoch=0, step=0)
    other = image.folder(tree, batch_size=4, size=24, train=True, seed=6, workers="threads")
    with pytest.raises(ConfigError, match="seed is 6 here, 5 in the journal"):
        af.rebuild(other, record)
    with pytest.raises(ConfigError, match=r"image\.folder"):
        af.rebuild(af.Pipeline([1, 2]), record)
    with pytest.raises(ConfigError, match="seed"):
        augmentation(tree / "ant" / "000.jpg", size=8, train=True)


def test_a_journal_across_a_resume(tree: Path, tmp_path: Path, leak_check: None) -> None:
    def build() -> image.ImageFolder:
        return image.folder(tree, batch_size=3, size=24, train=True, seed=11, max_failures=1,
                            workers="threads", decode_concurrency=2)

    full = list(build())
    pipe = build().journal(tmp_path / "j")
    with pipe.open() as run:
        taken = [next(run) for _ in range(2)]
        state = pipe.state_dict()
        taken.append(next(run))  # delivered after the state: delivered again on resume
    resumed = build().journal(tmp_path / "j")
    resumed.load_state_dict(json.loads(json.dumps(state)))
    delivered = taken[:2] + list(resumed)
    assert len(delivered) == len(full)
    for step, (images, labels) in enumerate(delivered):
        record = af.explain(tmp_path / "j", epoch=0, step=step)
        again, again_labels = af.rebuild(build(), record)
        assert torch.equal(again, images) and torch.equal(again_labels, labels)
        assert torch.equal(images, full[step][0])


def test_batches_made_anew_after_the_folder_are_journaled_without_positions(
    tree: Path, tmp_path: Path
) -> None:
    pipe = image.folder(tree, batch_size=4, size=16, max_failures=1, workers="threads")
    copied = pipe.map(lambda batch: (batch[0].clone(), batch[1].clone()), name="copy")
    list(copied.journal(tmp_path / "j"))
    record = af.explain(tmp_path / "j", epoch=0, step=1)
    assert record.kind == "pipeline" and record.positions is None
    with pytest.raises(ConfigError, match="no positions"):
        af.rebuild(copied, record)
    prefetched = pipe.prefetch(2)  # the same batch objects: still an image.folder record
    list(prefetched.journal(tmp_path / "k"))
    assert af.explain(tmp_path / "k", epoch=1, step=1).kind == "image.folder"  # 2nd listing


class _Handing:
    """A third party's stage that hands on the batches it reads, as they are."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        while items := await inp.get_many(4):
            await out.put_many(items)


@pytest.mark.parametrize(("traits", "kind"), [
    (StageTraits(ordered=True, per_item=True, keeps_items=True), "image.folder"),
    (StageTraits(ordered=True, per_item=True), "pipeline"),
])
def test_a_stage_after_the_folder_is_judged_by_its_traits(
    tree: Path, tmp_path: Path, traits: StageTraits, kind: str
) -> None:
    """Not by its kind: a custom stage that declares it keeps its items, one for one, leaves
    the batches the folder's own; one that does not may have made new ones."""
    pipe = image.folder(tree, batch_size=4, size=16, max_failures=1, workers="threads")
    handing = pipe.with_stage(CustomSpec(label="hand", factory=_Handing, items_per_output=1,
                                         traits=traits))
    list(handing.journal(tmp_path / "j"))
    assert af.explain(tmp_path / "j", epoch=0, step=1).kind == kind


# -- a file changed after the run (issue 25, point 4) --------------------------------------


def _same_size_jpeg(size: int, seed: int) -> bytes:
    """Another picture's JPEG padded with a comment to exactly ``size`` bytes."""
    bare = jpeg(96, 72, seed=seed)
    pad = size - len(bare) - 4  # a COM segment: marker, length, text
    assert pad > 0
    return bare[:2] + b"\xff\xfe" + (pad + 2).to_bytes(2, "big") + b"x" * pad + bare[2:]


@pytest.mark.parametrize("change", ["pixels in place", "a larger picture"])
def test_a_file_changed_after_the_run_is_found_and_its_crop_is_the_runs(
    tree: Path, tmp_path: Path, change: str
) -> None:
    pipe = image.folder(tree, batch_size=4, size=24, train=True, seed=5, max_failures=1,
                        workers="threads")
    _epochs(pipe, tmp_path / "j", 1)
    record = af.explain(tmp_path / "j", epoch=0, step=1)
    path, _, sample = record.items[2]
    file = tree / path
    used = augmentation(file, size=24, train=True, seed=5, epoch=0, index=sample)
    assert record.crops[2] == used and len(record.digests) == len(record.items)
    stamp = file.stat()
    if change == "pixels in place":  # the same size, other pixels, the time put back
        file.write_bytes(_same_size_jpeg(stamp.st_size, seed=77))
        os.utime(file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        assert file.stat().st_size == stamp.st_size
    else:
        file.write_bytes(jpeg(400, 300, seed=78))
    decode(file.read_bytes(), size=24)  # it still decodes
    with pytest.raises(af.SourceError, match=rf"{path}: changed since the run"):
        af.rebuild(pipe, record)
    again = af.explain(tmp_path / "j", epoch=0, step=1)
    assert again.crops[2] == used  # the crop the run used, not one drawn from the new file
    if change == "a larger picture":
        assert augmentation(file, size=24, train=True, seed=5, epoch=0, index=sample) != used
