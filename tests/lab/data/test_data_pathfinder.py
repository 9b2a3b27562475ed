"""Pathfinder generator, PNG codec, release layout + metadata, and the folder loader."""

from __future__ import annotations

import resource
import struct
import zlib
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch

from nystrom_lab.data import DataFileError
from nystrom_lab.data.lra.pathfinder import PathfinderConfig
from nystrom_lab.data.lra.pathfinder_io import generate_pathfinder, load_pathfinder, read_metadata
from nystrom_lab.data.lra.pathfinder_sample import sample_pathfinder
from nystrom_lab.data.lra.png import read_png, write_png


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pf")
    generate_pathfinder(out, difficulty=14, count=24, seed=5, images_per_batch=10)
    return out


def test_config_matches_lra_pathfinder32() -> None:
    cfg = PathfinderConfig()
    assert (cfg.window, cfg.paddle_length, cfg.paddle_thickness, cfg.margin) == (32, 2, 0.5, 1)
    assert (cfg.marker_radius, cfg.seed_distance, cfg.continuity, cfg.antialias_scale) == (1.5, 7, 1.0, 2)
    assert (cfg.distractor_length, cfg.num_distractor_snakes) == (4, 5)
    assert (
        PathfinderConfig(contour_length=9).distractor_length,
        PathfinderConfig(contour_length=6).num_distractor_snakes,
    ) == (3, 10)


@pytest.mark.parametrize("length", [6, 9, 14])
def test_sample_shape_range_and_determinism(length: int) -> None:
    cfg = PathfinderConfig(contour_length=length)
    a = sample_pathfinder(cfg, np.random.default_rng(1), 1)
    b = sample_pathfinder(cfg, np.random.default_rng(1), 1)
    c = sample_pathfinder(cfg, np.random.default_rng(2), 1)
    assert a.shape == (32, 32) and a.dtype == np.uint8
    assert a.min() == 0 and a.max() == 255
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    lit = (a > 0).mean()  # two long targets plus distractors: a real fraction of the image is drawn
    assert 0.1 < lit < 0.7


def test_layout_and_metadata(folder: Path) -> None:
    root = folder / "curv_contour_length_14"
    assert sorted(p.name for p in (root / "metadata").iterdir()) == ["0.npy", "1.npy", "2.npy"]
    assert len(list((root / "imgs" / "2").glob("sample_*.png"))) == 4
    lines = (root / "metadata" / "1.npy").read_text().splitlines()
    assert len(lines) == 10
    fields = lines[3].split(" ")
    assert fields[:3] == ["imgs/1", "sample_3.png", "3"] and fields[3] in ("0", "1")
    assert fields[4:] == ["1.0", "14", "4", "2", "0.5", "1", "1"]


def test_labels_balanced_per_batch(folder: Path) -> None:
    meta = folder / "curv_contour_length_14" / "metadata"
    for name, n in (("0.npy", 10), ("1.npy", 10), ("2.npy", 4)):
        labels = [label for _, _, label in read_metadata(meta / name)]
        assert len(labels) == n and sum(labels) == n // 2


def test_same_seed_same_bytes_any_worker_count(tmp_path: Path, folder: Path) -> None:
    generate_pathfinder(tmp_path, difficulty=14, count=24, seed=5, images_per_batch=10, workers=2)
    ref, new = folder / "curv_contour_length_14", tmp_path / "curv_contour_length_14"
    files = sorted(p.relative_to(ref) for p in ref.rglob("*") if p.is_file())
    assert len(files) == 27
    assert all((ref / f).read_bytes() == (new / f).read_bytes() for f in files)
    generate_pathfinder(tmp_path / "s6", difficulty=14, count=2, seed=6)
    other = tmp_path / "s6" / "curv_contour_length_14" / "imgs" / "0" / "sample_0.png"
    assert other.read_bytes() != (ref / "imgs" / "0" / "sample_0.png").read_bytes()


def test_loader_reads_back_splits(folder: Path) -> None:
    train = load_pathfinder(folder, split="train", difficulty=14)
    dev = load_pathfinder(folder, split="dev", difficulty=14)
    test = load_pathfinder(folder / "curv_contour_length_14", split="test", difficulty=None)
    assert (len(train), len(dev), len(test)) == (19, 2, 3)  # int(0.8 * 24), int(0.9 * 24)
    x, y = train[3]
    assert x.shape == (1024,) and x.dtype == torch.int64 and y.dtype == torch.int64
    png = read_png(folder / "curv_contour_length_14" / "imgs" / "0" / "sample_3.png")
    assert torch.equal(x, torch.from_numpy(png.reshape(-1).astype(np.int64)))
    assert int(y) == read_metadata(folder / "curv_contour_length_14" / "metadata" / "0.npy")[3][2]
    assert int(x.min()) >= 0 and int(x.max()) <= 255


