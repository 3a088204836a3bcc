"""``image.folder``'s GPU stage: whole batches of JPEGs decoded, cropped, resized, flipped and
normalized on the device, on a side CUDA stream.

The readers' rows are gathered by a :class:`PendingAssembler` (``image.folder``'s
:class:`~asyncflow.image._slots.BatchAssembler` over one-byte rows: the same claims, order,
resume and journal records). Each batch it releases (a :class:`Pending` batch: encoded JPEGs
with their crops, and rows the CPU already decoded) is made here, in one worker thread of the
run:

1. the side stream is synchronized with the host first: the decoders may be handed memory
   that the caching allocator freed on this stream (torchvision's nvJPEG writes on a stream of
   its own without waiting for ours; so does the hardware engine), and the previous batch's
   pictures (nvImageCodec's memory) are dropped only then;
2. the JPEGs are decoded in one batched call; if it fails, each half in turn (down to the
   pictures it refuses), and a picture the GPU decoder refuses (or decodes to another size
   than its header says; a gray one's single channel is repeated) is decoded by the CPU
   kernel instead, which gives the CPU path's row, or its named error (counted against
   ``max_failures``);
3. :func:`~asyncflow.image._resample.resample` crops, resizes and flips them all in a few
   batched kernels; the CPU rows are copied in; the batch is normalized or left uint8;
4. a CUDA event is recorded on the side stream.

In the consumer's thread, just before the batch is handed over, the consumer's current stream
waits for that event (on the device: the host never blocks) and the batch's tensors are
``record_stream``-ed on it, so that the caching allocator never gives their memory to the next
batch while the consumer's kernels may still read it. Batches are fresh tensors of one size
each time, so the allocator reuses the same blocks: device memory stays flat.

The decoder runs only as far ahead as the queue after this stage allows (two batches), so it
never starves the trainer by decoding unpaced.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from ..pipeline import CustomSpec, Span
from ._batch import _affine
from ._decode import decode
from ._gpu_decoders import GpuDecoder
from ._gpu_plan import Encoded, Payload, Planned
from ._resample import resample
from ._rows import Failed, Ticket
from ._slots import _NOTE, BatchAssembler

if TYPE_CHECKING:
    from ..pipeline import NodeContext, Receiver, Sender

__all__ = ["GpuBatch", "GpuDecodeNode", "Pending", "PendingAssembler", "gpu_stage"]

_log = logging.getLogger("asyncflow.image")
_NO_TICKET = Ticket(-1, -1, -1, -1)  # a row that failed after its batch was assembled


class Pending(NamedTuple):
    """A released batch, not yet decoded: its rows' payloads and labels, in row order."""

    rows: list[Payload]
    labels: torch.Tensor
    rows_at: list[int]  # each payload's row in its batch


