"""``image.folder``: a torchvision ImageFolder tree as a pipeline of normalized batches.

Built only on the engine's public API::

    Pipeline(listing in groups of 8)
        .map(decode each into its batch row, concurrency=cores, ordered=False)
        .unbatch()                                   # one message per image
        .flat_map(release whole batches in order)    # on the loop; counts failures

The listing is a zero-argument callable, so each run (epoch) lists again: reshuffled by
``(seed, epoch)``, and each item carries its epoch and position, which fix its training crop
and the batch row it is decoded into (see ``_slots.py``). Decoding is unordered (no thread
waits for a slower neighbour), yet batches come out in order and hold exactly the images the
listing put in them, less any that failed.

Normalizing happens in the decode threads, as each image is written into a float32 batch
(see ``_modes.write_rgb``), not in a batch-level stage: it is as cheap per image, runs in
parallel instead of in one stage's thread, and keeps torch's own thread pool from competing
with the decode threads for the cores.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from .._errors import ConfigError, SourceNotFound
from ..pipeline import ItemGroup, Pipeline, Processes, choose_workers, label_stage, usable_cpus
from ._batch import IMAGENET_MEAN, IMAGENET_STD
from ._decode import DEFAULT_MAX_PIXELS, decode
from ._geometry import target_size
from ._rows import DecodeIntoSharedRow, Failed, Ticket
from ._shared import ClaimRows, SharedSlabs
from ._slots import Batch, BatchAssembler

__all__ = ["IMG_EXTENSIONS", "Failed", "ImageFolder", "Sample", "folder", "scan"]

#: The file extensions torchvision's ImageFolder accepts (compared case-insensitively).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class Sample(NamedTuple):
    """One item of an epoch's listing (its repr names the file, for failure reports)."""

    path: str
    label: int
    epoch: int
    pos: int  # position in this epoch's order: fixes the batch row
    run: int  # which listing (one per run): keeps concurrent runs' buffers apart
    sample: int  # index in ``samples``: with the seed and epoch, fixes the training crop


def scan(
    root: str | os.PathLike[str], extensions: Sequence[str] = IMG_EXTENSIONS
) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted sub-folder names) and ``(path, class index)`` samples, as torchvision.

    Raises:
        SourceNotFound: ``root`` is not a directory.
        ConfigError: ``root`` has no class folder, or a class folder has no image file.
    """
    base = Path(root)
    if not base.is_dir():
        raise SourceNotFound(f"{os.fspath(root)}: no such directory")
    classes = sorted(entry.name for entry in os.scandir(base) if entry.is_dir())
    if not classes:
        raise ConfigError(f"{os.fspath(root)}: no class folders (expected root/<class>/<image>)")
    exts = tuple(e.lower() for e in extensions)
    samples: list[tuple[str, int]] = []
    empty = []
    for idx, name in enumerate(classes):
        found = 0
        seen: set[tuple[int, int]] = set()  # (device, inode) of each folder walked
        for dirpath, dirnames, filenames in os.walk(base / name, followlinks=True):
            # Links are followed (as torchvision does), but each folder is walked once: a
            # link back up the tree would otherwise loop until the path is too long.
            here = os.stat(dirpath)
            if (here.st_dev, here.st_ino) in seen:
                dirnames.clear()
                continue
            seen.add((here.st_dev, here.st_ino))
            dirnames.sort()
            for fname in sorted(filenames):
                if fname.lower().endswith(exts):
                    samples.append((os.path.join(dirpath, fname), idx))
                    found += 1
        if not found:
            empty.append(name)
    if empty:
        raise ConfigError(
            f"{os.fspath(root)}: no image file ({', '.join(exts)}) in class folder(s) "
            f"{', '.join(repr(e) for e in empty[:5])}{' ...' if len(empty) > 5 else ''}"
        )
    return classes, samples


def _usable_cpus() -> int:
    return usable_cpus()


def _decode_workers(workers: Any, count: int) -> tuple[Processes | None, str | None]:
    """Processes (persistent: they belong to the pipeline) or threads, and why if chosen."""
    if workers == "threads":
        return None, None
    if workers == "auto":
        chosen, note = choose_workers(DecodeIntoSharedRow(0, {}, (1,), "uint8"), count,
                                      stage="decode")
        if chosen is None:
            return None, note
        return replace(chosen, persistent=True), note
    if workers == "processes":
        workers = Processes(persistent=True)
    if not isinstance(workers, Processes):
        raise ConfigError(
            f"workers must be 'auto', 'threads', 'processes' or an asyncflow.Processes, got "
            f"{workers!r:.80}"
        )
    return workers, None


class _Listing:
    """The pipeline's source: each call lists one epoch (shuffled by seed and epoch), in
    groups of ``group`` samples: a decode thread takes a group at a time, so that it goes
    back to the run's loop for more work once per group rather than once per image."""

    def __init__(
        self, samples: list[tuple[str, int]], shuffle: bool, seed: int, group: int
    ) -> None:
        self.samples = samples
        self.shuffle = shuffle
        self.seed = seed
        self.group = group
        self._lock = threading.Lock()
        self._next_epoch = 0
        self._runs = 0

    def set_epoch(self, epoch: int) -> None:
        with self._lock:
            self._next_epoch = epoch

    def __call__(self) -> Iterator[ItemGroup]:
        with self._lock:
            epoch, run = self._next_epoch, self._runs
            self._next_epoch += 1
            self._runs += 1
        return self._items(epoch, run)

    def _items(self, epoch: int, run: int) -> Iterator[ItemGroup]:
        order: Iterable[Any] = range(len(self.samples))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.samples))
        # Groups: stats count the images in them, not the groups.
        group = ItemGroup()
        for pos, i in enumerate(order):
            path, label = self.samples[int(i)]
            group.append(Sample(path, label, epoch, pos, run, int(i)))
            if len(group) == self.group:
                yield group
                group = ItemGroup()
        if group:
            yield group


