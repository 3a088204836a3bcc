"""``image.folder``'s settings: its arguments checked, and where its decoders run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .._errors import ConfigError, ConfigTypeError, check_int
from ..pipeline import Processes, choose_workers, feature, usable_cpus
from ..ranks import Part, Split
from ._modes import affine
from ._rows import DecodeIntoSharedRow

__all__ = ["check_arguments", "decode_workers", "resolve_split"]


def check_arguments(
    batch_size: Any, mean: Sequence[float], std: Sequence[float], decode_concurrency: Any
) -> int:
    """Check ``image.folder``'s numeric arguments; return how many decoders to run (the
    CPUs this process may use unless ``decode_concurrency`` says).

    Raises:
        ConfigError: ``batch_size`` or ``decode_concurrency`` is not an int >= 1, or ``mean``
            and ``std`` are not 3 values each (``std`` positive).
    """
    check_int("batch_size", batch_size)
    affine(tuple(mean), tuple(std))  # the kernel's check of mean and std
    if decode_concurrency is None:
        return usable_cpus()
    return int(check_int("decode_concurrency", decode_concurrency))


#: How ``"auto"`` and ``"processes"`` start the decoders: forked from this process where that
#: is safe, as ``asyncflow.DataLoader``'s workers, so that they share its imported modules
#: (NumPy, PIL, the kernel, torch) copy-on-write instead of holding their own from the
#: forkserver; else from the forkserver, and ``stats().notes`` says why (docs/performance.md).
FORK_OR_FORKSERVER = Processes(persistent=True, start_method="fork", fallback="forkserver")


def decode_workers(workers: Any, count: int) -> tuple[Processes | None, str | None]:
    """Processes (persistent: they belong to the pipeline; :data:`FORK_OR_FORKSERVER` unless
    ``workers`` is a :class:`~asyncflow.Processes`) or threads (``None``) for ``count``
    decoders, and why, when ``workers="auto"`` chose.

    Raises:
        ConfigError: ``workers`` is not ``"auto"``, ``"threads"``, ``"processes"`` or a
            :class:`~asyncflow.Processes`.
    """
    if workers == "threads":
        return None, None
    if workers == "auto":
        chosen, note = choose_workers(DecodeIntoSharedRow(0, {}, (1,), "uint8"), count,
                                      stage="decode")
        if chosen is None:
            return None, note
        return replace(chosen, persistent=True, start_method=FORK_OR_FORKSERVER.start_method,
                       fallback=FORK_OR_FORKSERVER.fallback), note
    if workers == "processes":
        workers = FORK_OR_FORKSERVER
    if not isinstance(workers, Processes):
        raise ConfigError(
            f"workers must be 'auto', 'threads', 'processes' or an asyncflow.Processes, got "
            f"{workers!r:.80}"
        )
    return workers, None


def resolve_split(split: Any) -> Part | None:
    """This process's part of the tree (resolved now), or ``None`` for all of it.

    ``image.folder`` is one pipeline per rank, never one per DataLoader worker, so the
    workers are not counted.

    Raises:
        ConfigTypeError: ``split`` is not an :class:`~asyncflow.Split`.
        ConfigError: The split's rank or world size is invalid (see :meth:`Split.part`), or
            it shuffles (``image.folder`` has its own ``shuffle=``).
    """
    if split is None:
        return None
    if not isinstance(split, Split):
        raise ConfigTypeError(f"split must be an asyncflow.Split, got {split!r:.80}")
    if split.shuffle:
        raise ConfigError("image.folder shuffles with its own shuffle= and seed=; give it a "
                          f"Split without shuffle, got {split!r}")
    return replace(split, workers=False).part()


def decode_path(decode: Any, device: Any) -> tuple[Any, Any, str]:
    """Where ``image.folder`` decodes: ``(None, None, note)`` for the CPU path, or
    ``(device, decoder, note)`` for the GPU path; the note says which decoder, and why.

    ``"auto"`` takes the GPU path when ``device`` is a CUDA device and a GPU JPEG decoder
    imports (see ``_gpu_decoders.py``), and the CPU path otherwise.

    Raises:
        ConfigError: ``decode`` is not ``"auto"``, ``"cpu"`` or ``"cuda"``; or ``"cuda"``
            without a CUDA device, CUDA, or a GPU decoder (the message says what to install
            or pass).
    """
    if decode not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"decode must be 'auto', 'cpu' or 'cuda', got {decode!r:.80}")
    if decode == "cpu":
        return None, None, "stage 'decode' decodes on the CPU (decode='cpu')"
    import torch  # the GPU path needs torch anyway; the CPU path loads it with its batches

    from ._gpu_decoders import available, choose

    dev = None if device is None else feature("parse_device")(device)
    cuda = dev is not None and dev.type == "cuda"
    if decode == "auto":
        if not cuda:
            return None, None, "stage 'decode' decodes on the CPU (decode='auto': no CUDA device)"
        if not torch.cuda.is_available():
            return None, None, "stage 'decode' decodes on the CPU (decode='auto': CUDA unavailable)"
        if not available():
            return None, None, ("stage 'decode' decodes on the CPU (decode='auto': no GPU JPEG "
                                "decoder installed; pip install 'asyncflow[gpu]')")
    elif not cuda:
        raise ConfigError(f"decode='cuda' needs device='cuda' (or 'cuda:N'), got {device!r}")
    elif not torch.cuda.is_available():
        raise ConfigError("decode='cuda' asked for, but CUDA is not available here (torch "
                          f"{torch.__version__}, built with CUDA {torch.version.cuda}); pass "
                          "decode='cpu'")
    dev = feature("resolve_device")(dev)  # the current device for a bare "cuda"
    decoder = choose(dev)
    why = "decode='cuda'" if decode == "cuda" else "decode='auto': the device is CUDA"
    gray = "" if decoder.takes_gray else " (gray JPEGs too: it refused a gray test JPEG)"
    return dev, decoder, (f"JPEGs decode on {dev} with {decoder.name} ({why}); stage "
                          "'decode' reads files and plans crops, and decodes on the CPU the "
                          f"images the GPU decoder does not take{gray}")
