"""A small SVG line chart, written by hand so the benchmark needs no plotting library."""

from __future__ import annotations

from html import escape

__all__ = ["line_chart"]

_COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def line_chart(
    series: dict[str, list[tuple[float, float | None]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    hline: tuple[float, str] | None = None,
    dashed: frozenset[str] = frozenset(),
    width: int = 720,
    height: int = 440,
) -> str:
    """Lines of ``(x, y)`` points (``y=None`` is skipped), one per series (those named in
    ``dashed`` drawn dashed, in grey), plus an optional horizontal dashed line."""
    left, right, top, bottom = 70, 230, 40, 50
    xs = sorted({x for pts in series.values() for x, _ in pts}) or [0.0, 1.0]
    ys = [y for pts in series.values() for _, y in pts if y is not None]
    y_max = max([*ys, hline[0] if hline else 0.0, 1.0]) * 1.1
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:  # categorical x positions, evenly spaced
        i = xs.index(x)
        return left + (plot_w * i / (len(xs) - 1) if len(xs) > 1 else plot_w / 2)

    def py(y: float) -> float:
        return top + plot_h * (1 - y / y_max)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="14">{escape(title)}</text>']
    step = _nice_step(y_max)
    tick = 0.0
    while tick <= y_max:
        y = py(tick)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>')
        tick += step
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 18}" text-anchor="middle">'
                   f'{x:g}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 10}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    out.append(f'<text transform="translate(16,{top + plot_h / 2}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
               'stroke="#444"/>')
    legend_y = top + 10
    if hline is not None:
        y = py(hline[0])
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                   'stroke="#555" stroke-dasharray="6,4"/>')
        out.append(f'<line x1="{width - right + 12}" x2="{width - right + 36}" y1="{legend_y}" '
                   f'y2="{legend_y}" stroke="#555" stroke-dasharray="6,4"/>')
        out.append(f'<text x="{width - right + 42}" y="{legend_y + 4}">{escape(hline[1])}</text>')
        legend_y += 20
    for i, (name, pts) in enumerate(series.items()):
        colour = "#555" if name in dashed else _COLOURS[i % len(_COLOURS)]
        dash = ' stroke-dasharray="6,4"' if name in dashed else ""
        good = [(px(x), py(y)) for x, y in pts if y is not None]
        if len(good) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in good)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" '
                       f'stroke-width="2"{dash}/>')
        for x, y in good:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"/>')
        out.append(f'<line x1="{width - right + 12}" x2="{width - right + 36}" y1="{legend_y}" '
                   f'y2="{legend_y}" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{width - right + 42}" y="{legend_y + 4}">{escape(name)}</text>')
        legend_y += 20
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _nice_step(span: float) -> float:
    raw = span / 6
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    for mult in (1, 2, 2.5, 5, 10):
        if mult * magnitude >= raw:
            return mult * magnitude
    return 10 * magnitude
