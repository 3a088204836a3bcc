"""Starting worker processes: what each worker receives at boot, and the start context.

The boot payload (the stage function, the init hook, the setup hooks and the reducer modules)
is pickled once per pool, by value where it cannot be by reference; a function that cannot be
pickled at all is a :class:`~asyncflow.ConfigError` when the stage is built. Workers start from
a forkserver that has imported the heavy modules once; forked workers (``_fork.py``) get the
setup as it is, unpickled.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing import spawn
from typing import Any

from .._errors import ConfigError
from .._redact import describe_exception, describe_item
from . import _reducers, _segments
from ._worker_options import Processes, worker_setups

__all__ = [
    "Boot", "boot_payload", "check_picklable", "start_context", "without_main", "worker_setup",
]

_starting = threading.local()
_preparation_data = spawn.get_preparation_data


def _without_main_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = _preparation_data(name)
    if getattr(_starting, "active", False):
        # Our workers need nothing of the main script: the function, its init and any class of
        # __main__ arrive by value. Importing it again would run an unguarded script's code in
        # every worker, and load whatever it imports (torch) into workers that need none of it.
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


if getattr(spawn.get_preparation_data, "__name__", "") != "_without_main_data":
    spawn.get_preparation_data = _without_main_data


@contextlib.contextmanager
def without_main() -> Iterator[None]:
    """Start worker processes in this block without importing the parent's main module."""
    _starting.active = True
    try:
        yield
    finally:
        _starting.active = False


class Boot:
    """What every worker of a pool boots from: the pickled setup, its large buffers apart.

    The buffers (a Dataset's arrays and tensors) go to shared-memory segments once, when the
    pool starts (:meth:`share`), and each worker maps the same pages copy-on-write. Sent as
    bytes, a 128 MiB in-memory dataset cost the parent one copy and each worker three (the
    bytes, their inner pickle and the unpickled dataset; docs/performance.md).
    """

    def __init__(self, core: bytes, buffers: list[pickle.PickleBuffer]) -> None:
        self.core = core
        self._buffers = buffers  # references to the parent's own buffers, not copies
        self._payload: bytes | None = None

    def share(self, name: Callable[[], str]) -> bytes:
        """The payload every worker receives; its segments are written on the first call
        (named by ``name()``: the pool's prefix, so that its sweep removes them). Where
        ``/dev/shm`` has no room for them (a container's 64 MB default), the buffers travel
        in the payload instead, a copy per worker as before.
        """
        if self._payload is None:
            shared: list[Any]
            try:
                shared = _segments.write_segments(self._buffers, name)
            except OSError:
                shared = [bytearray(buffer.raw()) for buffer in self._buffers]
            self._buffers = []
            self._payload = pickle.dumps((self.core, shared))
        return self._payload


def worker_setup(fn: Callable[[Any], Any], size: int, spec: Processes, stage: str,
                 prefix: str) -> dict[str, Any]:
    """What a worker starts from (``_worker_process.serve``); a forked worker gets it as is."""
    providers = _reducers.lazy_providers()
    return {
        "fn": fn, "init": spec.init, "prefix": prefix,
        # A lazy provider (asyncflow.torch's tensor reducer) and its setup hook load in a
        # worker only once the worker has imported its trigger (torch): an image decoder's
        # workers never import torch.
        "setups": [h for h in worker_setups() if h.__module__ not in providers.values()],
        "lazy": providers,
        "modules": _reducers.eager_reducer_modules(),
        "info": {"num_workers": size, "seed": spec.seed or 0, "stage": stage},
        "reseed": spec.reseed,
    }


def boot_payload(fn: Callable[[Any], Any], size: int, spec: Processes, stage: str,
                  prefix: str) -> Boot:
    setup = worker_setup(fn, size, spec, stage, prefix)
    try:
        return Boot(*_segments.pickle_by_value(setup))
    except Exception as exc:
        what = "init" if _pickles(fn) else "function"
        obj = spec.init if what == "init" else fn
        raise ConfigError(
            f"stage {stage!r}: its {what} {describe_item(obj)} cannot be sent to worker "
            f"processes ({describe_exception(exc)}); run the stage on threads "
            "(workers='threads'), or make it picklable"
        ) from None


def check_picklable(fn: Callable[[Any], Any], spec: Processes, stage: str) -> None:
    """Raise :class:`ConfigError` now if ``fn`` or ``spec.init`` cannot go to a worker
    (forked workers get both unpickled)."""
    if spec.start_method != "fork":
        boot_payload(fn, 1, spec, stage, "")


def _pickles(obj: Any) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(obj)
    except Exception:
        return False
    return True


_preloaded = False


def start_context(spec: Processes, core: bytes = b"") -> Any:
    """The start context; for the first forkserver pool (``core``: its :class:`Boot`'s), the
    server's preload list.

    Workers fork from the server with the preloaded modules already imported: a worker starts
    in milliseconds instead of importing NumPy and PIL again. A lazy provider (torch's) is
    preloaded only when the first pool's boot payload names its trigger: a loader of torch
    Datasets gets torch preloaded, an image decoder's workers stay without it.
    """
    global _preloaded
    context = multiprocessing.get_context(spec.start_method)
    if spec.start_method == "forkserver" and not _preloaded:
        _preloaded = True
        heavy = ["asyncflow.workers._worker_process", *_reducers.eager_reducer_modules()]
        heavy += [m for m in ("numpy", "PIL.Image") if m in sys.modules]
        for trigger, provider in _reducers.lazy_providers().items():
            if trigger.encode() in core:  # the function or its Dataset refers to torch
                heavy.append(provider)
        context.set_forkserver_preload(heavy)
    return context
