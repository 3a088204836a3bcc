"""Where this process stands among ranks: ``torch.distributed``'s group when initialized, else
``$RANK`` / ``$WORLD_SIZE``. Nothing here imports torch: the group is read only when the program
has imported ``torch.distributed`` (it cannot be initialized otherwise)."""

from __future__ import annotations

import os
import sys

from .._errors import ConfigError

__all__ = ["env_int", "process_group", "world", "world_of_env"]


def env_int(name: str, default: int) -> int:
    """The integer in environment variable ``name`` (``default`` when unset or empty).

    Raises:
        ConfigError: It is set to something that is not an integer.
    """
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def process_group() -> tuple[int, int] | None:
    """``(rank, world_size)`` of the initialized ``torch.distributed`` process group, or
    ``None``. torch is only consulted if the program has imported it: a group cannot be
    initialized without that, and importing torch here would make every caller heavy."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None


def world() -> tuple[int, int]:
    """``(rank, world_size)``: the process group's when initialized, else
    :func:`world_of_env`'s."""
    return process_group() or world_of_env()


def world_of_env() -> tuple[int, int]:
    """``(rank, world_size)`` from ``$RANK`` and ``$WORLD_SIZE``, each ``0`` / ``1`` when
    unset (``torchrun`` sets them, and DataLoader worker processes inherit them)."""
    return env_int("RANK", 0), env_int("WORLD_SIZE", 1)