def test_png_round_trip_and_matplotlib_agrees(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for shape in [(32, 32), (1, 7), (5, 1), (17, 3)]:
        image = rng.integers(0, 256, size=shape, dtype=np.uint8)
        write_png(tmp_path / "a.png", image)
        assert np.array_equal(read_png(tmp_path / "a.png", shape=shape), image)
        theirs = mpimg.imread(tmp_path / "a.png")  # an independent decoder
        assert np.array_equal(np.rint(theirs * 255).astype(np.uint8), image)
    with pytest.raises(ValueError, match="non-empty"):
        write_png(tmp_path / "b.png", np.zeros((0, 3), dtype=np.uint8))


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def _png(width: int, height: int, idat: bytes, *, depth: int = 8, ctype: int = 0) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, ctype, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def _filtered_png(image: np.ndarray, ftype: int) -> bytes:
    """Reference encoder for one PNG filter type on every row (1 byte per pixel)."""
    h, w = image.shape
    img = image.astype(np.int64)
    rows = []
    for y in range(h):
        prior = img[y - 1] if y else np.zeros(w, dtype=np.int64)
        out = []
        for x in range(w):
            a = img[y, x - 1] if x else 0
            b, c = prior[x], (prior[x - 1] if x else 0)
            p = a + b - c
            paeth = (
                a
                if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c)
                else (b if abs(p - b) <= abs(p - c) else c)
            )
            pred = [0, a, b, (a + b) // 2, paeth][ftype]
            out.append((img[y, x] - pred) % 256)
        rows.append(bytes([ftype, *out]))
    return _png(w, h, zlib.compress(b"".join(rows)))


@pytest.mark.parametrize("ftype", [0, 1, 2, 3, 4])
def test_png_reader_handles_every_filter(tmp_path: Path, ftype: int) -> None:
    image = np.random.default_rng(ftype).integers(0, 256, size=(9, 13), dtype=np.uint8)
    (tmp_path / "f.png").write_bytes(_filtered_png(image, ftype))
    assert np.array_equal(read_png(tmp_path / "f.png"), image)


def test_png_errors_name_the_file(tmp_path: Path) -> None:
    rgba = tmp_path / "rgba.png"
    mpimg.imsave(rgba, np.zeros((4, 4)), cmap="gray")  # matplotlib writes RGBA
    with pytest.raises(
        DataFileError, match=r"rgba.png: expected an 8-bit greyscale PNG \(mode 'L'\), got mode 'RGBA'"
    ):
        read_png(rgba)
    write_png(tmp_path / "bad.png", np.zeros((4, 4), dtype=np.uint8))
    data = bytearray((tmp_path / "bad.png").read_bytes())
    data[30] ^= 0xFF  # inside IHDR: its CRC no longer matches
    (tmp_path / "bad.png").write_bytes(bytes(data))
    with pytest.raises(DataFileError, match="bad.png: not a readable PNG"):
        read_png(tmp_path / "bad.png")
    (tmp_path / "x.png").write_bytes(b"hello")
    with pytest.raises(DataFileError, match="x.png: not a readable PNG"):
        read_png(tmp_path / "x.png")
    (tmp_path / "cut.png").write_bytes(_filtered_png(np.ones((8, 8), dtype=np.uint8), 0)[:-30])
    with pytest.raises(DataFileError, match="cut.png: not a readable PNG"):
        read_png(tmp_path / "cut.png")
    with pytest.raises(FileNotFoundError, match="nope.png"):
        read_png(tmp_path / "nope.png")


def test_png_size_is_checked_before_inflating(tmp_path: Path) -> None:
    """A 125 kB file declaring 64000 x 64000 pixels (4 GB) with 128 MB of zeros behind it: refused from
    the header, by the expected size or by Pillow's decompression-bomb limit, before any pixel is decoded."""
    stream = zlib.compressobj(9)
    row = b"\x00" * 64001  # filter byte + one row
    idat = b"".join(stream.compress(row) for _ in range(2000)) + stream.flush()
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png(64000, 64000, idat))
    assert bomb.stat().st_size < 200_000
    with pytest.raises(
        DataFileError, match=r"bomb.png: expected a 32x32 image, the file declares 64000x64000|bomb"
    ):
        read_png(bomb, shape=(32, 32))
    with pytest.raises(DataFileError, match=r"bomb.png: refused as a decompression bomb"):
        read_png(bomb)
    small = tmp_path / "wide.png"  # under Pillow's limit, but not the size the task expects
    write_png(small, np.zeros((32, 64), dtype=np.uint8))
    with pytest.raises(DataFileError, match=r"wide.png: expected a 32x32 image, the file declares 32x64"):
        read_png(small, shape=(32, 32))


