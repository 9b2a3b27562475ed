"""Pathfinder folders as in the LRA release: PNG images plus per-batch metadata, written and read back.

Legend: N images, W window (32).

Layout (snakes2 ``from_wrapper`` + LRA ``lra_benchmarks/data/pathfinder.py``), under one root::

    curv_baseline/            contour length 6  (LRA split "easy")
    curv_contour_length_9/    contour length 9  ("intermediate")
    curv_contour_length_14/   contour length 14 ("hard")
        imgs/<batch>/sample_<i>.png      8-bit greyscale W x W
        metadata/<batch>.npy             one text line per image

A metadata line holds snakes2 ``accumulate_meta``'s fields separated by spaces: ``imgs/<batch>
sample_<i>.png <i> <label> <continuity> <contour_length> <distractor_length> <paddle_length>
<paddle_thickness> <margin> <n_paddle_contrasts>``. LRA's reader splits each line on ``' '`` and uses
fields 0, 1 (path) and 3 (label), so despite the ``.npy`` name the release files are text; the reader here
also accepts a real ``np.save`` string array. Images are seeded per batch from ``SeedSequence([seed,
contour_length, batch])``, so the output never depends on the number of workers; labels are a balanced
random permutation within each batch.
"""

from __future__ import annotations

import io
import math
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from tokenize import TokenError

import numpy as np

from nystrom_lab.data.constants import DIFFICULTY_DIRS
from nystrom_lab.data.file_checks import DataFileError, decode_utf8, path_inside
from nystrom_lab.data.lra.dataset import PixelDataset
from nystrom_lab.data.lra.pathfinder import PathfinderConfig
from nystrom_lab.data.lra.pathfinder_sample import sample_pathfinder
from nystrom_lab.data.lra.png import read_png, write_png

SPLIT_FRACTIONS = {"train": (0.0, 0.8), "dev": (0.8, 0.9), "test": (0.9, 1.0)}  # LRA's tfds slices


def _metadata_line(cfg: PathfinderConfig, batch: int, i: int, label: int) -> str:
    fields = (f"imgs/{batch}", f"sample_{i}.png", i, label, float(cfg.continuity), cfg.contour_length)
    fields += (cfg.distractor_length, cfg.paddle_length, float(cfg.paddle_thickness), cfg.margin, 1)
    return " ".join(str(f) for f in fields)


def write_batch(task: tuple[Path, PathfinderConfig, int, int, int]) -> int:
    """Write batch ``batch`` of ``n`` images under ``root``; a picklable worker job. Returns ``n``."""
    root, cfg, seed, batch, n = task
    rng = np.random.default_rng(np.random.SeedSequence([seed, cfg.contour_length, batch]))
    labels = rng.permutation(np.arange(n) % 2)  # (n,) balanced
    img_dir = root / "imgs" / str(batch)
    img_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        write_png(img_dir / f"sample_{i}.png", sample_pathfinder(cfg, rng, int(labels[i])))
        lines.append(_metadata_line(cfg, batch, i, int(labels[i])))
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    (root / "metadata" / f"{batch}.npy").write_text("\n".join(lines) + "\n", encoding="ascii")
    return n