class PendingAssembler(BatchAssembler):
    """:class:`BatchAssembler` bookkeeping for rows that are payloads, not pixels: batches
    are released in order, whole, as :class:`Pending` batches.

    A failed row stays in its batch as its :class:`~asyncflow.image._rows.Failed` record:
    the GPU stage, named ``"batch"`` as the CPU path's assembling stage is, counts it against
    ``max_failures`` with the rows that neither decoder could make, so that failures read
    alike on both paths. Its own buffers are one byte a row (the bookkeeping needs a row to
    claim).
    """

    def __init__(self, batch_size: int, count: int, *, drop_last: bool, ahead: int) -> None:
        super().__init__(batch_size, 1, 1, count, torch.uint8, drop_last=drop_last,
                         ahead=ahead, pool=max(4, ahead + 2))
        self._payloads: dict[tuple[int, int], dict[int, Payload]] = {}

    @staticmethod
    def failure(row: Any) -> Exception | None:
        return None  # counted by the GPU stage (see the class docstring)

    def release(self, row: Any, *, ok: bool = True) -> list[tuple[Any, list[int]]]:
        """As :meth:`BatchAssembler.release`, for the GPU path's rows (each a :class:`Planned`
        or a :class:`Failed`, as the readers return them): the payload is kept for its
        batch's :class:`Pending`."""
        ticket = row.ticket
        payload = row.payload if isinstance(row, Planned) else row
        with self._lock:
            state = self._runs.get(ticket.run)
            entry = None if state is None else state.open.get(ticket.number)
            if entry is not None and ticket.row not in entry.absent:
                rows = self._payloads.setdefault((ticket.run, ticket.number), {})
                rows[ticket.row] = payload
        return super().release(ticket, ok=ok)

    def _release(self, entry: Any) -> Any:
        with self._lock:
            payloads = self._payloads.pop(entry.key, {})
        gone = set(entry.failed) | set(entry.absent)
        keep = [r for r in range(entry.rows) if r not in gone and r in payloads]
        labels = torch.from_numpy(entry.labels[keep].copy())
        pending = Pending([payloads[r] for r in keep], labels, keep)
        return self._noted(entry, (pending, labels))  # type: ignore[arg-type]

    def renote(self, before: torch.Tensor, after: torch.Tensor, failed: list[tuple[int, str]],
               decoder: str) -> None:
        """The GPU stage made ``after`` (its labels) of the batch noted on ``before``: the
        note moves there, with the rows that failed on the way and the decoder."""
        noted = self.take_note(before)
        if noted is not None:
            run, number, earlier, absent = noted
            setattr(after, _NOTE, (run, number, sorted([*earlier, *failed]), absent, decoder))


@dataclass(eq=False)
class GpuBatch:
    """A batch whose kernels were queued on the side stream and may not have finished."""

    batch: tuple[torch.Tensor, torch.Tensor]
    event: Any  # torch.cuda.Event, or None on the CPU
    failures: list[tuple[int, Failed, Exception]]  # rows that failed (index, record, error)


