"""A PNG writer in a few lines of standard library: 8-bit RGB, no filtering, zlib."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """A PNG of `rgb`: width x height pixels, 3 bytes each, row by row from the top."""
    stride = width * 3
    if width <= 0 or height <= 0 or len(rgb) != stride * height:
        raise ValueError(f"{len(rgb)} bytes are not a {width}x{height} RGB image")
    # Each row starts with its filter type; 0 (none) keeps this writer trivial.
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 6))
        + _chunk(b"IEND", b"")
    )


def write_png(path: Path, width: int, height: int, rgb: bytes) -> None:
    """Write the PNG whole or not at all: to a file beside `path`, renamed over it, so a
    reader never sees half an image (nor does a writer that died midway leave one)."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        part.write_bytes(encode_png(width, height, rgb))
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
