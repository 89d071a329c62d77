"""A small PNG plot written with zlib and struct (no plotting library on an operator's host): time
to first token and latency (p50, p95) against concurrency, one coloured line each, on a white
canvas with axes; the numbers themselves are in the report's table."""

from __future__ import annotations

import struct
import zlib

WIDTH, HEIGHT, MARGIN = 480, 320, 32
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (210, 210, 210)
# (row key, colour): TTFT blue, latency red; p95 the darker shade.
SERIES = (
    ("ttft_p50", (90, 140, 230)),
    ("ttft_p95", (20, 60, 170)),
    ("latency_p50", (235, 110, 100)),
    ("latency_p95", (170, 20, 20)),
)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode(pixels: list[bytearray], width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (rows of width*3 bytes), each row with filter 0."""
    raw = b"".join(b"\x00" + bytes(row) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")
    )


class Canvas:
    def __init__(self, width: int = WIDTH, height: int = HEIGHT) -> None:
        self.width, self.height = width, height
        self.rows = [bytearray(WHITE * width) for _ in range(height)]

    def dot(self, x: int, y: int, colour: tuple[int, int, int], r: int = 0) -> None:
        for yy in range(y - r, y + r + 1):
            for xx in range(x - r, x + r + 1):
                if 0 <= xx < self.width and 0 <= yy < self.height:
                    self.rows[yy][xx * 3 : xx * 3 + 3] = bytes(colour)

    def line(self, a: tuple[int, int], b: tuple[int, int], colour: tuple[int, int, int]) -> None:
        steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
        for i in range(steps + 1):
            self.dot(round(a[0] + (b[0] - a[0]) * i / steps), round(a[1] + (b[1] - a[1]) * i / steps), colour, 1)

    def png(self) -> bytes:
        return encode(self.rows, self.width, self.height)


def points(rows: list[dict], key: str, top: float) -> list[tuple[int, int]]:
    """Where each level's ``key`` lands: x evenly by level, y from 0 (bottom) to ``top``."""
    span_x, span_y = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN
    out = []
    for i, row in enumerate(rows):
        if row.get(key) is None:
            continue
        x = MARGIN + (span_x * i // max(len(rows) - 1, 1))
        y = HEIGHT - MARGIN - round(span_y * row[key] / top) if top > 0 else HEIGHT - MARGIN
        out.append((x, y))
    return out


def plot(rows: list[dict]) -> bytes:
    """The plot of a concurrency run's rows (stats.summary plus "concurrency")."""
    canvas = Canvas()
    values = [r[k] for r in rows for k, _ in SERIES if r.get(k) is not None]
    top = max(values) * 1.1 if values else 1.0
    for i in range(1, 5):  # grid: quarters of the top value
        y = HEIGHT - MARGIN - (HEIGHT - 2 * MARGIN) * i // 4
        canvas.line((MARGIN, y), (WIDTH - MARGIN, y), GREY)
    canvas.line((MARGIN, HEIGHT - MARGIN), (WIDTH - MARGIN, HEIGHT - MARGIN), BLACK)
    canvas.line((MARGIN, MARGIN), (MARGIN, HEIGHT - MARGIN), BLACK)
    for key, colour in SERIES:
        pts = points(rows, key, top)
        for a, b in zip(pts, pts[1:], strict=False):
            canvas.line(a, b, colour)
        for p in pts:
            canvas.dot(p[0], p[1], colour, 3)
    return canvas.png()


NAMES = {"ttft_p50": "TTFT p50", "ttft_p95": "TTFT p95", "latency_p50": "latency p50", "latency_p95": "latency p95"}


def _hex(colour: tuple[int, int, int]) -> str:
    return "#" + "".join(f"{c:02x}" for c in colour)


def svg(rows: list[dict]) -> str:
    """The same plot as an SVG with its labels: each level's concurrency under the x axis, the
    seconds at each grid line, the axis titles and a legend (the PNG carries no text)."""
    values = [r[k] for r in rows for k, _ in SERIES if r.get(k) is not None]
    top = max(values) * 1.1 if values else 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH + 140}" height="{HEIGHT + 20}" font-size="10">']
    parts.append(f'<rect width="{WIDTH + 140}" height="{HEIGHT + 20}" fill="white"/>')
    for i in range(5):
        y = HEIGHT - MARGIN - (HEIGHT - 2 * MARGIN) * i // 4
        parts.append(f'<line x1="{MARGIN}" y1="{y}" x2="{WIDTH - MARGIN}" y2="{y}" stroke="{_hex(GREY)}"/>')
        parts.append(f'<text x="{MARGIN - 3}" y="{y + 3}" text-anchor="end">{top * i / 4:.3g}</text>')
    for x, row in zip((p[0] for p in points(rows, "concurrency", max(len(rows), 1))), rows, strict=False):
        parts.append(f'<text x="{x}" y="{HEIGHT - MARGIN + 12}" text-anchor="middle">{row["concurrency"]}</text>')
    parts.append(f'<text x="{WIDTH // 2}" y="{HEIGHT + 8}" text-anchor="middle">concurrency</text>')
    parts.append(f'<text x="4" y="{MARGIN - 10}">seconds</text>')
    for n, (key, colour) in enumerate(SERIES):
        pts = " ".join(f"{x},{y}" for x, y in points(rows, key, top))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{_hex(colour)}" stroke-width="2"/>')
        y = MARGIN + 14 * n
        parts.append(f'<rect x="{WIDTH}" y="{y - 8}" width="10" height="10" fill="{_hex(colour)}"/>')
        parts.append(f'<text x="{WIDTH + 14}" y="{y}">{NAMES[key]}</text>')
    return "\n".join([*parts, "</svg>"]) + "\n"


LEGEND = (
    "x: concurrency levels (evenly spaced), y: seconds from 0 to 1.1 x the largest value, grid at quarters; "
    "TTFT p50 light blue, TTFT p95 dark blue, latency p50 light red, latency p95 dark red"
)
