"""The cost curve's chart (bench/cost_curve.py, bench/png_canvas.py): a valid PNG that shows every series and its
text, the same shapes as SVG, and a redraw from the saved figures that gives the same table."""

import json
import struct
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import cost_curve
import png_canvas

POINTS = {
    "1k": {
        "fleet long,short": {"rows": 1_200, "recall": {"p50": 1.9, "p99": 3.81}, "floor": {"p50": 0.59}},
        "fleet writes": {"rows": 1_200, "write": {"p50": 1.01, "p99": 2.57}},
    },
    "100k": {
        "fleet long,short": {"rows": 111_000, "recall": {"p50": 7.55, "p99": 12.29}, "floor": {"p50": 1.58}},
        "fleet writes": {"rows": 111_000, "write": {"p50": 1.14, "p99": 4.47}},
    },
}
NOTE = "machine: 2 CPUs \u2014 figures \u2264 noisy"


def chunks(data: bytes) -> list[tuple[bytes, bytes, int]]:
    """(type, data, stored CRC) of every chunk after the signature."""
    found, at = [], len(png_canvas.PNG_SIGNATURE)
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        found.append((kind, body, crc))
        at += 12 + length
    return found


def decoded(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the raw scanlines (a filter byte, then RGB) of our PNG."""
    parts = chunks(data)
    width, height = struct.unpack(">II", parts[0][1][:8])
    return width, height, zlib.decompress(b"".join(body for kind, body, _ in parts if kind == b"IDAT"))


def pixels(width: int, raw: bytes, rows: range) -> set[tuple[int, int, int]]:
    """The colours present in those rows."""
    stride = 1 + 3 * width
    return {tuple(raw[y * stride + 1 + 3 * x : y * stride + 4 + 3 * x]) for y in rows for x in range(width)}


def test_the_png_is_well_formed_and_the_charts_size():
    data = cost_curve.png(cost_curve.chart(POINTS, NOTE))
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    parts = chunks(data)
    assert [kind for kind, _, _ in parts][0] == b"IHDR" and parts[-1][0] == b"IEND"
    assert all(zlib.crc32(kind + body) == crc for kind, body, crc in parts)
    width, height, raw = decoded(data)
    assert (width, height) == (cost_curve.WIDTH, cost_curve.HEIGHT)
    assert parts[0][1][8:] == bytes([8, 2, 0, 0, 0])  # 8-bit RGB, no interlace
    assert len(raw) == height * (1 + 3 * width)
    assert all(raw[y * (1 + 3 * width)] == 0 for y in range(height))


def test_the_png_shows_every_series_and_its_text():
    width, height, raw = decoded(cost_curve.png(cost_curve.chart(POINTS, NOTE)))
    colours = pixels(width, raw, range(height))
    assert png_canvas.rgb("#1f77b4") in colours and png_canvas.rgb("#d62728") in colours
    title_band = pixels(width, raw, range(0, 24))
    assert any(max(colour) < 0x55 for colour in title_band)
    note_band = pixels(width, raw, range(28, 38))
    assert png_canvas.rgb("#555") in note_band


def test_text_outside_ascii_is_drawn_as_ascii():
    assert png_canvas.printable("p50 \u2264 2.0x \u2014 caf\u00e9 \u2603") == "p50 <= 2.0x -- cafe ?"


def test_dashes_go_on_across_corners():
    runs = png_canvas.dash_runs([(0, 0), (4, 0), (4, 10)], (6, 3))
    assert runs == [[(0, 0), (4, 0), (4, 2.0)], [(4, 5.0), (4, 10)]]


def test_the_svg_draws_the_same_shapes():
    shapes = cost_curve.chart(POINTS, NOTE)
    text = cost_curve.svg(shapes)
    assert text.count("<polyline") == sum(isinstance(shape, cost_curve.Polyline) for shape in shapes) == 4
    assert text.count("<circle") == 8 and 'stroke-dasharray="6 3"' in text and 'stroke-dasharray="2 3"' in text


def test_write_then_redraw_from_the_json(tmp_path):
    written = cost_curve.write(tmp_path, POINTS, NOTE)
    names = {path.name for path in written}
    assert names == {"cost-curve.md", "cost-curve.png", "cost-curve.svg", "cost-curve.json"}
    doc = (tmp_path / "cost-curve.md").read_text()
    assert cost_curve.BEGIN in doc and cost_curve.END in doc and cost_curve.table(POINTS) in doc
    assert "![cost curve](cost-curve.png)" in doc and "(cost-curve.svg)" in doc
    assert json.loads((tmp_path / "cost-curve.json").read_text()) == {"note": NOTE, "points": POINTS}

    prose = "# The cost curve\n\nProse kept.\n\n"
    (tmp_path / "cost-curve.md").write_text(f"{prose}{cost_curve.BEGIN}\nold\n{cost_curve.END}\n")
    for stale in ("cost-curve.png", "cost-curve.svg"):
        (tmp_path / stale).unlink()
    assert cost_curve.main([str(tmp_path)]) == 0
    redrawn = (tmp_path / "cost-curve.md").read_text()
    assert redrawn.startswith(prose) and "\nold\n" not in redrawn
    assert redrawn.split(cost_curve.BEGIN)[1] == doc.split(cost_curve.BEGIN)[1]
    assert (tmp_path / "cost-curve.png").read_bytes() == cost_curve.png(cost_curve.chart(POINTS, NOTE))
