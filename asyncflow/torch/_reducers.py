"""CPU tensors between worker processes: their bytes through shared memory, not the pipe.

Registered with the engine (``asyncflow.pipeline.register_reducer``) when this module is
imported: in the parent as soon as torch is (``asyncflow/__init__.py`` wires that up), and in
every worker at start. Tensors that cannot be shared this way (CUDA, sparse, quantized, those
that require grad, small ones) keep torch's own pickling.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from ..pipeline import register_reducer, register_worker_setup
from ..pipeline.shm import SHM_THRESHOLD

__all__ = ["plain_cpu", "rebuild_tensor", "reduce_tensor", "worker_setup"]


def plain_cpu(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s bytes are all there is to it: a dense CPU tensor, not a subclass,
    nested, sparse, quantized, nor one that requires grad."""
    return (type(tensor) is torch.Tensor and tensor.device.type == "cpu"
            and not tensor.is_nested and tensor.layout == torch.strided
            and not tensor.is_quantized and not tensor.requires_grad)


def reduce_tensor(tensor: torch.Tensor) -> Any:
    """``__reduce__`` for a large dense CPU tensor: its bytes as an out-of-band buffer."""
    if not plain_cpu(tensor) or tensor.numel() * tensor.element_size() < SHM_THRESHOLD:
        return NotImplemented
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    data: Any = flat.numpy()  # a buffer, though typeshed's ndarray does not say so
    return rebuild_tensor, (pickle.PickleBuffer(data), str(tensor.dtype)[6:],
                            tuple(tensor.shape))


def rebuild_tensor(buffer: Any, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor :func:`reduce_tensor` took apart, on the received buffer (no copy)."""
    view = memoryview(buffer)
    if view.readonly:  # sent in band: torch wants writable memory
        view = memoryview(bytearray(view))
    if view.nbytes == 0:
        return torch.empty(shape, dtype=getattr(torch, dtype))
    return torch.frombuffer(view, dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)


def worker_setup() -> None:
    """One torch thread per worker process, as torch's DataLoader sets: the workers are the
    parallelism, and N workers x N threads would oversubscribe the cores."""
    torch.set_num_threads(1)


register_reducer(torch.Tensor, reduce_tensor)
register_worker_setup(worker_setup)  # in a started worker (loaded lazily), it runs at once
