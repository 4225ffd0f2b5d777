"""The cost curve's table and chart: recall p50/p99 beside its floor, and write p50, per database size.

Not a bench itself: `python3 bench/recall_latency.py --curve docs --sizes 1k,10k,100k` measures and calls
`write`, which rewrites the generated block of DIR/cost-curve.md (between the markers; the prose around it
is kept), draws the chart as DIR/cost-curve.png and DIR/cost-curve.svg, and keeps the figures in
DIR/cost-curve.json. `python3 bench/cost_curve.py DIR` redraws all of it from that json, measuring nothing.
Stdlib only: the chart, log-log, is a list of shapes that `svg` writes as text and `png` rasterises
(png_canvas.py).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import png_canvas

FLEET_TABLES = ("memory_longterm", "memory_episodic", "memory_short")
BEGIN, END = "<!-- cost-curve:begin (bench/recall_latency.py --curve writes this block) -->", "<!-- cost-curve:end -->"
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
DASHES = {"p50": (), "p99": (6, 3), "floor": (2, 3)}  # solid, dashed, dotted
WIDTH, HEIGHT, MARGIN = 760, 460, 60
FONT_SIZE, TITLE_SIZE = 11, 13
TITLE = "solos-memory: keyword recall and write latency by rows"


@dataclass(frozen=True)
class Line:
    """A straight stroke; dash is SVG's stroke-dasharray, empty for solid."""

    x1: float
    y1: float
    x2: float
    y2: float
    colour: str
    width: float = 1
    dash: tuple[float, ...] = ()


@dataclass(frozen=True)
class Polyline:
    """A stroke through points, in order."""

    points: tuple[tuple[float, float], ...]
    colour: str
    width: float = 1
    dash: tuple[float, ...] = ()


@dataclass(frozen=True)
class Dot:
    """A filled circle."""

    x: float
    y: float
    radius: float
    colour: str


@dataclass(frozen=True)
class Text:
    """A label on baseline y; anchor is SVG's text-anchor: start, middle or end."""

    x: float
    y: float
    text: str
    size: int = FONT_SIZE
    colour: str = "#000"
    anchor: str = "start"


Shape = Line | Polyline | Dot | Text


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


def chart(points: dict[str, dict[str, dict]], note: str) -> list[Shape]:
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

    shapes: list[Shape] = [Text(MARGIN, 20, TITLE, size=TITLE_SIZE), Text(MARGIN, 36, note, colour="#555")]
    for power in range(x_lo, x_hi + 1):
        px, _ = at(10**power, 10**y_lo)
        shapes.append(Line(px, MARGIN, px, MARGIN + inner_h, "#ddd"))
        shapes.append(Text(px, MARGIN + inner_h + 16, f"{10**power:,}", anchor="middle"))
    for power in range(y_lo, y_hi + 1):
        _, py = at(10**x_lo, 10**power)
        shapes.append(Line(MARGIN, py, MARGIN + inner_w, py, "#ddd"))
        shapes.append(Text(MARGIN - 6, py + 4, f"{10.0**power:g} ms", anchor="end"))
    shapes.append(Text(MARGIN + inner_w / 2, HEIGHT - 16, "rows", anchor="middle"))
    lines = list(dict.fromkeys(name.rsplit(" ", 1)[0] for name in plotted))
    legend_x, legend_y = MARGIN + inner_w + 16, MARGIN
    for number, line in enumerate(lines):
        colour = COLOURS[number % len(COLOURS)]
        for kind, dash in DASHES.items():
            values = plotted.get(f"{line} {kind}")
            if not values:
                continue
            shapes.append(Polyline(tuple(at(*v) for v in sorted(values)), colour, 2, dash))
            shapes.extend(Dot(*at(*v), 2.5, colour) for v in values)
            shapes.append(Line(legend_x, legend_y, legend_x + 24, legend_y, colour, 2, dash))
            shapes.append(Text(legend_x + 30, legend_y + 4, f"{line} {kind}"))
            legend_y += 16
    return shapes


def svg(shapes: list[Shape]) -> str:
    """The shapes as an SVG document, WIDTH by HEIGHT on white."""
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
        f'font-size="{FONT_SIZE}">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
    ]
    for shape in shapes:
        match shape:
            case Line(x1, y1, x2, y2, colour):
                ends = f'x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}"'
                parts.append(f'<line {ends} stroke="{colour}"{stroke_attributes(shape)}/>')
            case Polyline(points, colour):
                path = " ".join(f"{x},{y}" for x, y in points)
                parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}"{stroke_attributes(shape)}/>')
            case Dot(x, y, radius, colour):
                parts.append(f'<circle cx="{x}" cy="{y}" r="{radius}" fill="{colour}"/>')
            case Text(x, y, text, size, colour, anchor):
                style = "" if size == FONT_SIZE else f' font-size="{size}"'
                style += "" if colour == "#000" else f' fill="{colour}"'
                style += "" if anchor == "start" else f' text-anchor="{anchor}"'
                parts.append(f'<text x="{x}" y="{y}"{style}>{escape(text)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def stroke_attributes(shape: Line | Polyline) -> str:
    """SVG attributes for a stroke's width and dashes, when not the defaults."""
    width = "" if shape.width == 1 else f' stroke-width="{shape.width}"'
    dash = "" if not shape.dash else f' stroke-dasharray="{" ".join(f"{d:g}" for d in shape.dash)}"'
    return width + dash


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def png(shapes: list[Shape]) -> bytes:
    """The shapes rasterised, WIDTH by HEIGHT on white; the title's font at twice the labels' size."""
    canvas = png_canvas.Canvas(WIDTH, HEIGHT)
    for shape in shapes:
        match shape:
            case Line(x1, y1, x2, y2, colour, width, dash):
                canvas.line(x1, y1, x2, y2, colour, width, dash)
            case Polyline(points, colour, width, dash):
                canvas.polyline(points, colour, width, dash)
            case Dot(x, y, radius, colour):
                canvas.dot(x, y, radius, colour)
            case Text(x, y, text, size, colour, anchor):
                canvas.text(x, y, text, colour, scale=2 if size > FONT_SIZE else 1, anchor=anchor)
    return canvas.png()


def write(folder: Path, points: dict[str, dict[str, dict]], note: str) -> list[Path]:
    """DIR/cost-curve.{json,png,svg}, and the generated block of DIR/cost-curve.md (created if new)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc, figures = folder / "cost-curve.md", folder / "cost-curve.json"
    raster, vector = folder / "cost-curve.png", folder / "cost-curve.svg"
    figures.write_text(json.dumps({"note": note, "points": points}, indent=1) + "\n")
    shapes = chart(points, note)
    raster.write_bytes(png(shapes))
    vector.write_text(svg(shapes))
    image = f"![cost curve]({raster.name}) ([SVG]({vector.name}))"
    block = f"{BEGIN}\n\n{note}\n\n{image}\n\n{table(points)}\n\n{END}"
    text = doc.read_text() if doc.exists() else f"# The cost curve\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)
    return [doc, raster, vector, figures]


def main(argv: list[str] | None = None) -> int:
    """Redraw DIR's chart and table from DIR/cost-curve.json, without measuring."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("folder", type=Path, help="the folder holding cost-curve.json (e.g. docs)")
    args = parser.parse_args(argv)
    saved = json.loads((args.folder / "cost-curve.json").read_text())
    written = write(args.folder, saved["points"], saved["note"])
    print("written: " + ", ".join(str(path) for path in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