def test_png_data_beyond_the_declared_image_is_not_inflated(tmp_path: Path) -> None:
    """A 32x32 header with 100 MB of zeros in IDAT (100 kB on disk): decoding stops once 32x32 is full."""
    stream = zlib.compressobj(9)
    idat = b"".join(stream.compress(bytes(1 << 20)) for _ in range(100)) + stream.flush()
    (tmp_path / "z.png").write_bytes(_png(32, 32, idat))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert not read_png(tmp_path / "z.png", shape=(32, 32)).any()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 20_000  # KiB


def test_metadata_errors_name_file_and_line(tmp_path: Path, folder: Path) -> None:
    meta = tmp_path / "0.npy"
    meta.write_text("imgs/0 sample_0.png 0 1\nimgs/0 sample_1.png 1\n")
    with pytest.raises(
        DataFileError, match="0.npy line 2: expected at least 4 space-separated fields, got 3"
    ):
        read_metadata(meta)
    meta.write_text("imgs/0 sample_0.png 0 7\n")
    with pytest.raises(DataFileError, match="0.npy line 1: label"):
        read_metadata(meta)
    meta.write_bytes(b"imgs/0 sample_0.png 0 1\nimgs/0 sample_\xff.png 1 0\n")
    with pytest.raises(DataFileError, match="0.npy line 2: not UTF-8 text"):
        read_metadata(meta)
    meta.write_bytes(b"\n\n")
    with pytest.raises(DataFileError, match="0.npy: empty metadata file"):
        read_metadata(meta)
    np.save(tmp_path / "arr.npy", np.array([["imgs/0", "sample_0.png", "0", "1", "1.0"]]))
    assert read_metadata(tmp_path / "arr.npy") == [("imgs/0", "sample_0.png", 1)]
    np.save(tmp_path / "num.npy", np.zeros((2, 4)))
    with pytest.raises(DataFileError, match="num.npy: not a readable .npy string array"):
        read_metadata(tmp_path / "num.npy")
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, dtype="U20"))
    header["shape"] = (10**12,)  # 80 TB declared, 100 bytes held: refused before allocating
    with open(tmp_path / "huge.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"x" * 100)
    with pytest.raises(DataFileError, match="huge.npy: .* more than the file holds"):
        read_metadata(tmp_path / "huge.npy")
    # found by the fuzz tests: numpy raises SystemError converting a UCS-4 code unit above U+10FFFF
    cells = np.array([["imgs/0", "sample_0.png", "0", "1"]], dtype="<U12")
    raw = bytearray(cells.tobytes())
    raw[0:4] = (0x110000).to_bytes(4, "little")
    with open(tmp_path / "bad.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(cells))
        f.write(bytes(raw))
    with pytest.raises(DataFileError, match="bad.npy: .* invalid code point"):
        read_metadata(tmp_path / "bad.npy")
    np.save(tmp_path / "b.npy", np.array([[b"imgs/0", b"sample_\xff.png", b"0", b"1"]]))
    with pytest.raises(DataFileError, match="b.npy line 1: not UTF-8 text"):
        read_metadata(tmp_path / "b.npy")
    with pytest.raises(FileNotFoundError, match="metadata"):
        load_pathfinder(tmp_path / "nowhere", split="train")


def _one_batch(tmp_path: Path, lines: str) -> Path:
    root = tmp_path / "curv_baseline"
    (root / "imgs" / "0").mkdir(parents=True, exist_ok=True)
    (root / "metadata").mkdir(exist_ok=True)
    write_png(root / "imgs" / "0" / "sample_0.png", np.full((32, 32), 7, dtype=np.uint8))
    (root / "imgs" / "0" / "sample_1.png").write_bytes(b"")
    (root / "metadata" / "0.npy").write_text(lines)
    return root


def test_missing_and_empty_images(tmp_path: Path) -> None:
    _one_batch(tmp_path, "imgs/0 sample_0.png 0 1\nimgs/0 sample_1.png 1 0\n")
    train = load_pathfinder(tmp_path, split="train", difficulty=6)  # [:80%] of 2 rows = the first row
    assert len(train) == 1 and train.skipped == 0
    # [90%:] of 2 rows = the last row, an empty PNG: an empty split is an error before training, not after
    with pytest.raises(
        DataFileError, match=r"metadata: the test split holds no image: all 1 of its PNGs are empty"
    ):
        load_pathfinder(tmp_path, split="test", difficulty=6)
    with pytest.raises(DataFileError, match=r"sample_1.png: not a readable PNG"):
        load_pathfinder(tmp_path, split="test", difficulty=6, skip_empty_images=False)
    _one_batch(tmp_path, "imgs/0 sample_0.png 0 1\nimgs/0 sample_9.png 1 0\n")
    with pytest.raises(FileNotFoundError, match="0.npy line 2: image not found"):
        load_pathfinder(tmp_path, split="test", difficulty=6)


@pytest.mark.parametrize(
    "line",
    [
        "../../../etc passwd 0 1",
        "imgs/0 ../../../../secret.png 0 1",
        "/etc passwd 0 1",
        "imgs/0 /etc/passwd 0 1",
        "..\\..\\x sample_0.png 0 1",
        "C:/x sample_0.png 0 1",
    ],
)
def test_metadata_paths_stay_inside_the_folder(tmp_path: Path, line: str) -> None:
    root = _one_batch(tmp_path / "pf", f"imgs/0 sample_0.png 0 1\n{line}\n")
    outside = tmp_path / "secret.png"  # a real PNG outside the folder must not be read either
    write_png(outside, np.zeros((32, 32), dtype=np.uint8))
    with pytest.raises(DataFileError, match=r"0.npy line 2: path .* leaves the folder") as err:
        load_pathfinder(root, split="test", difficulty=None)
    assert err.value.line == 2 and err.value.path == root / "metadata" / "0.npy"


def test_pathfinder_png_of_the_wrong_size(tmp_path: Path) -> None:
    root = _one_batch(tmp_path, "imgs/0 sample_0.png 0 1\n")
    write_png(root / "imgs" / "0" / "sample_0.png", np.zeros((64, 64), dtype=np.uint8))
    with pytest.raises(DataFileError, match=r"sample_0.png: expected a 32x32 image, the file declares 64x64"):
        load_pathfinder(root, split="test", difficulty=None)  # [90%:] of one row is that row
    with pytest.raises(DataFileError, match=r"the train split holds no image: too few images listed"):
        load_pathfinder(root, split="train", difficulty=None)  # [:80%] of one row is empty


def _joined(drawn: np.ndarray, a: tuple[int, int], b: tuple[int, int], reach: int) -> bool:
    """Whether drawn pixels link ``a`` to ``b`` with hops of at most ``reach`` (Chebyshev)."""
    todo, seen = [a], {a}
    while todo:
        y, x = todo.pop()
        if (y, x) == b:
            return True
        for dy in range(-reach, reach + 1):
            for dx in range(-reach, reach + 1):
                p = (y + dy, x + dx)
                if p not in seen and 0 <= p[0] < drawn.shape[0] and 0 <= p[1] < drawn.shape[1] and drawn[p]:
                    seen.add(p)
                    todo.append(p)
    return False


@pytest.mark.parametrize("length", [6, 14])
def test_marker_tips_are_the_two_ends_of_one_target(length: int) -> None:
    from nystrom_lab.data.lra.pathfinder import _Canvas
    from nystrom_lab.data.lra.pathfinder_sample import _two_snakes

    cfg, rng, checked = PathfinderConfig(contour_length=length), np.random.default_rng(0), 0
    while checked < 5:
        cv = _Canvas(cfg, rng)
        pair = _two_snakes(cv)
        if pair is None:
            continue
        images, origins, terminals = pair
        for s in (0, 1):
            drawn = cv.window(images[s]) > 0
            assert drawn[origins[s]] and drawn[terminals[s]]
            # paddles are 2 * margin apart, plus up to 2 from the round-ups of translate_coord: hops <= 4
            assert _joined(drawn, tuple(origins[s]), tuple(terminals[s]), reach=4)
            assert abs(origins[s][0] - terminals[s][0]) + abs(origins[s][1] - terminals[s][1]) > 0
        checked += 1
