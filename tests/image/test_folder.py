"""image.folder: an ImageFolder tree as a pipeline of batches."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncflow import (
    ConfigError,
    DecodeError,
    Pipeline,
    PipelineError,
    SourceNotFound,
    SourcePermissionError,
    image,
)
from asyncflow.image._folder import scan
from asyncflow.pipeline import AssembleSpec

from ._pictures import jpeg, write_tree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    write_tree(root, {"cat": 5, "dog": 4, "ant": 3})
    return root


def _collect(pipe: object) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    xs, ys = [], []
    for x, y in pipe:  # type: ignore[attr-defined]
        xs.append(x)
        ys.append(y)
    return xs, ys


def test_classes_follow_the_sorted_folders(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=32)
    assert pipe.classes == ["ant", "cat", "dog"]
    assert pipe.class_to_idx == {"ant": 0, "cat": 1, "dog": 2}
    assert [label for _, label in pipe.samples] == [0] * 3 + [1] * 5 + [2] * 4
    assert pipe.samples[0][0].endswith("ant/000.jpg")
    assert isinstance(pipe, Pipeline) and isinstance(pipe, image.ImageFolder)
    assert len(pipe) == 3


def test_normalized_float_batches(tree: Path, leak_check: None) -> None:
    pipe = image.folder(tree, batch_size=5, size=(32, 40))
    xs, ys = _collect(pipe)
    assert [x.shape[0] for x in xs] == [5, 5, 2]
    for x, y in zip(xs, ys, strict=True):
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 32, 40) and x.is_contiguous()
        assert y.dtype == torch.int64
    assert torch.cat(ys).tolist() == [label for _, label in pipe.samples]


def test_uint8_batches_equal_decode_and_normalize(tree: Path) -> None:
    u8 = image.folder(tree, batch_size=4, size=32, normalize=False)
    f32 = image.folder(tree, batch_size=4, size=32)
    xs, _ = _collect(u8)
    fs, _ = _collect(f32)
    assert all(x.dtype == torch.uint8 for x in xs)
    images = torch.cat(xs)
    for (path, _), got in zip(u8.samples, images, strict=True):
        np.testing.assert_array_equal(got.numpy(), image.decode(path, size=32, layout="chw"))
    torch.testing.assert_close(torch.cat(fs), image.normalize(images), atol=1e-5, rtol=0)


def test_drop_last(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=5, size=16, drop_last=True)
    xs, _ = _collect(pipe)
    assert [x.shape[0] for x in xs] == [5, 5] and len(pipe) == 2


def test_train_is_shuffled_and_reproducible(tree: Path) -> None:
    a = image.folder(tree, batch_size=4, size=24, train=True, seed=3)
    b = image.folder(tree, batch_size=4, size=24, train=True, seed=3)
    xa0, ya0 = _collect(a)
    xb0, yb0 = _collect(b)
    assert all(torch.equal(p, q) for p, q in zip(xa0 + ya0, xb0 + yb0, strict=True))
    labels0 = torch.cat(ya0).tolist()
    assert sorted(labels0) == sorted(label for _, label in a.samples)
    xa1, ya1 = _collect(a)  # epoch 1: another order and other crops
    assert torch.cat(ya1).tolist() != labels0 or not torch.equal(torch.cat(xa1), torch.cat(xa0))
    a.set_epoch(0)
    xa2, ya2 = _collect(a)
    assert torch.equal(torch.cat(xa2), torch.cat(xa0)) and torch.cat(ya2).tolist() == labels0


def test_eval_keeps_listing_order_unless_asked(tree: Path) -> None:
    _, ys = _collect(image.folder(tree, batch_size=4, size=16))
    assert torch.cat(ys).tolist() == sorted(torch.cat(ys).tolist())
    _, shuffled = _collect(image.folder(tree, batch_size=12, size=16, shuffle=True, seed=1))
    assert torch.cat(shuffled).tolist() != torch.cat(ys).tolist()


def _add_bad_files(root: Path) -> list[str]:
    good = jpeg(96, 72, seed=99)
    bad = {
        root / "cat" / "truncated.jpg": good[: len(good) // 2],
        root / "dog" / "empty.jpg": b"",
        root / "ant" / "notes.jpg": b"not an image at all\n" * 10,
    }
    for path, data in bad.items():
        path.write_bytes(data)
    return sorted(p.name for p in bad)


def test_a_bad_file_fails_the_run_naming_it(tree: Path) -> None:
    (tree / "cat" / "truncated.jpg").write_bytes(jpeg(96, 72)[:500])
    pipe = image.folder(tree, batch_size=4, size=16)
    with pytest.raises(PipelineError) as info:
        _collect(pipe)
    errors = info.value.exceptions
    assert len(errors) == 1 and isinstance(errors[0], DecodeError)
    assert "truncated.jpg" in str(errors[0])


def test_bad_files_are_skipped_and_counted_under_max_failures(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = _add_bad_files(tree)
    pipe = image.folder(tree, batch_size=4, size=16, max_failures=3)
    with caplog.at_level(logging.WARNING, logger="asyncflow"):
        xs, ys = _collect(pipe)
    # 15 files in listing order: ant 000-002, notes (bad); cat 000-004, truncated (bad);
    # dog 000-003, empty (bad, sorted first): each batch keeps its own images, less the bad
    assert sum(len(y) for y in ys) == 12
    assert [x.shape[0] for x in xs] == [3, 4, 3, 2]
    failures = pipe.stats().failures
    assert sorted(re.findall(r"[\w.]+\.jpg", f.item)[-1] for f in failures) == names
    assert {f.error_type for f in failures} == {"DecodeError"}
    assert all(f.stage == "batch" for f in failures)
    # the batches hold exactly the good images, in listing order
    good = [p for p, _ in pipe.samples if Path(p).name not in names]
    for path, got in zip(good, torch.cat(xs), strict=True):
        want = image.decode(path, size=16, layout="chw", normalize=True)
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


def test_too_many_failures_still_fail(tree: Path) -> None:
    _add_bad_files(tree)
    with pytest.raises(PipelineError):
        _collect(image.folder(tree, batch_size=4, size=16, max_failures=2))


def test_break_leaves_nothing_running(tree: Path, leak_check: None) -> None:
    for _ in image.folder(tree, batch_size=2, size=16):
        break


async def test_async_for(tree: Path) -> None:
    n = 0
    async for x, _ in image.folder(tree, batch_size=4, size=16, decode_concurrency=1):
        n += x.shape[0]
    assert n == 12


def test_chaining_keeps_the_class_mapping(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=16).map(lambda b: b[1].sum())
    assert isinstance(pipe, image.ImageFolder) and pipe.classes == ["ant", "cat", "dog"]
    assert sum(int(s) for s in pipe) == 0 * 3 + 1 * 5 + 2 * 4


def test_device_cpu(tree: Path) -> None:
    xs, _ = _collect(image.folder(tree, batch_size=6, size=16, device="cpu"))
    assert xs[0].device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_cuda(tree: Path) -> None:
    xs, ys = _collect(image.folder(tree, batch_size=6, size=16, device="cuda"))
    assert xs[0].device.type == "cuda" and ys[0].device.type == "cuda"


def test_bad_trees_and_arguments(tmp_path: Path, tree: Path) -> None:
    with pytest.raises(SourceNotFound):
        image.folder(tmp_path / "nope", batch_size=2, size=16)
    (tmp_path / "one.jpg").write_bytes(jpeg(20, 20))  # issue 25.13: not "no such directory"
    with pytest.raises(ConfigError, match=r"one\.jpg: is a file, not a directory"):
        image.folder(tmp_path / "one.jpg", batch_size=2, size=16)
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(jpeg(20, 20))
    with pytest.raises(ConfigError, match="no class folders"):
        image.folder(tmp_path / "flat", batch_size=2, size=16)
    (tree / "empty_class").mkdir()
    with pytest.raises(ConfigError, match="empty_class"):
        image.folder(tree, batch_size=2, size=16)
    (tree / "empty_class").rmdir()
    for bad in ({"batch_size": 0}, {"size": -1}, {"decode_concurrency": 0},
                {"mean": (0.5, 0.5)}, {"std": (1.0, 1.0, 0.0)}, {"max_bytes": -1},
                {"max_bytes": "1MB"}, {"resize": 0}, {"resize": "256"},
                {"max_pixels": None}, {"max_pixels": 0}, {"seed": "abc"}, {"seed": 1.5},
                {"train": "no"}, {"normalize": 0}):
        kwargs = {"batch_size": 2, "size": 16, **bad}
        with pytest.raises(ConfigError):
            image.folder(tree, **kwargs)  # type: ignore[arg-type]


def test_other_extensions_are_ignored(tree: Path) -> None:
    (tree / "cat" / "readme.txt").write_text("hello")
    pipe = image.folder(tree, batch_size=4, size=16)
    assert not any(p.endswith(".txt") for p, _ in pipe.samples)


def test_one_extension_may_be_a_string_as_in_torchvision(tmp_path: Path) -> None:
    # torchvision's has_file_allowed_extension takes a str as one extension; a str taken
    # as a sequence would be its characters, and ".jpg" would list every name ending in g.
    for name in ("a.jpg", "b.JPG", "c.png", "d.svg", "e.jpeg"):
        (tmp_path / "cat" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "cat" / name).write_bytes(jpeg(8, 8))
    for extensions in (".jpg", ".JPG", (".jpg",)):
        _, samples = scan(tmp_path, extensions)
        assert [os.path.basename(p) for p, _ in samples] == ["a.jpg", "b.JPG"]


def test_train_crops_are_those_of_decode_with_seed_epoch_and_index(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=24, train=True, seed=5, normalize=False)
    xs, _ = _collect(pipe)
    got = {}
    for x in torch.cat(xs):  # match each output image to its file by content
        got[x.numpy().tobytes()] = True
    for index, (path, _) in enumerate(pipe.samples):
        want = image.decode(path, size=24, train=True, seed=5, epoch=0, index=index,
                            layout="chw")
        assert want.tobytes() in got


def test_describe_shows_the_batch_stage(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=16, workers="threads").map(lambda b: b)
    kinds = [(s["kind"], s["name"]) for s in pipe.describe()]
    assert kinds == [("source", "source"), ("map", "decode"), ("unbatch", "rows"),
                     ("assemble", "batch"), ("map", "map")]
    assert pipe.describe()[3]["batch_size"] == 4


def test_the_batch_stage_is_the_engine_s_assemble_stage(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=5, size=16, workers="threads", drop_last=True)
    assert type(pipe).describe is Pipeline.describe  # described natively, not patched
    spec = pipe.stages[-1]
    assert isinstance(spec, AssembleSpec)
    assert (spec.name, spec.batch_size, spec.drop_last) == ("batch", 5, True)
    entry = pipe.describe()[-1]
    assert (entry["kind"], entry["batch_size"], entry["drop_last"]) == ("assemble", 5, True)
    assert [len(y) for _, y in pipe] == [5, 5]  # 12 images, the last 2 dropped


def test_stages_added_after_it_are_named_alike_in_describe_and_stats(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=16, workers="threads")
    pipe = pipe.map(lambda b: b).map(lambda b: b)
    assert len(list(pipe)) == 3
    described = [(s["name"], s["kind"]) for s in pipe.describe()]
    assert described[-2:] == [("map", "map"), ("map#2", "map")]
    assert [(s.name, s.kind) for s in pipe.stats().stages] == described


def test_an_epoch_where_every_image_fails_is_an_error(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.jpg").write_bytes(b"not a picture")
    with pytest.raises(Exception, match="every one"):
        _collect(image.folder(tmp_path, batch_size=2, size=16, max_failures=1.0))


def test_a_directory_link_loop_is_walked_once(tmp_path: Path) -> None:
    root = tmp_path / "train"
    write_tree(root, {"cat": 1, "dog": 1})
    (root / "cat" / "again").symlink_to(root / "cat")  # a loop
    (root / "cat" / "up").symlink_to(root)  # a loop through the root
    (root / "dog" / "deeper").mkdir()
    (root / "dog" / "deeper" / "back").symlink_to(root / "dog")
    _, samples = scan(root)
    relative = sorted((os.path.relpath(p, root), label) for p, label in samples)
    # each folder once per class: cat's walk reaches dog's folder once, through 'up'
    assert relative == [("cat/000.jpg", 0), ("cat/up/dog/000.jpg", 0), ("dog/000.jpg", 1)]


def test_nested_folders_are_listed_in_torchvisions_order(tmp_path: Path) -> None:
    # torchvision lists ``sorted(os.walk(class_dir))``: by folder path, so "b-c" and "b.d"
    # ('-' and '.' sort before '/') come before "b"'s own sub-folder "b/x".
    root = tmp_path / "train"
    for sub in ("c/b", "c/b/x", "c/b-c", "c/b.d", "c/b.d/y"):
        (root / sub).mkdir(parents=True)
        (root / sub / "i.jpg").write_bytes(jpeg(8, 8))
    _, samples = scan(root)
    walked = [(p, 0) for d, _, names in sorted(os.walk(root / "c")) for p in
              (os.path.join(d, n) for n in sorted(names))]
    assert samples == walked
    assert [os.path.relpath(p, root) for p, _ in samples] == [
        "c/b/i.jpg", "c/b-c/i.jpg", "c/b.d/i.jpg", "c/b.d/y/i.jpg", "c/b/x/i.jpg"]


def test_an_unreadable_folder_under_a_class_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not chmod: the tests may run as root, who reads any folder. torchvision's walk skips
    # such a folder; a listing silently short of its pictures is what we refuse.
    root = tmp_path / "train"
    write_tree(root, {"cat": 2, "dog": 2})
    (root / "dog" / "more").mkdir()
    scandir = os.scandir

    def refusing(path: Any = ".") -> Any:
        if os.fspath(path) == str(root / "dog" / "more"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(SourcePermissionError, match=f"^{re.escape(str(root / 'dog' / 'more'))}: "):
        scan(root)


def test_a_linked_folder_outside_the_tree_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "train"
    write_tree(root, {"cat": 2})
    write_tree(tmp_path / "elsewhere", {"dog": 3})
    (root / "dog").symlink_to(tmp_path / "elsewhere" / "dog")
    classes, samples = scan(root)
    assert classes == ["cat", "dog"] and len(samples) == 5


def test_many_concurrent_iterations_lose_no_batch(tmp_path: Path) -> None:
    root = tmp_path / "train"
    write_tree(root, {"cat": 6, "dog": 6})
    pipe = image.folder(root, batch_size=2, size=16, workers="threads", decode_concurrency=1)
    iterators = [iter(pipe) for _ in range(6)]
    firsts = [next(it) for it in iterators]  # six iterations open at once
    counts = [len(f[1]) + sum(len(y) for _, y in it) for f, it in zip(firsts, iterators,
                                                                   strict=True)]
    assert counts == [12] * 6


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_decoders_never_wait_on_rows_they_hold(tmp_path: Path, workers: str) -> None:
    root = tmp_path / "train"
    write_tree(root, {"cat": 40, "dog": 40})
    pipe = image.folder(root, batch_size=2, size=8, workers=workers, decode_concurrency=1)
    assert sum(len(y) for _, y in pipe) == 80
    assert pipe._assembler.stalls == 0


def test_stats_count_images_and_hide_the_internal_stage(tree: Path) -> None:
    # 12 images in groups of 4 per decode hand-off: each stage counts images, not groups
    pipe = image.folder(tree, batch_size=4, size=16, workers="threads", decode_concurrency=2)
    assert sum(len(y) for _, y in pipe) == 12
    stats = pipe.stats()
    assert stats["source"].items_out == 12
    assert (stats["decode"].items_in, stats["decode"].items_out) == (12, 12)
    assert stats["decode"].chunks <= 12 // 4  # one call per group of images
    assert (stats["rows"].items_in, stats["rows"].items_out) == (12, 12)
    assert (stats["batch"].items_in, stats["batch"].items_out) == (12, 3)
    assert [s.name for s in stats.user_stages] == ["source", "decode", "batch"]
    assert stats["rows"].internal
    table = str(stats)
    assert not any(line.startswith("rows") for line in table.splitlines())
    assert "internal stages hidden: rows" in table
    full = stats.table(internal=True).splitlines()
    assert any(line.startswith("rows (internal)") for line in full)
    assert stats.bottleneck != "rows"


def test_a_slow_consumer_is_named_the_bottleneck(tree: Path) -> None:
    # The batch stage's output holds one batch by its bytes (the consumer's, lent, counts):
    # its fullness, not its item count, says that the consumer does not keep up.
    pipe = image.folder(tree, batch_size=1, size=16, workers="threads")
    for _ in pipe:
        # a training step: 4.8 s in all, so that a start slowed by a loaded machine (the
        # hand-off still filling) stays under the 20% of the run that find_bottleneck allows
        time.sleep(0.4)
    assert pipe.stats().bottleneck == "consumer"


def test_describe_and_stats_name_and_kind_each_stage_alike(tree: Path) -> None:
    pipe = image.folder(tree, batch_size=4, size=16, workers="threads")
    list(pipe)
    described = [(s["name"], s["kind"]) for s in pipe.describe()]
    assert [(s.name, s.kind) for s in pipe.stats().stages] == described
    assert pipe.stats()["batch"].kind == "assemble"


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_unreadable_kinds_of_file_are_named_failures_under_max_failures(
    tree: Path, leak_check: None, workers: str
) -> None:
    # issue 25.6: a link to /dev/zero once grew memory past 1.5 GB; a FIFO blocked forever
    (tree / "cat" / "odd.jpg").symlink_to("/dev/zero")
    os.mkfifo(tree / "dog" / "pipe.jpg")
    (tree / "ant" / "huge.jpg").write_bytes(jpeg(96, 72, seed=5) + b"\0" * 4000)
    pipe = image.folder(tree, batch_size=4, size=16, max_failures=3, max_bytes=4000,
                        workers=workers)
    _, ys = _collect(pipe)
    assert sum(len(y) for y in ys) == 12
    failures = {Path(re.findall(r"[\w./-]+\.jpg", f.item)[-1]).name: f
                for f in pipe.stats().failures}
    assert sorted(failures) == ["huge.jpg", "odd.jpg", "pipe.jpg"]
    assert {f.error_type for f in failures.values()} == {"SourceError"}
    assert "is a character device, not a regular file" in failures["odd.jpg"].message
    assert "is a FIFO" in failures["pipe.jpg"].message
    assert "over max_bytes=4,000" in failures["huge.jpg"].message


def test_a_link_to_dev_zero_fails_the_run_naming_it(tree: Path) -> None:
    (tree / "cat" / "odd.jpg").symlink_to("/dev/zero")
    with pytest.raises(PipelineError) as info:
        _collect(image.folder(tree, batch_size=4, size=16, workers="threads"))
    assert "odd.jpg: is a character device" in str(info.value.exceptions[0])
