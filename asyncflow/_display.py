"""Text and HTML rendering of a pipeline's stages and of its statistics.

Pure functions over the engine's description and stats objects, so that ``print(pipe)``,
``print(pipe.stats())`` and a notebook's rich display share one layout. Nothing here imports
the engine: the objects are read by attribute.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["stages_html", "stages_text", "stats_html", "stats_text", "table_html", "table_text"]

_MAX_FAILURES_SHOWN = 5
_HIDDEN_SETTINGS = {"fn", "name", "kind", "pred", "source"}

_CSS = (
    "<style>"
    ".asyncflow-table{border-collapse:collapse;font-family:monospace;font-size:12px}"
    ".asyncflow-table th,.asyncflow-table td{padding:2px 8px;text-align:right;"
    "border-bottom:1px solid #ddd}"
    ".asyncflow-table th:first-child,.asyncflow-table td:first-child{text-align:left}"
    ".asyncflow-table tr.asyncflow-bottleneck td{background:rgba(255,170,0,.25);font-weight:bold}"
    ".asyncflow-bar{display:inline-block;height:8px;background:#4a7bd0;vertical-align:middle}"
    "</style>"
)


# -- generic tables -------------------------------------------------------------------------


def table_text(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Align ``rows`` under ``headers``: the first column left-aligned, the others right."""
    body = [list(map(str, row)) for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [cells[0].ljust(widths[0])]
        out += [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule, *(line(r) for r in body)])


def table_html(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    highlight: Iterable[int] = (),
    caption: str = "",
) -> str:
    """An HTML table; cells are escaped unless wrapped in :class:`_Raw`."""
    marked = set(highlight)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    lines = []
    for i, row in enumerate(rows):
        cls = ' class="asyncflow-bottleneck"' if i in marked else ""
        cells = "".join(f"<td>{_cell(c)}</td>" for c in row)
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
    cap = getattr(stage, "queue_capacity", 0) or 0
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
    "stage",
    "kind",
    "conc",
    "in",
    "out",
    "items/s",
    "busy",
    "per item",
    "queue",
    "failures",
)


def _stats_rows(stats: Any, *, html_bars: bool) -> tuple[list[list[str]], list[int]]:
    rows: list[list[str]] = []
    marked: list[int] = []
    elapsed = max(float(stats.elapsed), 1e-9)
    for i, stage in enumerate(stats.stages):
        name = stage.name
        if name == stats.bottleneck:
            marked.append(i)
            name = f"{name} *" if not html_bars else name
        if getattr(stage, "abandoned", False):
            name += " (abandoned)"
        busy: str = _bar(stage.utilization) if html_bars else _percent(stage.utilization)
        rows.append(
            [
                name,
                stage.kind,
                str(stage.concurrency),
                f"{stage.items_in:,}",
                f"{stage.items_out:,}",
                _rate(stage.items_out / elapsed),
                busy,
                _seconds(stage.mean_seconds_per_item),
                _queue(stage),
                f"{stage.failures:,}",
            ]
        )
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


def _failure_lines(stats: Any) -> list[str]:
    failures = list(getattr(stats, "failures", ()))
    lines = [
        f"  {f.stage}: {f.error_type}: {f.message} (item {f.item})"
        for f in failures[:_MAX_FAILURES_SHOWN]
    ]
    total = sum(s.failures for s in stats.stages)
    if total > len(lines):
        lines.append(f"  ... {total - len(lines):,} more")
    return ["failures:", *lines] if lines else []


def stats_text(stats: Any) -> str:
    """Render a ``PipelineStats`` as a plain-text table; the bottleneck is marked ``*``."""
    rows, _ = _stats_rows(stats, html_bars=False)
    parts = [table_text(_STATS_HEADERS, rows), _summary(stats)]
    parts += _failure_lines(stats)
    parts += [f"note: {note}" for note in getattr(stats, "notes", ())]
    return "\n".join(parts)


def stats_html(stats: Any) -> str:
    """Render a ``PipelineStats`` as an HTML table; the bottleneck row is highlighted."""
    rows, marked = _stats_rows(stats, html_bars=True)
    out = table_html(_STATS_HEADERS, rows, highlight=marked, caption=_summary(stats))
    extra = _failure_lines(stats) + [f"note: {n}" for n in getattr(stats, "notes", ())]
    if extra:
        out += "<pre>" + html.escape("\n".join(extra)) + "</pre>"
    return out


# -- description ----------------------------------------------------------------------------


def _describe_fn(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return str(name) if name else type(fn).__name__


def _settings(spec: Any) -> dict[str, Any]:
    if isinstance(spec, Mapping):
        items = dict(spec)
    elif dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        items = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    else:
        items = {k: v for k, v in vars(spec).items() if not k.startswith("_")}
    return {k: v for k, v in items.items() if k not in _HIDDEN_SETTINGS and v is not None}


def _stage_row(index: int, spec: Any) -> list[str]:
    name = getattr(spec, "name", None) or f"stage {index}"
    kind = getattr(spec, "kind", None) or type(spec).__name__.removesuffix("Spec").lower()
    fn = getattr(spec, "fn", None)
    what = _describe_fn(fn) if fn is not None else ""
    settings = ", ".join(f"{k}={_short(v)}" for k, v in _settings(spec).items())
    return [str(name), str(kind), what, settings]


def _short(value: Any, limit: int = 40) -> str:
    if callable(value):
        return _describe_fn(value)
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_STAGE_HEADERS = ("stage", "kind", "function", "settings")


def stages_text(stages: Sequence[Any], *, title: str = "Pipeline") -> str:
    """Render a pipeline's stage specs (source first) as a plain-text table."""
    rows = [_stage_row(i, s) for i, s in enumerate(stages)]
    return f"{title} with {len(rows)} stages\n" + table_text(_STAGE_HEADERS, rows)


def stages_html(stages: Sequence[Any], *, title: str = "Pipeline") -> str:
    """Render a pipeline's stage specs (source first) as an HTML table."""
    rows = [_stage_row(i, s) for i, s in enumerate(stages)]
    return table_html(_STAGE_HEADERS, rows, caption=f"{title} with {len(rows)} stages")
