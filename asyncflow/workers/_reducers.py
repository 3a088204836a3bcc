"""The registry of reducers: how a type travels between worker processes (a tensor's
bytes as an out-of-band buffer, written to a segment by ``_segments.py``), and which modules
every worker imports so that both sides agree. A feature registers its reducers here, directly
or lazily, once a trigger module is imported (``asyncflow.torch`` on ``torch``), through
``asyncflow.pipeline.shm``."""

from __future__ import annotations

import functools
import importlib
import pickle
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "Pickler",
    "cloud_pickler",
    "eager_reducer_modules",
    "lazy_providers",
    "load_lazy",
    "load_reducer_modules",
    "register_lazy_reducers",
    "register_reducer",
]

_reducers: dict[type, Callable[[Any], Any]] = {}
_lazy: dict[str, str] = {}  # trigger -> provider, not yet imported
_lazy_all: dict[str, str] = {}  # every lazy registration, imported or not
_lookups: dict[type, Callable[[Any], Any] | None] = {}
_modules: dict[str, None] = {}


def register_reducer(cls: type, reducer: Callable[[Any], Any]) -> None:
    """Pickle instances of ``cls`` (and its subclasses) with ``reducer`` between processes.

    ``reducer(obj)`` returns what ``__reduce__`` would (a callable and its arguments), or
    ``NotImplemented`` for the default. Wrap large buffers in :class:`pickle.PickleBuffer` to
    send them through shared memory. The reducer's module is imported in every worker.
    """
    _reducers[cls] = reducer
    _lookups.clear()
    _modules[reducer.__module__] = None


def register_lazy_reducers(trigger: str, provider: str) -> None:
    """Import ``provider`` (which registers reducers) once ``trigger`` has been imported.

    The public face uses it to wire ``asyncflow.torch``'s tensor reducer in whenever torch is
    loaded, without the engine importing either.
    """
    _lazy[trigger] = provider
    _lazy_all[trigger] = provider


def lazy_providers() -> dict[str, str]:
    """Every ``trigger -> provider`` registered with :func:`register_lazy_reducers`."""
    return dict(_lazy_all)


def load_lazy() -> None:
    """Import the providers whose trigger module is imported now (a worker calls it once its
    function is unpickled; :func:`dumps` calls it on the way too)."""
    for trigger, provider in list(_lazy.items()):
        if trigger in sys.modules:
            del _lazy[trigger]
            importlib.import_module(provider)


def eager_reducer_modules() -> list[str]:
    """The modules that registered reducers, less the lazy providers: what every worker
    imports at start whatever its function needs."""
    load_lazy()
    providers = set(_lazy_all.values())
    return [m for m in _modules if m not in providers]


def load_reducer_modules(names: Iterable[str]) -> None:
    """Import the modules that registered reducers in the parent (in a worker, at start)."""
    for name in names:
        importlib.import_module(name)  # a module imported already is returned at once


def _lookup(cls: type) -> Callable[[Any], Any] | None:
    try:
        return _lookups[cls]
    except KeyError:
        found = next((_reducers[k] for k in cls.__mro__ if k in _reducers), None)
        _lookups[cls] = found
        return found


def _reduce(obj: Any) -> Any:
    """What the reducer registered for ``obj``'s type returns, or ``NotImplemented``."""
    reducer = _lookup(type(obj)) if _reducers else None
    return NotImplemented if reducer is None else reducer(obj)


class Pickler(pickle.Pickler):
    """Pickles with the registered reducers."""

    def reducer_override(self, obj: Any) -> Any:
        return _reduce(obj)


@functools.cache
def cloud_pickler() -> type[pickle.Pickler]:
    import cloudpickle  # only when plain pickle fails: keeps the common path light

    class CloudPickler(cloudpickle.Pickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            result = _reduce(obj)
            return super().reducer_override(obj) if result is NotImplemented else result

    return CloudPickler
