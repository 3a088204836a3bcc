"""Progress bars for pipeline runs: ``pipe.progress()``.

The bar is a consumer-side hook (see ``pipeline/EXTENDING.md``): it is created in the consumer's
thread when a run starts, counts items as they are handed to the consumer, and closes when the
run is closed. In a Jupyter kernel with ipywidgets installed it is a widget; everywhere else it
is a text bar (``tqdm.auto`` would pick the same, but warns when ipywidgets is missing).

With ``stats=True`` a notebook also shows the per-stage table under the bar, refreshed while the
run goes on (in a terminal the bar's postfix names the bottleneck instead).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

from .._errors import ConfigError, check_seconds

__all__ = ["ProgressBar", "in_notebook", "progress_hook"]


def in_notebook() -> bool:
    """True inside a Jupyter (IPython kernel) session."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _bar_class(widget: bool | None) -> type[Any]:
    from tqdm.std import tqdm as bar

    if in_notebook() if widget is None else widget:
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm as bar
        except ImportError:
            if widget:  # asked for explicitly
                raise
    # tqdm's monitor thread would outlive a run (until every bar in the process closes);
    # a bar updated on every item does not need it.
    return type(bar.__name__, (bar,), {"monitor_interval": 0})


class ProgressBar:
    """The hook of one run: a tqdm bar advanced by each item the consumer receives.

    Args:
        run: The run (its ``stats()`` feed the postfix and the live table).
        total: Expected count, if known (a bar with an end and an ETA).
        desc: Label at the left of the bar.
        unit: What is counted (``"it"``; ``"img"`` when ``count`` counts images).
        count: ``count(item) -> int`` for items that hold several things (``len`` of a
            batch, say); default one per item.
        stats: Show the bottleneck in the postfix, and in a notebook the live stats table.
        interval: Seconds between refreshes of the postfix and the table.
        widget: Force (``True``) or refuse (``False``) the notebook widget.
        **tqdm_options: Passed to ``tqdm`` (``leave``, ``position``, ``file``, ...).
    """

    def __init__(
        self,
        run: Any,
        *,
        total: int | None = None,
        desc: str | None = None,
        unit: str = "it",
        count: Callable[[Any], int] | None = None,
        stats: bool = True,
        interval: float = 1.0,
        widget: bool | None = None,
        **tqdm_options: Any,
    ) -> None:
        self._run = run
        self._count = count
        self._stats = stats
        self._interval = interval
        self._next_refresh = time.monotonic() + interval
        self._handle: Any = None
        cls = _bar_class(widget)
        tqdm_options.setdefault("dynamic_ncols", True)
        self.bar = cls(total=total, desc=desc, unit=unit, **tqdm_options)
        if stats and in_notebook():
            self._handle = _display_stats(run)

    def __call__(self, item: Any) -> Any:
        self.bar.update(1 if self._count is None else self._count(item))
        if self._stats and time.monotonic() >= self._next_refresh:
            self._refresh()
        return item

    def _refresh(self) -> None:
        self._next_refresh = time.monotonic() + self._interval
        snapshot = self._run.stats()
        if snapshot.bottleneck:
            self.bar.set_postfix_str(f"bottleneck: {snapshot.bottleneck}", refresh=False)
        if self._handle is not None:
            self._handle.update(_stats_view(snapshot))

    def close(self) -> None:
        """Close the bar (and leave the final table), once the run has ended."""
        if self._stats:
            self._refresh()
        self.bar.close()


def _display_stats(run: Any) -> Any:
    try:
        from IPython.display import display
    except ImportError:
        return None
    return display(_stats_view(run.stats()), display_id=True)  # type: ignore[no-untyped-call]


def _stats_view(snapshot: Any) -> Any:
    from IPython.display import HTML

    from ._tables import stats_html

    return HTML(stats_html(snapshot))  # type: ignore[no-untyped-call]


def progress_hook(**options: Any) -> Callable[[Any], ProgressBar]:
    """The hook factory behind ``pipe.progress(**options)``: one :class:`ProgressBar` per run.

    The options are :class:`ProgressBar`'s. Unknown ``tqdm`` options fail when the first run
    starts, as tqdm itself reports them.

    Raises:
        ConfigError: ``count`` is not callable, or ``interval`` not a finite number of
            seconds >= 0 (at once, with the message naming it).
    """
    count = options.get("count")
    if count is not None and not callable(count):
        raise ConfigError(f"progress(count=...) must be a callable, got {count!r}")
    check_seconds("interval", options.get("interval", 1.0), zero=True)
    return functools.partial(ProgressBar, **options)
