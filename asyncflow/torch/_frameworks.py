"""What lets frameworks rebuild an asyncflow.DataLoader as they rebuild torch's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader as TorchDataLoader

__all__ = ["record_for_rebuild"]


def record_for_rebuild(loader: Any, arguments: dict[str, Any]) -> Callable[[], None]:
    """Keep the arguments a loader was built with where PyTorch Lightning looks for them.

    Inside a ``*_dataloader()`` hook, Lightning patches ``__init__`` of every DataLoader
    subclass that exists, records each loader's arguments, and later rebuilds the loader
    from them (for DDP, or predicting). ``asyncflow.DataLoader`` may be created after the
    patch (``import asyncflow`` defines it lazily): then only torch's ``__init__`` is
    patched, and it would record the arguments of our call to it, not the user's, and the
    attributes we set afterwards. So, while that patch is in place and nothing recorded
    this loader yet, record the user's arguments as Lightning would, and keep our own
    attribute settings out of its record.

    Args:
        loader: The loader being built.
        arguments: Its ``__init__`` arguments, by name.

    Returns:
        A function to call at the end of ``__init__``.
    """
    if "__old__init__" not in vars(TorchDataLoader) or hasattr(loader, "__pl_saved_args"):
        return lambda: None
    object.__setattr__(loader, "__pl_saved_args", ())
    object.__setattr__(loader, "__pl_saved_kwargs", arguments)
    object.__setattr__(loader, "__pl_saved_arg_names", ())
    object.__setattr__(loader, "__pl_saved_default_kwargs", {})
    object.__setattr__(loader, "__dataset", arguments["dataset"])
    object.__setattr__(loader, "__pl_inside_init", True)
    return lambda: object.__setattr__(loader, "__pl_inside_init", False)
