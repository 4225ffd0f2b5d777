"""A small RGB raster and its PNG encoding, standard library only: the benches' charts without Pillow.

Anti-aliased strokes of any width with butt ends, round joins and SVG's dash patterns, filled dots, and text
in X11's misc-fixed 5x8 font scaled by whole pixels. Coordinates are SVG's: pixel (x, y) covers the square
from (x, y) to (x + 1, y + 1), and text sits on its baseline. Colours are "#rgb" or "#rrggbb".
"""

from __future__ import annotations

import math
import struct
import unicodedata
import zlib
from collections.abc import Sequence

Point = tuple[float, float]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# X11's misc-fixed 5x8 (xfonts-base, "Public domain font.  Share and enjoy."), ASCII 32-126 in order, eleven
# glyphs a line from " ": each glyph is five columns left to right, two hex digits each, bit 0 the top row.
# One edit: "." is a 2x2 dot, as in misc-fixed 5x7; the 5x8 one is a small plus that reads as "+" in "0.1".
FONT = (
    "000000000000005e0000000e000e00147f147f14042a7f2a100016083400364936400000000e0000003c42000000423c00005438385400"
    "10107c10100080602000101010100000606000006010080600003c423c0000447e40006452524c00224a4e320018147e10002e4a4a3200"
    "3c4a4a300002621a0600344a4a34000c52523c00006c6c000000806c2c000018244200282828280000422418000004520c003c4299a51e"
    "7c12127c007e4a4a34003c424224007e42423c007e4a4a42007e0a0a02003c425234007e08087e0000427e420020423e02007e08344200"
    "7e404040007e0c0c7e007e0c387e003c42423c007e12120c003c5262bc007e12126c00244a52240000027e02003e40403e001e60601e00"
    "7e30307e006618186600060870080662524a4600007e42420006081060000042427e000004020400808080800000020400003048487800"
    "7e4848300000304848003048487e003068581000107c12040010a8a870007e0808700000487a40000040807a007e1010680000427e4000"
    "780870087078080870003048483000f828281000102828f80078100810000050582800083e482000384040780000384038003840304038"
    "483030480058a0a078004868584800082a55410000007e000041552a08000402040200"
)
GLYPH_WIDTH, GLYPH_HEIGHT, GLYPH_ASCENT = 5, 8, 7
# Close ASCII for what the notes and labels use; other characters lose their accents, or become "?".
SUBSTITUTES = {
    "\u2014": "--",  # em dash
    "\u2013": "-",  # en dash
    "\u2212": "-",  # minus
    "\u2264": "<=",
    "\u2265": ">=",
    "\u00d7": "x",
    "\u2026": "...",
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u00b5": "u",  # micro, as in us
}


def rgb(colour: str) -> tuple[int, int, int]:
    """A colour given as "#1f77b4" or "#ddd", as (r, g, b) bytes."""
    digits = colour.lstrip("#")
    if len(digits) == 3:
        digits = "".join(d * 2 for d in digits)
    return int(digits[0:2], 16), int(digits[2:4], 16), int(digits[4:6], 16)


def printable(text: str) -> str:
    """The text in the font's printable ASCII: substitutes, then accents dropped, then "?"."""
    out = []
    for char in text:
        if " " <= char <= "~":
            out.append(char)
        elif char in SUBSTITUTES:
            out.append(SUBSTITUTES[char])
        else:
            plain = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode()
            out.append(plain if plain and plain.isprintable() else "?")
    return "".join(out)


def text_width(text: str, scale: int = 1) -> int:
    """Pixels the text takes: the font is fixed-width."""
    return len(printable(text)) * GLYPH_WIDTH * scale


def dash_runs(points: Sequence[Point], dash: Sequence[float]) -> list[list[Point]]:
    """The drawn parts of a polyline: the pattern goes on across corners, as SVG's stroke-dasharray does."""
    if not dash:
        return [list(points)]
    pattern = list(dash) * (2 if len(dash) % 2 else 1)  # SVG repeats an odd list to make it even
    runs: list[list[Point]] = []
    index, left, drawing = 0, pattern[0], True
    current: list[Point] = [points[0]]
    for (x1, y1), (x2, y2) in zip(points, points[1:]):
        length, done = math.hypot(x2 - x1, y2 - y1), 0.0
        while length - done > left:
            done += left
            here = (x1 + (x2 - x1) * done / length, y1 + (y2 - y1) * done / length)
            if drawing:
                runs.append(current + [here])
            current, drawing = [here], not drawing
            index = (index + 1) % len(pattern)
            left = pattern[index]
        left -= length - done
        current.append((x2, y2))
    if drawing:
        runs.append(current)
    return runs


