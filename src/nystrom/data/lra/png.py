"""A tiny exact PNG codec for 8-bit greyscale images (zlib + struct; PIL is not a dependency).

Legend: H image height, W image width.

Writes colour type 0, bit depth 8, no interlace, filter 0 on every row. Reads colour type 0 at bit
depth 8 with all five PNG row filters (encoders such as PIL choose filters adaptively), checking the
signature and every chunk CRC. Anything else (palette, RGB, 16-bit, interlaced) raises ``ValueError``
naming the file: LRA's Pathfinder PNGs are 8-bit greyscale.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def encode_png(image: np.ndarray, *, level: int = 6) -> bytes:
    """PNG bytes of ``image`` (H, W) uint8 (greyscale)."""
    if image.ndim != 2 or image.dtype != np.uint8:
        raise ValueError(f"image must be a (H, W) uint8 array, got shape {image.shape} dtype {image.dtype}")
    h, w = image.shape
    if h < 1 or w < 1:
        raise ValueError(f"image must be non-empty, got shape {image.shape}")
    rows = np.zeros((h, w + 1), dtype=np.uint8)  # (H, 1 + W): filter byte 0 then the row
    rows[:, 1:] = image
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return (
        _SIGNATURE
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), level))
        + _chunk(b"IEND", b"")
    )


def write_png(path: str | os.PathLike[str], image: np.ndarray) -> None:
    """Write ``image`` (H, W) uint8 as an 8-bit greyscale PNG."""
    Path(path).write_bytes(encode_png(image))


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(raw: np.ndarray, h: int, w: int, name: str) -> np.ndarray:
    """Undo the per-row PNG filters of ``raw`` (H, 1 + W) for 1 byte per pixel; returns (H, W) uint8."""
    out = np.zeros((h, w), dtype=np.uint8)  # (H, W)
    prior = np.zeros(w, dtype=np.uint8)  # (W,)
    for y in range(h):
        ftype, line = int(raw[y, 0]), raw[y, 1:]
        if ftype == 0:
            cur = line.copy()
        elif ftype == 1:  # Sub: running sum along the row, mod 256
            cur = (np.cumsum(line, dtype=np.int64) % 256).astype(np.uint8)
        elif ftype == 2:  # Up
            cur = line + prior
        elif ftype in (3, 4):  # Average and Paeth depend on the reconstructed left byte: sequential
            vals = [0] * w
            left = 0
            for x in range(w):
                up = int(prior[x])
                if ftype == 3:
                    pred = (left + up) >> 1
                else:
                    pred = _paeth(left, up, int(prior[x - 1]) if x else 0)
                left = (int(line[x]) + pred) & 0xFF
                vals[x] = left
            cur = np.asarray(vals, dtype=np.uint8)
        else:
            raise ValueError(f"{name}: row {y} has an invalid PNG filter type {ftype}")
        out[y] = cur
        prior = cur
    return out


def decode_png(data: bytes, *, name: str = "<bytes>") -> np.ndarray:
    """Decode 8-bit greyscale PNG ``data`` to (H, W) uint8; ``name`` labels errors."""
    if not data.startswith(_SIGNATURE):
        raise ValueError(f"{name}: not a PNG file (bad signature)")
    pos, header, idat = len(_SIGNATURE), None, []
    while True:
        if pos + 8 > len(data):
            raise ValueError(f"{name}: truncated PNG (no IEND chunk)")
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        crc_bytes = data[pos + 8 + length : pos + 12 + length]
        if len(body) != length or len(crc_bytes) != 4:
            raise ValueError(f"{name}: truncated PNG chunk {tag!r}")
        if struct.unpack(">I", crc_bytes)[0] != zlib.crc32(tag + body) & 0xFFFFFFFF:
            raise ValueError(f"{name}: CRC mismatch in PNG chunk {tag!r}")
        pos += 12 + length
        if tag == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
    if header is None:
        raise ValueError(f"{name}: PNG without IHDR chunk")
    w, h, depth, ctype, _, _, interlace = header
    if depth != 8 or ctype != 0 or interlace != 0:
        raise ValueError(
            f"{name}: only 8-bit greyscale non-interlaced PNGs are supported, got bit depth {depth},"
            f" colour type {ctype}, interlace {interlace}"
        )
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise ValueError(f"{name}: corrupt PNG image data ({exc})") from exc
    if len(raw) != h * (w + 1):
        raise ValueError(f"{name}: PNG image data has {len(raw)} bytes, expected {h * (w + 1)} for {h}x{w}")
    return _unfilter(np.frombuffer(raw, dtype=np.uint8).reshape(h, w + 1), h, w, name)


def read_png(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an 8-bit greyscale PNG file as (H, W) uint8."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"PNG file not found: {p}")
    return decode_png(p.read_bytes(), name=str(p))
