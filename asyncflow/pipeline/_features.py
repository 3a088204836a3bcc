"""The feature registry: how the engine reaches what other packages add to a pipeline.

The engine imports none of its features (torch transfers, the cache, progress bars, HTML
display, retry options). ``asyncflow/__init__.py`` registers each one by name, as the object or
as ``"module:attribute"`` imported on first use, and the engine's thin methods
(``Pipeline.to_device``, ``Pipeline.cache``, ``Pipeline.progress``, the HTML and text reprs,
the ``retry=`` / ``timeout=`` checks) look them up here. The names the engine asks for:

* ``"to_device"``: ``to_device(pipe, device, *, non_blocking=..., pool_size=..., then=...)``
* ``"cache"``: ``cache(pipe, path, **options)``
* ``"progress_hook"``: ``progress_hook(**options)``, a hook factory (see ``with_hook``)
* ``"pipeline_html"``: ``pipeline_html(pipe) -> str``
* ``"stats_text"``, ``"stats_html"``: ``(stats) -> str``
* ``"Retry"``, ``"Timeout"``: the option classes ``Pipeline(retry=, timeout=)`` accept

Above the engine, the journal asks for ``"journal_crops:<kind>"``: ``(record line, run
configuration) -> crops``, how a kind of pipeline (``image.folder``) reads its records' crops;
``asyncflow.image`` for ``"parse_device"`` and ``"resolve_device"``, the one parser of a
device argument (``asyncflow.torch``'s, which ``image`` may not import).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from .._errors import ConfigError

__all__ = ["feature", "register_feature"]

_registry: dict[str, Any] = {}
_lock = threading.Lock()


def register_feature(name: str, target: object) -> None:
    """Provide the feature ``name``: ``target`` itself, or a ``"module:attribute"`` string
    that is imported the first time the feature is used (so that registering is free).

    Registering a name again replaces it (a test double, or a third-party implementation).
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a feature name must be a non-empty string, got {name!r}")
    if isinstance(target, str):
        module, sep, attribute = target.partition(":")
        if not sep or not module or not attribute:
            raise ConfigError(f"a lazy feature must read 'module:attribute', got {target!r}")
    with _lock:
        _registry[name] = target


def feature(name: str) -> Any:
    """The object registered as ``name``.

    Raises:
        ConfigError: Nothing is registered under ``name``.
    """
    with _lock:
        try:
            target = _registry[name]
        except KeyError:
            raise ConfigError(
                f"no feature {name!r} is registered (asyncflow registers its own features when "
                "the asyncflow package is imported)"
            ) from None
    if isinstance(target, str):  # "module:attribute", imported now that it is used
        module, _, attribute = target.partition(":")
        resolved = getattr(importlib.import_module(module), attribute)
        with _lock:
            if _registry.get(name) is target:
                _registry[name] = resolved
        return resolved
    return target