class Canvas:
    """A white RGB raster drawn on with SVG's geometry, then encoded as a PNG."""

    def __init__(self, width: int, height: int, background: str = "#fff") -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(rgb(background)) * (width * height))

    def blend(self, x: int, y: int, colour: tuple[int, int, int], coverage: float) -> None:
        """Mix colour into one pixel by the share of it covered (0-1); off-canvas pixels are ignored."""
        if coverage <= 0 or not (0 <= x < self.width and 0 <= y < self.height):
            return
        share, at = min(coverage, 1.0), (y * self.width + x) * 3
        for channel in range(3):
            old = self.pixels[at + channel]
            self.pixels[at + channel] = round(old + (colour[channel] - old) * share)

    def polyline(self, points: Sequence[Point], colour: str, width: float = 1, dash: Sequence[float] = ()) -> None:
        """A stroke through the points, optionally dashed (on, off, ... lengths in pixels)."""
        coverage: dict[tuple[int, int], float] = {}
        for run in dash_runs(points, dash):
            for start, end in zip(run, run[1:]):
                stroke(coverage, start, end, width / 2)
            for x, y in run[1:-1]:  # round joins fill the wedge that butt ends leave at a corner
                disc(coverage, x, y, width / 2)
        self.paint(coverage, colour)

    def paint(self, coverage: dict[tuple[int, int], float], colour: str) -> None:
        """Blend one shape's coverage in once, so a pixel two of its pieces touch is not painted twice."""
        shade = rgb(colour)
        for (x, y), amount in coverage.items():
            self.blend(x, y, shade, amount)

    def line(
        self, x1: float, y1: float, x2: float, y2: float, colour: str, width: float = 1, dash: Sequence[float] = ()
    ) -> None:
        """One straight stroke."""
        self.polyline([(x1, y1), (x2, y2)], colour, width, dash)

    def dot(self, x: float, y: float, radius: float, colour: str) -> None:
        """A filled circle."""
        coverage: dict[tuple[int, int], float] = {}
        disc(coverage, x, y, radius)
        self.paint(coverage, colour)

    def text(self, x: float, y: float, text: str, colour: str, scale: int = 1, anchor: str = "start") -> None:
        """Text on baseline y; anchor is SVG's text-anchor (start, middle or end); non-ASCII as printable()."""
        string, shade = printable(text), rgb(colour)
        shift = {"start": 0.0, "middle": 0.5, "end": 1.0}[anchor] * text_width(string, scale)
        left, top = round(x - shift), round(y) - GLYPH_ASCENT * scale
        for number, char in enumerate(string):
            at = (ord(char) - 32) * GLYPH_WIDTH * 2
            for column in range(GLYPH_WIDTH):
                bits = int(FONT[at + column * 2 : at + column * 2 + 2], 16)
                for row in range(GLYPH_HEIGHT):
                    if bits >> row & 1:
                        self.square(left + (number * GLYPH_WIDTH + column) * scale, top + row * scale, scale, shade)

    def square(self, x: int, y: int, size: int, shade: tuple[int, int, int]) -> None:
        """Fill a size by size square of whole pixels: one dot of the font, scaled."""
        for dy in range(size):
            for dx in range(size):
                self.blend(x + dx, y + dy, shade, 1.0)

    def png(self) -> bytes:
        """The raster as a PNG: 8-bit RGB, no interlace, every row unfiltered (filter byte 0)."""
        row_bytes = self.width * 3
        raw = b"".join(b"\0" + self.pixels[y * row_bytes : (y + 1) * row_bytes] for y in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, and the CRC-32 of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def stroke(coverage: dict[tuple[int, int], float], start: Point, end: Point, half: float) -> None:
    """Add a butt-ended segment's pixel coverage (by distance from each pixel's centre, so edges blend)."""
    (x1, y1), (x2, y2) = start, end
    length = math.hypot(x2 - x1, y2 - y1)
    if length == 0:
        return
    ux, uy, reach = (x2 - x1) / length, (y2 - y1) / length, half + 1
    for py in range(math.floor(min(y1, y2) - reach), math.ceil(max(y1, y2) + reach)):
        for px in range(math.floor(min(x1, x2) - reach), math.ceil(max(x1, x2) + reach)):
            dx, dy = px + 0.5 - x1, py + 0.5 - y1
            along, across = dx * ux + dy * uy, abs(dx * uy - dy * ux)
            amount = clamp(half + 0.5 - across) * clamp(min(along, length - along) + 0.5)
            if amount > coverage.get((px, py), 0.0):
                coverage[px, py] = amount


def disc(coverage: dict[tuple[int, int], float], x: float, y: float, radius: float) -> None:
    """Add a filled circle's pixel coverage."""
    for py in range(math.floor(y - radius - 1), math.ceil(y + radius + 1)):
        for px in range(math.floor(x - radius - 1), math.ceil(x + radius + 1)):
            amount = clamp(radius + 0.5 - math.hypot(px + 0.5 - x, py + 0.5 - y))
            if amount > coverage.get((px, py), 0.0):
                coverage[px, py] = amount


def clamp(amount: float) -> float:
    """A coverage held to 0-1."""
    return min(1.0, max(0.0, amount))
