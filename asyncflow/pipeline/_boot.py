"""Starting worker processes: what each worker receives at boot, and the start context.

The boot payload (the stage function, the init hook, the setup hooks and the reducer modules)
is pickled once per pool, by value where it cannot be by reference; a function that cannot be
pickled at all is a :class:`~asyncflow.ConfigError` when the stage is built. Workers start from
a forkserver that has imported the heavy modules once.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable
from typing import Any

from .._errors import ConfigError
from . import _shm
from ._workers import Processes, worker_setups

__all__ = ["boot_payload", "check_picklable", "start_context"]


def boot_payload(fn: Callable[[Any], Any], size: int, spec: Processes, stage: str,
                  prefix: str) -> bytes:
    import cloudpickle

    setup = {
        "fn": fn, "init": spec.init, "setups": worker_setups(),
        "modules": _shm.reducer_modules(), "prefix": prefix,
        "info": {"num_workers": size, "seed": spec.seed or 0, "stage": stage},
    }
    try:
        return bytes(cloudpickle.dumps(setup, protocol=5))
    except Exception as exc:
        what = "init" if _pickles(fn) else "function"
        obj = spec.init if what == "init" else fn
        raise ConfigError(
            f"stage {stage!r}: its {what} {obj!r:.100} cannot be sent to worker processes "
            f"({type(exc).__name__}: {exc}); run the stage on threads "
            "(workers='threads'), or make it picklable"
        ) from None


def check_picklable(fn: Callable[[Any], Any], spec: Processes, stage: str) -> None:
    """Raise :class:`ConfigError` now if ``fn`` or ``spec.init`` cannot go to a worker."""
    boot_payload(fn, 1, spec, stage, "")


def _pickles(obj: Any) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(obj)
    except Exception:
        return False
    return True


_preloaded = False


def start_context(spec: Processes) -> Any:
    global _preloaded
    context = multiprocessing.get_context(spec.start_method)
    if spec.start_method == "forkserver" and not _preloaded:
        _preloaded = True
        # Workers fork from the server with these already imported: a worker starts in
        # milliseconds instead of importing NumPy, PIL and torch again.
        heavy = ["asyncflow.pipeline._worker", *_shm.reducer_modules()]
        heavy += [m for m in ("numpy", "PIL.Image") if m in sys.modules]
        context.set_forkserver_preload(heavy)
    return context