class _DecodeIntoRow:
    """The decode stage (worker threads, unordered): decode a group of items, each straight
    into its batch row.

    Failures are returned, not raised, so that the assembler hears of every row; the batch
    stage raises them, one per image, where they count against ``max_failures``.
    """

    def __init__(self, assembler: BatchAssembler, seed: int, options: dict[str, Any]) -> None:
        self.assembler = assembler
        self.seed = seed
        self.options = options
        self.__name__ = "decode"

    def __call__(self, items: list[Sample]) -> ItemGroup:
        return ItemGroup(self._one(item) for item in items)

    def _one(self, item: Sample) -> Ticket | Failed:
        ticket, out = self.assembler.claim(item.run, item.pos, item.label)
        try:
            decode(
                item.path, out=out, layout="chw", seed=self.seed,
                epoch=item.epoch, index=item.sample, **self.options,
            )
        except Exception as exc:
            return Failed(item.path, exc, ticket)
        return ticket


class _Assemble:
    """The batch stage (on the run's loop, in arrival order): whole batches, in batch order.

    An async generator per decoded row: it yields the batches that row completes, then, for
    a failed row, raises the decode error, which the engine counts as that row's failure.
    Its kind in ``stats()`` is ``"assemble"``, as in ``describe()``.
    """

    def __init__(self, assembler: BatchAssembler) -> None:
        self.assembler = assembler
        self.__name__ = "batch"
        label_stage(self, kind="assemble")

    async def __call__(self, row: Ticket | Failed) -> AsyncIterator[Batch]:
        failed = isinstance(row, Failed)
        ticket = row.ticket if isinstance(row, Failed) else row
        for batch in self.assembler.arrived(ticket, ok=not failed):
            yield batch
        if isinstance(row, Failed):
            raise row.error