def generate_pathfinder(
    out_dir: str | os.PathLike[str],
    *,
    difficulty: int = 14,
    count: int = 1000,
    seed: int = 0,
    images_per_batch: int = 1000,
    workers: int = 1,
    config: PathfinderConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Generate ``count`` images of ``difficulty`` (contour length 6, 9 or 14) under ``out_dir``.

    Returns the difficulty folder (e.g. ``out_dir/curv_contour_length_14``). ``config`` overrides the
    snakes2 settings (its ``contour_length`` must equal ``difficulty``). ``progress(k)`` is called per batch.
    """
    if difficulty not in DIFFICULTY_DIRS:
        raise ValueError(f"difficulty must be one of {sorted(DIFFICULTY_DIRS)}, got {difficulty!r}")
    cfg = config or PathfinderConfig(contour_length=difficulty)
    if cfg.contour_length != difficulty:
        raise ValueError(f"config.contour_length={cfg.contour_length} differs from difficulty={difficulty}")
    for name, v in (("count", count), ("images_per_batch", images_per_batch), ("workers", workers)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    root = Path(out_dir) / DIFFICULTY_DIRS[difficulty]
    sizes = [
        min(images_per_batch, count - b * images_per_batch) for b in range(-(-count // images_per_batch))
    ]
    tasks = [(root, cfg, seed, b, n) for b, n in enumerate(sizes)]
    if workers == 1:
        results = map(write_batch, tasks)
        for n in results:
            if progress is not None:
                progress(n)
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for n in pool.imap(write_batch, tasks):
                if progress is not None:
                    progress(n)
    return root


def _npy_rows(p: Path, raw: bytes) -> list[list[str]]:
    """Rows of an ``np.save`` string array, its declared size checked against the file before loading."""
    buf = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(buf)
        if version not in ((1, 0), (2, 0)):  # np.save writes 1.0 (2.0 for huge headers)
            raise ValueError(f"unsupported .npy format version {version}")
        read_header = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read_header(buf)
        if dtype.kind not in "US" or len(shape) > 2:
            raise ValueError(f"expected a 1-D or 2-D string array, got {dtype} with shape {shape}")
        if math.prod(shape) * dtype.itemsize > len(raw) - buf.tell():
            raise ValueError(f"the header declares {shape} {dtype}, more than the file holds")
        array = np.atleast_2d(np.load(io.BytesIO(raw), allow_pickle=False))
        if dtype.kind == "U":  # UCS-4 code units: numpy crashes (SystemError) on invalid ones, check first
            codes = np.frombuffer(array.tobytes(), dtype=np.dtype(dtype.str[0] + "u4"))
            if ((codes > 0x10FFFF) | ((codes >= 0xD800) & (codes <= 0xDFFF))).any():
                raise ValueError("a string holds an invalid code point")
            return [[str(x) for x in row] for row in array.tolist()]
        return [[decode_utf8(x, p, i) for x in row] for i, row in enumerate(array.tolist(), start=1)]
    except (ValueError, SyntaxError, TokenError) as exc:  # numpy's header parser raises all three
        if isinstance(exc, DataFileError):
            raise
        raise DataFileError(p, f"not a readable .npy string array ({exc})") from None


def read_metadata(path: str | os.PathLike[str]) -> list[tuple[str, str, int]]:
    """Rows ``(subdir, filename, label)`` of one metadata file (text lines, or an ``np.save`` array).

    Raises :class:`~nystrom_lab.data.DataFileError` naming the file and the 1-based line for an empty file,
    fewer than 4 fields, undecodable bytes or a label not 0/1. The paths are checked by the loader.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Pathfinder metadata file not found: {p}")
    raw = p.read_bytes()
    if raw.startswith(b"\x93NUMPY"):
        rows = _npy_rows(p, raw)
    else:
        rows = [decode_utf8(line, p, i).split() for i, line in enumerate(raw.split(b"\n"), start=1)]
    out = []
    for lineno, fields in enumerate(rows, start=1):
        if not fields:  # the trailing newline; LRA drops the last empty piece too
            continue
        if len(fields) < 4:
            raise DataFileError(
                p, f"expected at least 4 space-separated fields, got {len(fields)}", line=lineno
            )
        if fields[3] not in ("0", "1"):
            raise DataFileError(p, f"label (field 4) must be 0 or 1, got {fields[3][:20]!r}", line=lineno)
        out.append((fields[0], fields[1], int(fields[3])))
    if not out:
        raise DataFileError(p, "empty metadata file (no image lines)")
    return out


def _batch_key(path: Path) -> tuple[int, str]:
    return (int(path.stem), "") if path.stem.isdigit() else (1 << 62, path.stem)


def load_pathfinder(
    root: str | os.PathLike[str],
    *,
    split: str,
    difficulty: int | None = 14,
    image_size: int = 32,
    skip_empty_images: bool = True,
) -> PixelDataset:
    """Pathfinder ``split`` (train/dev/test) as pixel tokens: items ``((W*W,) int64 0..255, label)``.

    ``root`` holds the difficulty folders (e.g. ``lra_release/pathfinder32``), or is one of them when
    ``difficulty`` is None. Metadata files are read in batch order and the list is cut 80/10/10 like LRA's
    ``[:80%]``, ``[80%:90%]``, ``[90%:]``. Zero-byte PNGs (present in the release) are skipped as LRA's
    pipeline does when ``skip_empty_images``; the count is in ``dataset.skipped``.
    """
    if split not in SPLIT_FRACTIONS:
        raise ValueError(f"split must be one of {tuple(SPLIT_FRACTIONS)}, got {split!r}")
    if difficulty is not None and difficulty not in DIFFICULTY_DIRS:
        raise ValueError(f"difficulty must be one of {sorted(DIFFICULTY_DIRS)} or None, got {difficulty!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    base = Path(root) / DIFFICULTY_DIRS[difficulty] if difficulty is not None else Path(root)
    meta_dir = base / "metadata"
    if not meta_dir.is_dir():
        raise FileNotFoundError(f"Pathfinder metadata folder not found: {meta_dir}")
    files = sorted(meta_dir.glob("*.npy"), key=_batch_key)
    if not files:
        raise FileNotFoundError(f"no metadata/*.npy files in {meta_dir}")
    entries = [(f, i + 1, row) for f in files for i, row in enumerate(read_metadata(f))]
    lo, hi = SPLIT_FRACTIONS[split]
    entries = entries[int(lo * len(entries)) : int(hi * len(entries))]
    pixels = np.zeros((len(entries), image_size * image_size), dtype=np.uint8)  # (N, W*W)
    labels = np.zeros(len(entries), dtype=np.int64)
    kept = 0
    for meta, lineno, (subdir, filename, label) in entries:
        folder = path_inside(base, subdir, source=meta, line=lineno)  # each field alone is relative
        img_path = path_inside(folder, filename, source=meta, line=lineno)
        if not img_path.is_file():
            raise FileNotFoundError(f"{meta} line {lineno}: image not found: {img_path}")
        if skip_empty_images and img_path.stat().st_size == 0:
            continue
        image = read_png(img_path, shape=(image_size, image_size))
        pixels[kept], labels[kept] = image.reshape(-1), label
        kept += 1
    if kept == 0:
        why = (
            f"all {len(entries)} of its PNGs are empty"
            if entries
            else "too few images listed for a 80/10/10 cut"
        )
        raise DataFileError(meta_dir, f"the {split} split holds no image: {why}")
    source = f"{base} [{split}]"
    return PixelDataset(pixels[:kept], labels[:kept], source=source, skipped=len(entries) - kept)