class GpuDecodeNode:
    """The GPU stage of one run (see the module docstring)."""

    def __init__(self, ctx: NodeContext, *, device: torch.device, decoder: GpuDecoder,
                 options: dict[str, Any], seed: int, assembler: PendingAssembler | None) -> None:
        self.ctx = ctx
        self.assembler = assembler
        self.device = device
        self.decoder = decoder
        self.size = tuple(options["size"])
        self.normalize = bool(options["normalize"])
        self.options = {k: options[k]
                        for k in ("size", "train", "resize", "max_pixels", "max_bytes")}
        self.seed = seed
        # normalize()'s scale and offset (bit for bit the kernel's), read-only
        self.scale, self.offset = _affine(tuple(options["mean"]), tuple(options["std"]),
                                          torch.float32, device)
        self.stream = _side_stream(device) if device.type == "cuda" else None
        self.held: list[torch.Tensor] = []  # the last batch's pictures (see make)
        self.offered = self.refused = 0  # JPEGs given to the GPU decoder, and refused
        self._taken = 0  # batches read
        self._lock = threading.Lock()
        self._dropped: list[int] = []  # batches (input ordinals) every row of which failed
        ctx.add_receive_hook(self.receive)
        ctx.add_stop_callback(self.close)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        ctx = self.ctx
        while items := await inp.get_many(1):
            ctx.counters.items_in += len(items[0][1])
            made = await ctx.run_timed(self.make, items[0])
            del items
            ordinal, self._taken = self._taken, self._taken + 1
            for _, row, exc in made.failures:
                ctx.item_failed(row, exc)
            made.failures = []
            if len(made.batch[1]) == 0:  # every image failed: no batch, as on the CPU path
                with self._lock:
                    self._dropped.append(ordinal)
                continue
            await out.put(made)
            ctx.produced(len(made.batch[1]))
            del made

    def settled_inputs(self, outputs: Span) -> Span:
        """Batch ``n`` in is batch ``n`` out, less the batches every row of which failed
        (settled at once): the stage's position, for ``state_dict()``."""
        with self._lock:
            dropped = list(self._dropped)
        if not dropped:
            return outputs
        before = [d - k for k, d in enumerate(dropped)]  # outputs made before each drop

        def made(output: int) -> int:  # the input ordinal of an output ordinal
            return output + bisect.bisect_right(before, output)

        ranges = [(made(a), made(b - 1) + 1) for a, b in outputs.ranges]
        # the dropped inputs are settled too (the span absorbs those that reach its mark)
        return Span.of(made(outputs.mark) if outputs.mark else 0, dropped, ranges)

    def make(self, item: tuple[Pending, torch.Tensor]) -> GpuBatch:
        """Decode one pending batch (a worker thread's job)."""
        pending = item[0]
        scope = torch.cuda.stream(self.stream) if self.stream is not None else None
        with scope if scope is not None else contextlib.nullcontext():
            if self.stream is not None:
                self.stream.synchronize()
            self.held = []
            failures: list[tuple[int, Failed, Exception]] = []
            images, keep = self._rows(pending, failures)
            labels = pending.labels[keep] if len(keep) < len(pending.rows) else pending.labels
            if self.stream is not None:  # pinned: the copy never makes this thread wait
                labels = labels.pin_memory()
            batch = (images, labels.to(self.device, non_blocking=True))
            if self.assembler is not None and self.assembler.journaled:
                # every row not kept failed, in row order
                self.assembler.renote(item[1], batch[1], [
                    (pending.rows_at[i], f"{type(exc).__name__}: {exc}")
                    for i, _, exc in failures], self.decoder.name)
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(self.stream)
        return GpuBatch(batch, event, failures)

    def receive(self, item: Any) -> Any:
        """Consumer's thread: its stream waits for the batch; the batch is then handed over."""
        if not isinstance(item, GpuBatch):
            return item
        if item.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(item.event)
            for tensor in item.batch:
                tensor.record_stream(stream)
        return item.batch

    def close(self) -> None:
        """Wait for the side stream's work and drop the pictures held for it; say how many
        JPEGs the GPU decoder refused, if any (each cost this stage a CPU decode). Idempotent."""
        if self.stream is not None:
            self.stream.synchronize()
        self.held = []
        if self.refused:
            _log.warning("the GPU decoder (%s) refused %d of %d JPEGs this run; the CPU kernel "
                         "decoded them in the GPU stage, a CPU decode each", self.decoder.name,
                         self.refused, self.offered)
            self.offered = self.refused = 0

    def _rows(
        self, pending: Pending, failures: list[tuple[int, Failed, Exception]]
    ) -> tuple[torch.Tensor, list[int]]:
        n, (height, width) = len(pending.rows), self.size
        pictures = self._decode(pending)
        self.held = list(pictures.values())
        cpu_rows: dict[int, np.ndarray] = {}
        for i, row in enumerate(pending.rows):
            if i in pictures:
                continue
            if isinstance(row, Encoded):  # refused by the GPU decoder: the CPU kernel's turn
                row = self._on_cpu(row)
            if isinstance(row, Failed):
                failures.append((i, row, row.error))
            else:
                cpu_rows[i] = row
        done = sorted(pictures)
        values = resample([pictures[i] for i in done],
                          [pending.rows[i].place for i in done],  # type: ignore[union-attr]
                          (height, width), layout=self.decoder.layout) if done else None
        if values is not None and len(done) == n:  # every row from the GPU: no scatter
            return self._finish(values), list(range(n))
        dtype = torch.float32 if self.normalize else torch.uint8
        out = torch.empty((n, 3, height, width), dtype=dtype, device=self.device)
        if values is not None:
            out[torch.tensor(done, dtype=torch.long, device=self.device)] = self._finish(values)
        if cpu_rows:
            at = sorted(cpu_rows)
            host = torch.from_numpy(np.stack([cpu_rows[i] for i in at]))
            values = host.to(self.device, non_blocking=False).to(torch.float32)
            out[torch.tensor(at, dtype=torch.long, device=self.device)] = self._finish(values)
        keep = sorted([*done, *cpu_rows])
        if len(keep) < n:
            out = out[torch.tensor(keep, dtype=torch.long, device=self.device)]
        return out, keep

    def _finish(self, values: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            return values.mul_(self.scale).add_(self.offset)
        return values.to(torch.uint8)

    def _decode(self, pending: Pending) -> dict[int, torch.Tensor]:
        """The pictures the GPU decoded, by row: those of the size their plans expect (a
        one-channel picture, from a gray JPEG, repeated into three as PIL's ``convert``)."""
        gpu = [(i, row) for i, row in enumerate(pending.rows) if isinstance(row, Encoded)]
        if not gpu:
            return {}
        decoded = self._decoded([row.data for _, row in gpu])
        rgb = [(i, _as_rgb(picture, row, self.decoder.layout))
               for (i, row), picture in zip(gpu, decoded, strict=True)]
        pictures = {i: picture for i, picture in rgb if picture is not None}
        self.offered += len(gpu)
        self.refused += len(gpu) - len(pictures)
        return pictures

    def _decoded(self, data: list[bytearray]) -> list[torch.Tensor | None]:
        """Each JPEG decoded, ``None`` where the decoder refuses it: all in one call, and if
        that call fails, each half in turn, so that one refused picture costs about
        ``2 log2(n)`` calls, not ``n`` calls of one picture each."""
        try:
            return list(self.decoder.decode(data))
        except Exception:
            if len(data) == 1:
                return [None]
        half = len(data) // 2
        return self._decoded(data[:half]) + self._decoded(data[half:])

    def _on_cpu(self, row: Encoded) -> np.ndarray | Failed:
        """A row the GPU decoder did not make, from the CPU kernel (or its named error)."""
        try:
            return decode(bytes(row.data), layout="chw", seed=self.seed, epoch=row.epoch,
                          index=row.item, name=row.name, **self.options)
        except Exception as exc:
            return Failed(row.name, exc, _NO_TICKET)


_STREAMS: dict[torch.device, Any] = {}
_STREAMS_LOCK = threading.Lock()


def _side_stream(device: torch.device) -> Any:
    """One side stream per device for the whole process: the caching allocator keeps freed
    blocks per stream, so a new stream for each run (epoch) would keep claiming new memory.
    High priority: the decode's short kernels go before the training step's queue."""
    with _STREAMS_LOCK:
        stream = _STREAMS.get(device)
        if stream is None:
            stream = _STREAMS[device] = torch.cuda.Stream(  # type: ignore[no-untyped-call]
                device=device, priority=-1)
        return stream


def _as_rgb(picture: torch.Tensor | None, row: Encoded, layout: str) -> torch.Tensor | None:
    """``picture`` as three channels of its plan's size, or ``None`` if it is not one (or
    the decoder refused it)."""
    height, width = row.place.height, row.place.width
    if picture is None or picture.dtype != torch.uint8:
        return None
    shape = tuple(picture.shape)
    rgb, gray = ((3, height, width), (1, height, width)) if layout == "chw" else (
        (height, width, 3), (height, width, 1))
    if shape == rgb:
        return picture
    if shape == gray:
        return picture.expand(rgb).contiguous()
    return None


def gpu_stage(device: torch.device, decoder: GpuDecoder, options: dict[str, Any],
              seed: int, assembler: PendingAssembler | None) -> CustomSpec:
    """The spec of ``image.folder``'s GPU stage: named ``"batch"``, as the CPU path's stage
    that hands out batches and counts failed images."""

    def factory(ctx: NodeContext) -> GpuDecodeNode:
        return GpuDecodeNode(ctx, device=device, decoder=decoder, options=options, seed=seed,
                             assembler=assembler)

    return CustomSpec(
        label="batch", factory=factory, concurrency=1, buffer=2, terminal=True,
        options={"device": str(device), "decoder": decoder.name},
    )
