"""Host-to-device copies that overlap compute: pinned staging, a side stream, and events.

For each batch, in a worker thread of the pipeline:

1. its CPU tensors are copied into one pinned buffer from a bounded :class:`PinnedPool`
   (tensors already pinned are read in place);
2. each is copied to the device with ``non_blocking=True`` on a dedicated side CUDA stream,
   and a CUDA event is recorded there;
3. the buffer goes back to the pool with that event, to be reused once the copy is done.

A ``then`` function runs on the copied batch on the side stream before the event, in the same
worker thread: work on the device that belongs to the transfer (``image.folder`` copies uint8
batches, 4x fewer bytes, and normalizes them there).

In the consumer's thread, just before the batch is handed over, the consumer's current stream
waits on the event (a device-side wait: the host does not block) and every copied tensor is
``record_stream``-ed on it, so the caching allocator does not reuse its memory while kernels
queued on the consumer's stream may still read it. The pool is freed when the run stops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from .. import _tree
from .._errors import ConfigError, check_int
from ..pipeline import CustomSpec
from ._pinned import PinnedPool, align

if TYPE_CHECKING:
    from ..pipeline import NodeContext, Pipeline, Receiver, Sender

P = TypeVar("P", bound="Pipeline")

__all__ = ["DeviceTransfer", "InFlight", "flatten", "parse_device", "resolve_device", "to_device"]

DEFAULT_POOL_SIZE = 4

Then = Callable[[Any], Any]


def parse_device(device: str | int | torch.device) -> torch.device:
    """``device`` (``"cuda"``, ``"cuda:1"``, ``1``, a ``torch.device``) as a ``torch.device``,
    not yet checked against this machine: the one parser of a device argument (``image``
    reaches it as the feature ``"parse_device"``).

    Raises:
        ConfigError: ``device`` is malformed (the message names it).
    """
    try:
        return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"not a device: {device!r:.80} ({exc})") from None


def resolve_device(device: str | int | torch.device) -> torch.device:
    """The ``torch.device`` for ``device``, checked against what this machine has (a bare
    ``"cuda"`` gets the current CUDA device's index).

    Raises:
        ConfigError: The device string is malformed, or names CUDA where there is none or an
            index this machine lacks.
    """
    dev = parse_device(device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {str(dev)!r} asked for, but CUDA is not available here "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})"
        )
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device {str(dev)!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def flatten(batch: Any) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Any]]:
    """The tensors of ``batch`` in a fixed order, and a function that rebuilds it from new ones.

    A batch is a tensor, or a dict / list / tuple / namedtuple nesting them (each keeps its
    type where its constructor allows it); anything else (ints, strings, NumPy arrays,
    ``None``) is carried through untouched. The walking is ``asyncflow/_tree.py``'s.
    """
    tree, leaves = _tree.flatten(batch, is_leaf=lambda value: isinstance(value, torch.Tensor))
    return leaves, tree.unflatten


def _needs_staging(tensor: torch.Tensor) -> bool:
    # Sparse and quantized tensors cannot be viewed into a byte buffer; they copy directly.
    return (
        tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.is_quantized
        and not tensor.is_pinned()
    )


@dataclass(eq=False)
class InFlight:
    """A batch whose copies were queued on the side stream but may not have finished."""

    batch: Any
    copies: list[torch.Tensor]
    event: Any  # torch.cuda.Event
    keep_alive: list[torch.Tensor]


class DeviceTransfer:
    """The copy machinery for one pipeline run to one CUDA device.

    :meth:`send` runs in worker threads, :meth:`receive` in the consumer's thread, and
    :meth:`close` once when the run stops.

    Args:
        device: A CUDA device (see :func:`resolve_device`).
        non_blocking: Queue the copies asynchronously. ``False`` waits for each batch's
            copies in the worker thread (the consumer still never waits on the host).
        pool_size: Pinned buffers in the pool, hence batches that may be in flight at once.
        then: Applied to each copied batch on the side stream, before its event is recorded
            (the consumer gets its result).
    """

    def __init__(
        self,
        device: torch.device,
        *,
        non_blocking: bool = True,
        pool_size: int = DEFAULT_POOL_SIZE,
        then: Then | None = None,
    ) -> None:
        self.device = device
        self.non_blocking = non_blocking
        self.then = then
        self.pool = PinnedPool(pool_size)
        self.stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]

    def send(self, batch: Any) -> InFlight:
        """Stage ``batch`` and queue its copies on the side stream (a worker thread's job)."""
        leaves, rebuild = flatten(batch)
        staged = [_needs_staging(t) for t in leaves]
        nbytes = sum(
            align(t.numel() * t.element_size())
            for t, s in zip(leaves, staged, strict=True)
            if s
        )
        buf = self.pool.acquire(nbytes) if any(staged) else None
        try:
            sources = self._stage(leaves, staged, buf)
            with torch.cuda.stream(self.stream):
                copies = [
                    s.to(self.device, non_blocking=self.non_blocking) if s.device != self.device
                    else s
                    for s in sources
                ]
                result = None if self.then is None else self.then(rebuild(copies))
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(self.stream)
        except BaseException:
            if buf is not None:
                self.stream.synchronize()
                self.pool.release(buf)
            raise
        if buf is not None:
            self.pool.release_after(buf, event)
        if not self.non_blocking:
            event.synchronize()
        moved = [c for c, s in zip(copies, sources, strict=True) if c is not s]
        keep = [s for s, was_staged in zip(sources, staged, strict=True) if not was_staged]
        if self.then is not None:
            # Made on the side stream: the consumer's stream must hold them too, not the
            # copies (freed here, used by the side stream alone).
            made = [t for t in flatten(result)[0] if t.device == self.device]
            return InFlight(result, made, event, [*keep, *copies])
        return InFlight(rebuild(copies), moved, event, keep)

    def receive(self, item: Any) -> Any:
        """Make the consumer's current stream wait for ``item``'s copies; return the batch."""
        if not isinstance(item, InFlight):
            return item
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(item.event)
        for tensor in item.copies:
            tensor.record_stream(stream)
        return item.batch

    def close(self) -> None:
        """Wait for queued copies and free the pinned buffers. Idempotent."""
        self.pool.close()

    @staticmethod
    @torch.no_grad()
    def _stage(
        leaves: list[torch.Tensor], staged: list[bool], buf: torch.Tensor | None
    ) -> list[torch.Tensor]:
        sources: list[torch.Tensor] = []
        offset = 0
        for tensor, stage in zip(leaves, staged, strict=True):
            if not stage:
                sources.append(tensor)
                continue
            assert buf is not None
            size = tensor.numel() * tensor.element_size()
            view = buf[offset : offset + size].view(tensor.dtype).view(tensor.shape)
            view.copy_(tensor)
            sources.append(view)
            offset = align(offset + size)
        return sources



class _TransferNode:
    """The ``to_device`` stage of one run: stages and queues copies on a worker thread."""

    def __init__(
        self, ctx: NodeContext, *, device: torch.device, non_blocking: bool, pool_size: int,
        then: Then | None = None,
    ) -> None:
        self.ctx = ctx
        self.transfer = DeviceTransfer(device, non_blocking=non_blocking, pool_size=pool_size,
                                       then=then)
        ctx.add_receive_hook(self.transfer.receive)
        ctx.add_stop_callback(self.transfer.close)

    async def run(self, inp: Receiver | None, out: Sender) -> None:
        assert inp is not None
        ctx = self.ctx
        while items := await inp.get_many(8):
            ctx.counters.items_in += len(items)
            for item in items:
                try:
                    # timed like a map stage's function: busy time, in flight, a chunk each
                    moved = await ctx.run_timed(self.transfer.send, item)
                except Exception as exc:
                    ctx.item_failed(item, exc)
                    continue
                await out.put(moved)
                ctx.produced(1)


def to_device(
    pipe: P,
    device: str | int | torch.device,
    *,
    non_blocking: bool = True,
    pool_size: int = DEFAULT_POOL_SIZE,
    then: Then | None = None,
) -> P:
    """``pipe`` with its batches copied to ``device``, overlapping the copies with compute.

    Batches may be tensors or dicts / lists / tuples / namedtuples of them; other values pass
    through unchanged. For a CUDA device, each batch is staged in a pinned buffer from a
    bounded pool, copied on a dedicated side stream, and handed to the consumer only after
    its current stream has been made to wait for the copy (see the module docstring). Keep
    this stage last: later stages would receive in-flight wrappers, not batches.

    Args:
        pipe: The pipeline whose output to move.
        device: ``"cuda"``, ``"cuda:1"``, ``1``, a ``torch.device``; ``"cpu"`` returns ``pipe``
            unchanged. Other device types get a plain ``tensor.to(device)`` stage.
        non_blocking: Queue copies asynchronously (default). ``False`` makes the stage wait
            for each batch's copy.
        pool_size: Pinned buffers in the pool: how many batches may be in flight on the bus
            at once. Pinned memory held is at most ``pool_size`` times the largest batch.
        then: A function of each batch once it is on the device, run in the stage's worker
            thread (for CUDA, on the side stream that copied it, before the consumer's stream
            is made to wait): for example, normalize uint8 images copied 4x smaller. With
            ``"cpu"``, a ``map`` stage that applies it.

    Raises:
        ConfigError: ``device`` is malformed, or is CUDA and this machine has no CUDA (or
            not that device index), or ``pool_size`` is not an int >= 1.
    """
    dev = resolve_device(device)
    check_int("pool_size", pool_size, 1)
    if dev.type == "cpu":
        return pipe if then is None else cast(P, pipe.map(then, name="to_device"))
    if dev.type != "cuda":
        # The items keep their type (tensors move), and the copy its class.
        def move(batch: Any) -> Any:
            leaves, rebuild = flatten(batch)
            moved = rebuild([t.to(dev, non_blocking=non_blocking) for t in leaves])
            return moved if then is None else then(moved)

        return cast(P, pipe.map(move, name="to_device"))
    spec = CustomSpec(
        label="to_device",
        factory=functools.partial(
            _TransferNode, device=dev, non_blocking=bool(non_blocking), pool_size=pool_size,
            then=then,
        ),
        options={"device": str(dev), "non_blocking": bool(non_blocking), "pool_size": pool_size},
        concurrency=1,
        items_per_output=1,
        terminal=True,
    )
    return pipe.with_stage(spec)
