"""Text and HTML rendering of a pipeline's stages and of its statistics.

Pure functions over the engine's description and stats objects, so that ``print(pipe)``,
``print(pipe.stats())`` and a notebook's rich display share one layout. Nothing here imports
the engine: the objects are read by attribute. Text that may hold an exception's message or a
user's value (failures, notes, settings) is redacted before it is shown.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._redact import redact

__all__ = ["pipeline_html", "pipeline_text", "stages_html", "stages_text", "stats_html",
           "stats_text", "table_html", "table_text"]

_MAX_FAILURES_SHOWN = 5

_CSS = (
    "<style>"
    ".asyncflow-table{border-collapse:collapse;font-family:monospace;font-size:12px}"
    ".asyncflow-table th,.asyncflow-table td{padding:2px 8px;text-align:right;"
    "border-bottom:1px solid #ddd}"
    ".asyncflow-table tr.asyncflow-bottleneck td{background:rgba(255,170,0,.25);font-weight:bold}"
    ".asyncflow-bar{display:inline-block;height:8px;background:#4a7bd0;vertical-align:middle}"
    "</style>"
)


# -- generic tables -------------------------------------------------------------------------


def table_text(headers: Sequence[str], rows: Iterable[Sequence[str]], *,
               align: str | None = None) -> str:
    """Align ``rows`` under ``headers``.

    ``align`` holds one letter per column, ``l`` or ``r`` (``zip(..., strict=True)`` refuses
    another length); by default the first column is left-aligned and the others
    right-aligned.
    """
    body = [list(map(str, row)) for row in rows]
    align = align or "l" + "r" * (len(headers) - 1)
    widths = [max(map(len, column)) for column in zip(headers, *body, strict=True)]

    def line(cells: Sequence[str]) -> str:
        out = [c.ljust(w) if a == "l" else c.rjust(w)
               for c, w, a in zip(cells, widths, align, strict=True)]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule, *(line(r) for r in body)])


def table_html(headers: Sequence[str], rows: Iterable[Sequence[str]], *,
               highlight: Iterable[int] = (), caption: str = "", align: str | None = None
               ) -> str:
    """An HTML table; cells are escaped unless they are :class:`_Raw`.

    ``highlight`` lists row indexes to mark (the bottleneck); ``align`` is as
    :func:`table_text`'s.
    """
    marked = set(highlight)
    align = align or "l" + "r" * (len(headers) - 1)
    styles = [" style='text-align:left'" if a == "l" else "" for a in align]
    head = "".join(f"<th{st}>{html.escape(h)}</th>" for h, st in zip(headers, styles, strict=True))
    lines = []
    for i, row in enumerate(rows):
        cls = ' class="asyncflow-bottleneck"' if i in marked else ""
        cells = "".join(f"<td{st}>{_cell(c)}</td>" for c, st in zip(row, styles, strict=True))
        lines.append(f"<tr{cls}>{cells}</tr>")
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return (
        f"{_CSS}<table class='asyncflow-table'>{cap}<thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(lines)}</tbody></table>"
    )


class _Raw(str):
    """A cell that is already HTML."""


def _cell(value: object) -> str:
    return value if isinstance(value, _Raw) else html.escape(str(value))


# -- formatting helpers ---------------------------------------------------------------------


def _rate(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:,.1f}"
    return f"{value:.2f}"


def _seconds(value: float) -> str:
    if value <= 0:
        return "-"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.1f} us"


def _percent(value: float) -> str:
    return f"{100 * value:.0f}%"


def _queue(stage: Any) -> str:
    cap = stage.queue_capacity
    if not cap:
        return "-"
    return f"{stage.queue_fill}/{cap} (avg {_percent(stage.mean_queue_fill / cap)})"


def _bar(fraction: float) -> _Raw:
    width = max(0, min(100, round(100 * fraction)))
    return _Raw(
        f"<span class='asyncflow-bar' style='width:{width // 2}px'></span> "
        f"{html.escape(_percent(fraction))}"
    )


# -- statistics -----------------------------------------------------------------------------

_STATS_HEADERS = (
    "stage", "kind", "conc", "in", "out", "items/s", "busy", "per item", "queue", "failures",
)
_STATS_ALIGN = "llrrrrrrrr"


def _stats_rows(stats: Any, *, html_bars: bool, internal: bool = False
                ) -> tuple[list[list[str]], list[int]]:
    rows: list[list[str]] = []
    marked: list[int] = []
    shown = [s for s in stats.stages if internal or not s.internal]
    for i, stage in enumerate(shown):
        name = stage.name
        if name == stats.bottleneck:
            marked.append(i)
            name = f"{name} *" if not html_bars else name
        if stage.internal:
            name += " (internal)"
        if stage.abandoned:
            name += " (abandoned)"
        busy: str = _bar(stage.utilization) if html_bars else _percent(stage.utilization)
        rows.append([
            name, stage.kind, str(stage.concurrency), f"{stage.items_in:,}",
            f"{stage.items_out:,}", _rate(stage.items_per_second), busy,
            _seconds(stage.mean_seconds_per_item), _queue(stage), f"{stage.failures:,}",
        ])
    return rows, marked


def _summary(stats: Any) -> str:
    state = "running" if stats.running else "finished"
    text = (
        f"{state}: {stats.delivered:,} items in {stats.elapsed:.2f} s "
        f"({_rate(stats.throughput)} items/s)"
    )
    if stats.bottleneck == "consumer":
        text += "; bottleneck: the consumer (the output queue stays full)"
    elif stats.bottleneck:
        text += f"; bottleneck: {stats.bottleneck}"
    return text


def _lines_below(stats: Any, internal: bool) -> list[str]:
    """The lines under a stats table: hidden internal stages, failures, notes."""
    out = []
    hidden = [s.name for s in stats.stages if s.internal]
    if hidden and not internal:
        out.append(f"internal stages hidden: {', '.join(hidden)} (their time counts for the "
                   "next stage shown; stats.table(internal=True) lists them)")
    failures = [
        redact(f"  {f.stage}: {f.error_type}: {f.message} (item {f.item})")
        for f in stats.failures[:_MAX_FAILURES_SHOWN]
    ]
    total = sum(s.failures for s in stats.stages)
    if total > len(failures):
        failures.append(f"  ... {total - len(failures):,} more")
    if failures:
        out += ["failures:", *failures]
    return out + [f"note: {redact(note)}" for note in stats.notes]


_NO_RUN = "no run yet: stats() describes the latest run of this pipeline object"


def stats_text(stats: Any, *, internal: bool = False) -> str:
    """Render a ``PipelineStats`` as a plain-text table; the bottleneck is marked ``*``.

    Internal stages (``StageStats.internal``) are left out, and named below the table,
    unless ``internal``; then they are listed, marked ``(internal)``.
    """
    if not stats.stages:
        return _NO_RUN
    rows, _ = _stats_rows(stats, html_bars=False, internal=internal)
    table = table_text(_STATS_HEADERS, rows, align=_STATS_ALIGN)
    return "\n".join([table, _summary(stats), *_lines_below(stats, internal)])


def stats_html(stats: Any, *, internal: bool = False) -> str:
    """Render a ``PipelineStats`` as an HTML table; the bottleneck row is highlighted.
    Internal stages are left out unless ``internal``, as in :func:`stats_text`."""
    if not stats.stages:
        return f"<p>{html.escape(_NO_RUN)}</p>"
    rows, marked = _stats_rows(stats, html_bars=True, internal=internal)
    out = table_html(
        _STATS_HEADERS, rows, highlight=marked, caption=_summary(stats), align=_STATS_ALIGN
    )
    extra = _lines_below(stats, internal)
    if extra:
        out += "<pre>" + html.escape("\n".join(extra)) + "</pre>"
    return out


# -- description ----------------------------------------------------------------------------

_STAGE_HEADERS = ("#", "stage", "kind", "function", "concurrency", "settings")
_STAGE_ALIGN = "rlllrl"
_COLUMNS = ("fn", "concurrency")


def _short(value: Any, limit: int = 48) -> str:
    text = redact(value if isinstance(value, str) else repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stage_rows(description: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for i, stage in enumerate(description):
        rest = {
            k: v for k, v in stage.items()
            if k not in ("kind", "name", *_COLUMNS) and v is not None
        }
        if stage.get("kind") == "source":
            made_by, type_name = rest.pop("callable", None), rest.pop("type", "")
            readable = isinstance(made_by, str) and not made_by.startswith("<")
            what = f"{made_by.rpartition('<locals>.')[2]}()" if readable else str(type_name)
        else:
            what = str(stage.get("fn", ""))
        conc = stage.get("concurrency")
        rows.append([
            str(i), str(stage.get("name", "")), str(stage.get("kind", "")), _short(what),
            "" if conc is None else str(conc),
            ", ".join(f"{k}={_short(v)}" for k, v in rest.items()),
        ])
    return rows


def _title(pipe: Any, description: Sequence[Mapping[str, Any]]) -> str:
    name = pipe.options.name
    label = type(pipe).__name__ if name in (None, "pipeline") else f"{type(pipe).__name__} {name!r}"
    return f"{label}: a source and {max(len(description) - 1, 0)} stages"


def stages_text(description: Sequence[Mapping[str, Any]], *, title: str = "") -> str:
    """Render a pipeline description (``pipe.describe()``) as a plain-text table."""
    table = table_text(_STAGE_HEADERS, _stage_rows(description), align=_STAGE_ALIGN)
    return f"{title}\n{table}" if title else table


def stages_html(description: Sequence[Mapping[str, Any]], *, title: str = "") -> str:
    """Render a pipeline description (``pipe.describe()``) as an HTML table."""
    return table_html(_STAGE_HEADERS, _stage_rows(description), caption=title, align=_STAGE_ALIGN)


def pipeline_text(pipe: Any) -> str:
    """A pipeline's stages and, once it has run, the statistics of its latest run."""
    return _pipeline(pipe, stages_text, stats_text, "\n\nlatest run:\n")


def pipeline_html(pipe: Any) -> str:
    """HTML for ``Pipeline._repr_html_``: the stage table, plus the latest run's stats."""
    return _pipeline(pipe, stages_html, stats_html, "<br>")


def _pipeline(pipe: Any, stages: Callable[..., str], stats_of: Callable[[Any], str],
              between: str) -> str:
    description = pipe.describe()
    out = stages(description, title=_title(pipe, description))
    snapshot = pipe.stats()
    if snapshot.stages:
        out += between + stats_of(snapshot)
    return out