class ImageFolder(Pipeline[Batch]):
    """A :class:`~asyncflow.Pipeline` of ``(images, labels)`` tensor batches over an
    image-folder tree, with its class mapping.

    Attributes:
        root: The folder given.
        classes: Class names: the sorted sub-folder names.
        class_to_idx: Class name to label.
        samples: ``(path, label)`` for each image, in listing order (before shuffling).
    """

    root: str
    classes: list[str]
    class_to_idx: dict[str, int]
    samples: list[tuple[str, int]]
    batch_size: int
    drop_last: bool
    _listing: _Listing
    _assembler: BatchAssembler
    _batch_stage: int

    def describe(self) -> list[dict[str, Any]]:
        """As :meth:`Pipeline.describe`, with the stage that releases batches shown as such.

        Names and kinds are those of ``stats()``, whose default table hides the internal
        stages (``claim`` with processes, and ``rows``, which splits the decoders' groups
        into images); ``stats().table(internal=True)`` lists them.

        That stage is a ``flat_map`` for the engine (one decoded row in, the batches it
        completes out); described as ``"assemble"`` with its ``batch_size``, so that tools
        reading descriptions (``.cache()``) see batches of that size come out of it.
        """
        out = super().describe()
        if self._batch_stage < len(out):
            out[self._batch_stage] = {
                **out[self._batch_stage], "kind": "assemble", "batch_size": self.batch_size,
                "drop_last": self.drop_last,
            }
        return out

    def set_epoch(self, epoch: int) -> None:
        """Number the next run ``epoch`` (its shuffle and crops); later runs count on from it."""
        self._listing.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches per epoch (before any skipped failures)."""
        n = len(self.samples)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def folder(
    root: str | os.PathLike[str],
    *,
    batch_size: int,
    size: int | tuple[int, int],
    train: bool = False,
    normalize: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    shuffle: bool | None = None,
    seed: int | None = None,
    drop_last: bool = False,
    max_failures: int | float = 0,
    decode_concurrency: int | None = None,
    workers: str | Processes = "auto",
    device: Any = None,
    resize: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    extensions: Sequence[str] = IMG_EXTENSIONS,
) -> ImageFolder:
    """Batches of ``(images, labels)`` from ``root/<class>/<image>``, as torchvision's ImageFolder.

    Args:
        root: The folder: one sub-folder per class (sorted names give labels 0, 1, ...).
        batch_size: Images per batch.
        size: Output size (an int: square; or ``(height, width)``).
        train: ``False``: resize the shorter side (to ``resize``, default ``size``) and crop the
            centre. ``True``: random-resized-crop and horizontal flip, fixed by ``seed``, the
            epoch and the item.
        normalize: ``True``: float32 ``N x 3 x H x W``, ``(x / 255 - mean) / std``. ``False``:
            the uint8 ``N x 3 x H x W`` batch, to normalize later (for example on the GPU with
            :func:`asyncflow.image.normalize`, after a 4x smaller copy).
        mean, std: Per-channel statistics on a 0-1 scale (default: ImageNet's).
        shuffle: Reshuffle every epoch (default: ``train``).
        seed: Fixes the shuffle and the training crops (default: a random seed, drawn once).
        drop_last: Drop a last batch smaller than ``batch_size``.
        max_failures: Images that may fail to decode (an int, or a fraction) before the run
            fails; they are skipped, counted and listed in ``pipe.stats().failures`` (under
            the stage named ``"batch"``, which assembles batches and reports decode errors).
            A batch that lost images is shorter; the batches after it are not affected.
        decode_concurrency: How many decoders, threads or processes (default: the CPUs
            this process may use).
        workers: ``"auto"`` (default): worker processes where they are safe (see
            :meth:`~asyncflow.Pipeline.map`), threads otherwise; ``pipe.stats().notes`` says
            which, and why. ``"processes"``: persistent worker processes that decode
            straight into shared-memory batch buffers (only slot numbers cross processes;
            the batches are bit for bit those of threads). ``"threads"``: decoding threads
            (PIL releases the GIL while decoding, but not for all of the work: on many cores,
            or beside a training loop's own Python, processes go faster). An
            :class:`~asyncflow.Processes` sets the start method or the init hook.
        device: Copy batches to this device (``"cuda"``) with ``pipe.to_device``.
        resize: Evaluation: shorter side before the centre crop (e.g. 256 for a 224 crop).
        max_pixels: Refuse images larger than this (decompression bombs).
        extensions: File name endings that count as images.

    Returns:
        An :class:`ImageFolder` pipeline: iterate it (``for`` or ``async for``) once per
        epoch, or keep chaining stages onto it.

    Raises:
        SourceNotFound: ``root`` does not exist.
        ConfigError: An argument is invalid, or the tree holds no class or an empty class.
    """
    out_h, out_w = target_size(size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
        raise ConfigError(f"mean and std need 3 values (std > 0), got {tuple(mean)}, {tuple(std)}")
    if decode_concurrency is not None and (
        isinstance(decode_concurrency, bool)
        or not isinstance(decode_concurrency, int)
        or decode_concurrency < 1
    ):
        raise ConfigError(f"decode_concurrency must be an int >= 1, got {decode_concurrency!r}")
    threads = decode_concurrency or _usable_cpus()
    processes, note = _decode_workers(workers, threads)
    classes, samples = scan(root, extensions)
    shuffled = train if shuffle is None else bool(shuffle)
    if seed is None:
        # Without shuffling or augmentation the seed changes nothing: keep it fixed, so that
        # an evaluation pipeline is the same in every process (and its cache is reused).
        seed = secrets.randbits(63) if (shuffled or train) else 0
    seed = int(seed)
    # A decoder takes a group of items per hand-off: a process worker's hand-off (two pickles,
    # two pipe messages, a wake-up of the parent's loop) costs more than a thread's.
    group = min(16 if processes is not None else 8, batch_size)
    listing = _Listing(samples, shuffled, seed, group=group)
    dtype = torch.float32 if normalize else torch.uint8
    assembler = BatchAssembler(
        batch_size, out_h, out_w, len(samples), dtype, drop_last=drop_last,
        # Enough batches open for every decoder to have its groups in hand (4 per process).
        ahead=max(4, -(-(4 if processes else 2) * threads * group // batch_size)),
        slabs=SharedSlabs() if processes is not None else None,
    )
    options = {
        "size": (out_h, out_w), "train": train, "resize": resize, "max_pixels": max_pixels,
        "normalize": normalize, "mean": tuple(mean), "std": tuple(std),
    }

    # For type checkers the ImageFolder yields batches from the start; the stages added below
    # (each a copy of the same class) are what turn the listing's groups into batches.
    pipe = ImageFolder(listing, name=f"image.folder({os.fspath(root)})",  # type: ignore[arg-type]
                       notes=(f"stage 'decode' runs on {note}",) if note else ())
    pipe.root = os.fspath(root)
    pipe.classes = classes
    pipe.class_to_idx = {name: i for i, name in enumerate(classes)}
    pipe.samples = samples
    pipe.batch_size = batch_size
    pipe.drop_last = drop_last
    pipe._listing = listing
    pipe._assembler = assembler
    groups: Pipeline[Any] = pipe
    if processes is None:
        pipe._batch_stage = 3  # describe(): the source, decode, rows, then this stage
        # One group per hand-off (buffer=2 x threads makes the chunks single groups): a
        # decoder holding many groups would claim rows beyond `ahead` and wait on itself.
        rows = groups.map(_DecodeIntoRow(assembler, seed, options), concurrency=threads,
                          ordered=False, name="decode", workers="threads", buffer=2 * threads)
    else:
        pipe._batch_stage = 4  # the source, claim, decode, rows, then this stage
        decoder = DecodeIntoSharedRow(seed, options, (batch_size, 3, out_h, out_w),
                                      str(assembler._np_dtype))
        rows = (
            # Rows claimed and not yet released are bounded by these queues: the claim stage's
            # two groups, four per worker process in flight, two per worker decoded and
            # waiting, and the rows queue; about as many batches as `ahead` allows threads.
            groups.map(ClaimRows(assembler), name="claim", buffer=2)
            .map(decoder, concurrency=threads, ordered=False, name="decode", workers=processes,
                 buffer=2 * threads)
        )
    batches = (
        rows.unbatch(name="rows")
        .flat_map(_Assemble(assembler), name="batch", max_failures=max_failures)
    )
    if device is not None:
        batches = batches.to_device(device)
    return cast(ImageFolder, batches)  # each stage method copied ``pipe``, class and all
