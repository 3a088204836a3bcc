"""``image.folder``: a torchvision ImageFolder tree as a pipeline of normalized batches.

Built only on the engine's public API::

    Pipeline(listing in groups of 8)                 # _listing.py
        .map(decode each into its batch row, concurrency=cores, ordered=False)
        .unbatch()                                   # one message per image (internal)
        .assemble(BatchAssembler, batch_size=...)    # whole batches, in order (_slots.py)

The listing is a zero-argument callable, so each run (epoch) lists again: reshuffled by
``(seed, epoch)``, and each item carries its epoch and position, which fix its training crop
and the batch row it is decoded into (see ``_slots.py``). Decoding is unordered (no thread
waits for a slower neighbour), yet batches come out in order and hold exactly the images the
listing put in them, less any that failed: the engine's ``assemble`` stage tells the
:class:`BatchAssembler` of each decoded (or failed) row and puts out the batches it completes.

Decoders write uint8 rows; with ``normalize`` a batch becomes float32 only when the
``assemble`` stage releases it, in two NumPy passes (bit for bit what the kernel computes per
row, see ``_slots.py``). The buffers that rows are decoded into, in flight and in the pool, are
then 4x smaller than float batches: on 2 cores the process tree's memory fell from 0.79-0.82x
torch DataLoader's to 0.65-0.66x, at the same speed (docs/performance.md). The normalizing is
NumPy's, one thread: torch's thread pool would spin on the decoders' cores.

Memory is bounded where batches wait. The ``batch`` stage's output has a byte budget of one
batch, so that only the consumer's float batch and one made for it exist (two float buffers,
``_float_batches.py``); with worker processes the claim stage waits, as decode threads do,
while a row's batch is ``ahead`` past the oldest one not complete, so that a consumer that
lags holds no more slabs than that. On 2 cores: 0.45-0.49x torch DataLoader's.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, cast

import torch

from .._blob import check_max_bytes
from .._errors import ConfigTypeError, check_bool, check_budget, check_int
from ..pipeline import ItemGroup, Pipeline, Processes, feature, label_stage
from ..pipeline.seeding import fresh_seed
from ..ranks import Part, Split
from ._batch import IMAGENET_MEAN, IMAGENET_STD
from ._batch import normalize as normalize_batch
from ._config import check_arguments, decode_path, decode_workers, resolve_split
from ._decode import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS
from ._explain import FolderJournal
from ._geometry import target_size
from ._gpu import PendingAssembler, gpu_stage
from ._gpu_plan import PlanClaimed
from ._listing import Listing, Sample
from ._rows import Claimed, DecodeIntoSharedRow, Failed, SharedSlabs
from ._scan import IMG_EXTENSIONS, scan
from ._slots import Batch, BatchAssembler

#: Readers of the GPU path by default. Each reads, parses and proves a JPEG whole (its scan
#: data entropy-decoded at 1/8 scale, about half a CPU decode): on an H100 box, 4 fed the GPU
#: stage 2,320 images/s, so 8 keep ahead of a GPU training ResNet-50 (docs/performance.md).
GPU_READ_THREADS = 8

#: Where the CPU path normalizes: ``False`` (the default) when a batch is released, ``True``
#: in the decoders as each row is written (float32 rows; kept to compare the two).
_NORMALIZE_IN_KERNEL = False

__all__ = ["IMG_EXTENSIONS", "Failed", "ImageFolder", "Sample", "folder", "scan"]


class _ClaimThen:
    """The decode stage on threads (unordered): claim each item's batch row as the item is
    taken (waiting while its batch is more than ``ahead`` past the oldest open one), then
    hand it to ``work``, which decodes it into the row (``DecodeIntoSharedRow``) or plans it
    for the GPU (``PlanClaimed``).

    Failures are returned, not raised, so that the assembler hears of every row; the
    ``assemble`` stage counts them, one per image, against ``max_failures``.
    """

    def __init__(self, assembler: BatchAssembler,
                 work: Callable[[Iterable[Claimed]], ItemGroup]) -> None:
        self.assembler = assembler
        self.work = work
        self.__name__ = "decode"

    def __call__(self, items: list[Sample]) -> ItemGroup:
        claim = self.assembler.claim
        return self.work(Claimed(item.path, item.epoch, item.sample,
                                 *claim(item.run, item.pos, item.label)) for item in items)


class _ClaimRows:
    """The claim stage of worker processes (one thread, in listing order): give each item of
    a group its row's address (the slab and the row).

    An internal stage (see ``stats().table(internal=True)``): its time counts for ``decode``.
    """

    def __init__(self, assembler: BatchAssembler) -> None:
        self.assembler = assembler
        self.__name__ = "claim"
        self.asyncflow_inline = False  # it waits for older batches: never on the run's loop
        label_stage(self, internal=True)

    def __call__(self, items: list[Sample]) -> ItemGroup:
        claim = self.assembler.claim_shared
        return ItemGroup(Claimed(item.path, item.epoch, item.sample,
                                 *claim(item.run, item.pos, item.label, wait=True))
                         for item in items)


def _normalize_images(mean: tuple[float, ...], std: tuple[float, ...], batch: Batch) -> Batch:
    """``to_device``'s ``then`` (``mean`` and ``std`` bound): a batch's uint8 images
    normalized on the device they were copied to (one batched op; on CUDA, on the copy's side
    stream)."""
    images, labels = batch
    return normalize_batch(images, mean, std), labels


class ImageFolder(Pipeline[Batch], FolderJournal):
    """A :class:`~asyncflow.Pipeline` of ``(images, labels)`` tensor batches over an
    image-folder tree, with its class mapping.

    Its ``describe()`` and ``stats()`` name the stages alike: ``source``, ``decode``, the
    ``batch`` stage of kind ``assemble`` (with its ``batch_size`` and ``drop_last``), and the
    internal stages that the default stats table hides (``claim`` with processes, and
    ``rows``, which splits the decoders' groups into images).

    Attributes:
        root: The folder given.
        classes: Class names: the sorted sub-folder names.
        class_to_idx: Class name to label.
        samples: ``(path, label)`` for each image, in listing order (before shuffling):
            the whole tree, also with a ``split``.
        part: This rank's :class:`~asyncflow.sources.Split` part, or ``None`` without one.
        batch_size: Images per batch.
        drop_last: Whether a last, shorter batch is dropped.
    """

    root: str
    classes: list[str]
    class_to_idx: dict[str, int]
    samples: list[tuple[str, int]]
    part: Part | None
    batch_size: int
    drop_last: bool

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """As :meth:`~asyncflow.Pipeline.load_state_dict`; the next run lists the saved
        epoch again (same order, same crops), and its batches keep their boundaries: batch
        ``n`` holds the images at positions ``[n * batch_size, (n + 1) * batch_size)`` of the
        epoch's order not yet delivered (nor failed) before the interruption."""
        super().load_state_dict(state)

    def journal_begin(self) -> dict[str, Any] | None:
        """For a journal (:class:`~asyncflow.journal.Journaled`): start noting which batch is
        which; the run's configuration. ``None`` when stages after the batches make new ones."""
        names = [stage["name"] for stage in self.describe()[1:]]
        stages = list(zip(names, self.stages, strict=True))
        made = next(i for i, (_, spec) in enumerate(stages) if spec.traits.grouping == "batches")
        after = stages[made + 1:]  # after the stage that assembles the batches
        if "decoder" in self._decode_options and after and after[0][0] == "batch":
            after = after[1:]  # the GPU path's stage that makes the assembled batches
        # Each later stage must hand on the batches themselves, one for one, in order.
        if any(not (spec.traits.keeps_items and spec.items_per_output == 1)
               for _, spec in after):
            return None
        self._assembler.journaled = True  # each batch released carries its note
        return self.journal_config()

    def __len__(self) -> int:
        """Batches per epoch (before any skipped failures): this rank's, with a ``split``."""
        n = self._listing.count()
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
    decode: str = "auto",
    resize: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    extensions: Sequence[str] = IMG_EXTENSIONS,
    split: Split | None = None,
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
            :func:`asyncflow.image.normalize`, after a 4x smaller copy). Either way the
            decoders write uint8 rows: a whole batch is normalized when it is released, or,
            with a ``device``, on that device after its uint8 copy.
        mean, std: Per-channel statistics on a 0-1 scale (default: ImageNet's).
        shuffle: Reshuffle every epoch (default: ``train``).
        seed: Fixes the shuffle and the training crops (an int; default: a random seed,
            drawn once).
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
        device: Copy batches to this device (``"cuda"``) with ``pipe.to_device``, or, on the
            GPU path, make them there.
        decode: Where JPEGs are decoded. ``"auto"`` (default): on the GPU when ``device`` is
            a CUDA device and a GPU JPEG decoder imports (nvImageCodec, the
            ``asyncflow[gpu]`` extra, or torchvision), else on the CPU. ``"cuda"``: on the
            GPU, in batches (``ConfigError`` where that cannot be). ``"cpu"``: on the CPU.
            On the GPU path, threads read the files and settle each crop (the same boxes
            and flips as the CPU path), the GPU decodes, crops, resizes, flips and
            normalizes whole batches, and images the GPU decoder does not take (PNG, CMYK,
            progressive JPEGs, ...) are decoded by the CPU kernel where the files are read.
            ``decode_concurrency`` counts those readers (default: 8, or fewer CPUs) and
            ``workers`` says where they run, as on the CPU path ("auto": processes where
            they are safe, which keeps their Python off the training loop's GIL).
            ``stats().notes`` says which decoder runs, and why (docs/gpu.md).
        resize: Evaluation: shorter side before the centre crop (e.g. 256 for a 224 crop).
        max_pixels: Refuse images larger than this (decompression bombs).
        max_bytes: Refuse image files larger than this (default 256 MiB; ``None``: no
            limit); only regular files are read (not a FIFO or a link to ``/dev/zero``). Both
            are failures of the image, counted against ``max_failures``.
        extensions: File name endings that count as images (case-insensitive; a str: one).
        split: Read only this rank's share of the tree (an :class:`~asyncflow.Split`,
            resolved by this call: initialize ``torch.distributed`` first). Every rank draws
            the same order for each epoch (``seed`` then defaults to 0, not a random seed)
            and takes every ``world_size``-th image of it from its rank, so ranks read
            disjoint images and the same number of batches; ``remainder="pad"`` repeats the
            first images of the epoch's order, ``"drop"`` leaves out its last ones (see
            ``docs/distributed.md``).

    Returns:
        An :class:`ImageFolder` pipeline: iterate it (``for`` or ``async for``) once per
        epoch, or keep chaining stages onto it.

    Raises:
        SourceNotFound: ``root`` does not exist.
        ConfigError: An argument is invalid, or the tree holds no class or an empty class.
    """
    out_h, out_w = target_size(size)
    check_int("resize", resize, allow_none=True)  # else every image would fail on them
    check_int("max_pixels", max_pixels)
    threads = check_arguments(batch_size, mean, std, decode_concurrency)
    check_max_bytes(max_bytes)
    check_budget("max_failures", max_failures)  # before the tree is scanned
    check_bool("shuffle", shuffle, allow_none=True)
    check_bool("train", train)  # "no" would train
    check_bool("normalize", normalize)
    if seed is not None:  # an int, or a NumPy one: not 1.5 (truncated) nor "abc"
        try:
            seed = operator.index(seed)
        except TypeError:
            raise ConfigTypeError(f"seed must be an int or None, got {seed!r:.80}") from None
    gpu_device, gpu_decoder, decode_note = decode_path(decode, device)
    if gpu_device is not None:
        threads = decode_concurrency or min(threads, GPU_READ_THREADS)
    processes, note = decode_workers(workers, threads)
    part = resolve_split(split)
    classes, samples = scan(root, extensions)
    shuffled = train if shuffle is None else shuffle
    if seed is None:
        # With a split, every rank must draw the same order, as with a DistributedSampler.
        # Without shuffling or augmentation the seed changes nothing: keep it fixed, so that
        # an evaluation pipeline is the same in every process (and its cache is reused).
        seed = fresh_seed() if (shuffled or train) and part is None else 0
    seed = int(seed)
    # A decoder takes a group of items per hand-off: a process worker's hand-off (two pickles,
    # two pipe messages, a wake-up of the parent's loop) costs more than a thread's.
    group = min(16 if processes is not None else 8, batch_size)
    listing = Listing(samples, shuffled, seed, group=group, part=part)
    dtype = torch.float32 if normalize else torch.uint8
    # Rows stay uint8, and each batch is normalized as it is released (see the docstring),
    # or on the device it is copied to: the copy then moves 4x fewer bytes too.
    uint8_rows = normalize and gpu_device is None and not _NORMALIZE_IN_KERNEL
    on_device = (uint8_rows and device is not None
                 and feature("parse_device")(device).type != "cpu")
    at_release = uint8_rows and not on_device
    # Enough batches open for every decoder to have its groups in hand (4 per process).
    ahead = max(4, -(-(4 if processes else 2) * threads * group // batch_size))
    assembler: BatchAssembler = BatchAssembler(
        batch_size, out_h, out_w, listing.count(), torch.uint8 if on_device else dtype,
        drop_last=drop_last, ahead=ahead,
        slabs=SharedSlabs() if processes is not None else None,
        normalize=(tuple(mean), tuple(std)) if at_release else None,
    ) if gpu_device is None else PendingAssembler(batch_size, listing.count(),
                                                  drop_last=drop_last, ahead=ahead)
    options = {
        "size": (out_h, out_w), "train": train, "resize": resize, "max_pixels": max_pixels,
        "max_bytes": max_bytes,
        "normalize": normalize, "mean": tuple(mean), "std": tuple(std),
    }
    kernel = {**options, "normalize": False} if uint8_rows else options

    # For type checkers the ImageFolder yields batches from the start; the stages added below
    # (each a copy of the same class) are what turn the listing's groups into batches.
    notes = (f"stage 'decode' runs on {note}",) if note else ()
    pipe = ImageFolder(listing, name=f"image.folder({os.fspath(root)})",  # type: ignore[arg-type]
                       notes=(*notes, decode_note))
    pipe.root = os.fspath(root)
    pipe.classes = classes
    pipe.class_to_idx = {name: i for i, name in enumerate(classes)}
    pipe.samples = samples
    pipe.part = part
    pipe.batch_size = batch_size
    pipe.drop_last = drop_last
    pipe._listing = listing
    pipe._assembler = assembler
    pipe._seed = seed
    pipe._decode_options = options if gpu_decoder is None else {**options,
                                                                "decoder": gpu_decoder.name}
    work: Callable[[Iterable[Claimed]], ItemGroup] = (
        PlanClaimed(seed, {**options, "gray": getattr(gpu_decoder, "takes_gray", True)})
        if gpu_device is not None else
        DecodeIntoSharedRow(seed, kernel, (batch_size, 3, out_h, out_w),
                            str(assembler._np_dtype)))
    groups: Pipeline[Any] = pipe
    if processes is None:
        # One group per hand-off (buffer=2 x threads makes the chunks single groups): a
        # decoder holding many groups would claim rows beyond `ahead` and wait on itself.
        rows = groups.map(_ClaimThen(assembler, work), concurrency=threads, ordered=False,
                          name="decode", workers="threads", buffer=2 * threads)
    else:
        rows = (
            # Rows claimed and not yet released are bounded by these queues: the claim stage's
            # two groups, four per worker process in flight, two per worker decoded and
            # waiting, and the rows queue; about as many batches as `ahead` allows threads.
            groups.map(_ClaimRows(assembler), name="claim", buffer=2)
            .map(work, concurrency=threads, ordered=False, name="decode", workers=processes,
                 buffer=2 * threads)
        )
    # Decode errors come back as rows: the stage named "batch" counts them (max_failures).
    # Straight to the consumer, its output holds no batch while the consumer has one: one
    # waits, made, in the stage (two float batches in all: _float_batches.py).
    budget = (batch_size * (3 * out_h * out_w * dtype.itemsize + 8)  # images and labels
              if gpu_device is None and device is None else None)
    batches = rows.unbatch(name="rows").assemble(
        assembler, batch_size=batch_size, drop_last=drop_last,
        name="batch" if gpu_device is None else "gather", max_failures=max_failures,
        buffer_bytes=budget,
    )
    if gpu_device is not None:
        batches = batches.with_stage(gpu_stage(gpu_device, gpu_decoder, options, seed,
                                               assembler))  # type: ignore[arg-type]
        # The GPU stage's budget, for an image neither decoder could make (see _gpu.py).
        batches = batches.with_options(max_failures=max_failures)
    elif on_device:
        then = partial(_normalize_images, tuple(mean), tuple(std))
        batches = batches.to_device(device, then=then)
    elif device is not None:
        batches = batches.to_device(device)
    return cast(ImageFolder, batches)  # each stage method copied ``pipe``, class and all
