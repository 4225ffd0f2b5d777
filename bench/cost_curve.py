"""The cost curve's table and chart: recall p50/p99 beside its floor, and write p50, per database size.

Not a bench itself: `python3 bench/recall_latency.py --curve docs --sizes 1k,10k,100k` measures and calls
`write`, which rewrites the generated block of DIR/cost-curve.md (between the markers; the prose around it
is kept) and DIR/cost-curve.svg. Stdlib only: the chart is SVG written by hand, log-log.
"""

from __future__ import annotations

import math
from pathlib import Path

FLEET_TABLES = ("memory_longterm", "memory_episodic", "memory_short")
BEGIN, END = "<!-- cost-curve:begin (bench/recall_latency.py --curve writes this block) -->", "<!-- cost-curve:end -->"
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
WIDTH, HEIGHT, MARGIN = 760, 460, 60


def table(points: dict[str, dict[str, dict]]) -> str:
    """Markdown: one row per size and line; recall against its floor, or write latency."""
    lines = [
        "| size | line | rows | recall p50 ms | recall p99 ms | floor p50 ms | p50 / floor | write p50 ms "
        "| write p99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, point in points.items():
        for name, figures in point.items():
            if "recall" in figures:
                recall, floor = figures["recall"], figures["floor"]
                cells = [
                    f"{recall['p50']:.2f}",
                    f"{recall['p99']:.2f}",
                    f"{floor['p50']:.2f}",
                    f"{recall['p50'] / floor['p50']:.2f}x",
                    "",
                    "",
                ]
            else:
                cells = ["", "", "", "", f"{figures['write']['p50']:.2f}", f"{figures['write']['p99']:.2f}"]
            lines.append(f"| {label} | {name} | {figures['rows']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def series(points: dict[str, dict[str, dict]]) -> dict[str, list[tuple[int, float]]]:
    """(rows, ms) per plotted line: each recall line's p50, p99 and floor p50, each write line's p50."""
    out: dict[str, list[tuple[int, float]]] = {}
    for point in points.values():
        for name, figures in point.items():
            if "recall" in figures:
                picks = {
                    "p50": figures["recall"]["p50"],
                    "p99": figures["recall"]["p99"],
                    "floor": figures["floor"]["p50"],
                }
            else:
                picks = {"p50": figures["write"]["p50"]}
            for kind, value in picks.items():
                out.setdefault(f"{name} {kind}", []).append((figures["rows"], value))
    return out


def svg(points: dict[str, dict[str, dict]], note: str) -> str:
    """A log-log chart of every series: solid p50, dashed p99, dotted floor; one colour per line."""
    plotted = series(points)
    xs = [x for values in plotted.values() for x, _ in values]
    ys = [y for values in plotted.values() for _, y in values if y > 0]
    x_lo, x_hi = math.floor(math.log10(min(xs))), math.ceil(math.log10(max(xs)))
    y_lo, y_hi = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    x_hi, y_hi = max(x_hi, x_lo + 1), max(y_hi, y_lo + 1)
    inner_w, inner_h = WIDTH - 2 * MARGIN - 200, HEIGHT - 2 * MARGIN

    def at(x: float, y: float) -> tuple[float, float]:
        px = MARGIN + (math.log10(x) - x_lo) / (x_hi - x_lo) * inner_w
        py = MARGIN + inner_h - (math.log10(max(y, 10**y_lo)) - y_lo) / (y_hi - y_lo) * inner_h
        return round(px, 1), round(py, 1)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
        'font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{MARGIN}" y="20" font-size="13">solos-memory: keyword recall and write latency by rows</text>',
        f'<text x="{MARGIN}" y="36" fill="#555">{escape(note)}</text>',
    ]
    for power in range(x_lo, x_hi + 1):
        px, _ = at(10**power, 10**y_lo)
        parts.append(f'<line x1="{px}" y1="{MARGIN}" x2="{px}" y2="{MARGIN + inner_h}" stroke="#ddd"/>')
        parts.append(f'<text x="{px}" y="{MARGIN + inner_h + 16}" text-anchor="middle">{10**power:,}</text>')
    for power in range(y_lo, y_hi + 1):
        _, py = at(10**x_lo, 10**power)
        parts.append(f'<line x1="{MARGIN}" y1="{py}" x2="{MARGIN + inner_w}" y2="{py}" stroke="#ddd"/>')
        parts.append(f'<text x="{MARGIN - 6}" y="{py + 4}" text-anchor="end">{10.0**power:g} ms</text>')
    parts.append(f'<text x="{MARGIN + inner_w / 2}" y="{HEIGHT - 16}" text-anchor="middle">rows</text>')
    lines = list(dict.fromkeys(name.rsplit(" ", 1)[0] for name in plotted))
    dashes = {"p50": "", "p99": ' stroke-dasharray="6 3"', "floor": ' stroke-dasharray="2 3"'}
    legend_y = MARGIN
    for number, line in enumerate(lines):
        colour = COLOURS[number % len(COLOURS)]
        for kind, dash in dashes.items():
            values = plotted.get(f"{line} {kind}")
            if not values:
                continue
            path = " ".join(f"{x},{y}" for x, y in (at(*v) for v in sorted(values)))
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
            for x, y in (at(*v) for v in values):
                parts.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"/>')
            legend_x = MARGIN + inner_w + 16
            parts.append(
                f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 24}" y2="{legend_y}" stroke="{colour}" '
                f'stroke-width="2"{dash}/>'
            )
            parts.append(f'<text x="{legend_x + 30}" y="{legend_y + 4}">{escape(line)} {kind}</text>')
            legend_y += 16
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write(folder: Path, points: dict[str, dict[str, dict]], note: str) -> list[Path]:
    """DIR/cost-curve.svg, and the generated block of DIR/cost-curve.md (created with just the block if new)."""
    folder.mkdir(parents=True, exist_ok=True)
    chart, doc = folder / "cost-curve.svg", folder / "cost-curve.md"
    chart.write_text(svg(points, note))
    block = f"{BEGIN}\n\n{note}\n\n![cost curve](cost-curve.svg)\n\n{table(points)}\n\n{END}"
    text = doc.read_text() if doc.exists() else f"# The cost curve\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)
    return [doc, chart]
