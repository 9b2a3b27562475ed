"""8-bit greyscale PNG files through Pillow.

Legend: H image height, W image width.

Reading opens the file with the PNG plugin only and checks the declared size (and Pillow's
decompression-bomb limit) from the header before a single pixel is inflated; the pixels are decoded only
when the size is the expected one and the mode is 8-bit greyscale ``"L"`` (LRA's Pathfinder PNGs).
Anything unreadable raises :class:`~nystrom_lab.data.DataFileError` naming the file.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

from nystrom_lab.data.file_checks import DataFileError


def write_png(path: str | os.PathLike[str], image: np.ndarray) -> None:
    """Write ``image`` (H, W) uint8 as an 8-bit greyscale PNG."""
    if image.ndim != 2 or image.dtype != np.uint8 or image.size == 0:
        raise ValueError(
            f"image must be a non-empty (H, W) uint8 array, got shape {image.shape} dtype {image.dtype}"
        )
    Image.fromarray(np.ascontiguousarray(image)).save(path, format="PNG")


def read_png(path: str | os.PathLike[str], *, shape: tuple[int, int] | None = None) -> np.ndarray:
    """Read an 8-bit greyscale PNG file as (H, W) uint8; ``shape`` = the (H, W) it must declare.

    Raises ``FileNotFoundError`` when missing and :class:`~nystrom_lab.data.DataFileError` for a file that is
    not a PNG, is truncated or corrupt, is not 8-bit greyscale, declares another size than ``shape``, or
    declares more pixels than Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"PNG file not found: {p}")
    try:
        with warnings.catch_warnings():
            # Pillow only warns between MAX_IMAGE_PIXELS and twice that; an untrusted file gets no such slack
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p, formats=("PNG",)) as im:  # reads the header only
                if shape is not None and (im.height, im.width) != tuple(shape):
                    raise DataFileError(
                        p, f"expected a {shape[0]}x{shape[1]} image, the file declares {im.height}x{im.width}"
                    )
                if im.mode != "L":
                    raise DataFileError(
                        p, f"expected an 8-bit greyscale PNG (mode 'L'), got mode {im.mode!r}"
                    )
                im.load()
                return np.array(im, dtype=np.uint8)  # (H, W)
    except DataFileError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise DataFileError(p, f"refused as a decompression bomb ({exc})") from None
    except (
        Exception
    ) as exc:  # Pillow reports corrupt files as OSError, SyntaxError, ValueError, EOFError, ...
        raise DataFileError(p, f"not a readable PNG ({type(exc).__name__}: {exc})") from exc
