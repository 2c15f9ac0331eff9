"""The lab's pictures (the demos' SVG timelines) rendered and read back as pixels, by
Debian's rsvg-convert (librsvg2-bin, installed by ``make tools``; the tests skip without
it): what is inked, and whether anything is drawn past the picture's edge."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib

import pytest


def render(picture: str, pad: int = 0) -> tuple[int, int, list[bytearray]]:
    """The picture as rows of RGB pixels; ``pad``: drawn on a canvas that much larger, to
    see what falls outside the picture's own size."""
    rsvg = shutil.which("rsvg-convert")
    if rsvg is None:
        pytest.skip("rsvg-convert not installed (apt-get install librsvg2-bin)")
    if pad:
        size = re.search(r'width="(\d+)" height="(\d+)"', picture)
        assert size is not None
        w, h = int(size.group(1)) + pad, int(size.group(2)) + pad
        picture = picture.replace(size.group(0), f'width="{w}" height="{h}"', 1)
    png = subprocess.run(
        [rsvg, "--format=png", "--background-color=white"],
        input=picture.encode(), capture_output=True, check=True,
    ).stdout  # fmt: skip
    return decode(png)


def decode(png: bytes) -> tuple[int, int, list[bytearray]]:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what rsvg-convert writes) as RGB rows."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, data, width, height, channels = 8, b"", 0, 0, 4
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8
            assert colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            data += body
        at += 12 + length
    raw, stride, rows = zlib.decompress(data), width * channels, []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = previous[i], previous[i - channels] if i >= channels else 0
            line[i] = (line[i] + (0, a, b, (a + b) // 2, _paeth(a, b, c))[kind]) & 0xFF
        rows.append(bytearray(v for i, v in enumerate(line) if i % channels < 3))
        previous = line
    return width, height, rows


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def inked(rows: list[bytearray]) -> set[tuple[int, int]]:
    return {
        (x // 3, y)
        for y, row in enumerate(rows)
        for x in range(0, len(row), 3)
        if min(row[x : x + 3]) < 200  # darker than the faint grid lines
    }


def layer(picture: str, keep: str) -> str:
    """The picture with only its background and the elements starting with ``keep``."""
    lines = picture.splitlines()
    kept = [line for line in lines[2:-1] if line.startswith(keep)]
    return "\n".join([*lines[:2], *kept, lines[-1]])


def drawn_outside(picture: str) -> set[tuple[int, int]]:
    """The pixels inked past the picture's own width or height (drawn on a larger canvas)."""
    width, height, _ = render(picture)
    _, _, rows = render(picture, pad=200)
    return {(x, y) for x, y in inked(rows) if x >= width or y >= height}
