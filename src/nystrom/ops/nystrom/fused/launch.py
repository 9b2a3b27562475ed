"""Tile sizes, split counts, the device guard and the one launch helper of the fused kernels.

Legend: n tokens, BH programs rows (b·h), BN token block.

Every Triton launch goes through :func:`launch`, which counts it (the tests hold the launches per call
exact: five forward, four backward) and applies :func:`tuned` overrides. Every launch runs inside
:func:`on_device`: Triton launches on the *current* CUDA device and its current stream, so the op makes
the inputs' device current first (flash-linear-attention's ``input_guard``).
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Iterator, Mapping

import torch

#: launches per kernel name since the process started (read by the tests and the GPU script)
LAUNCHES: collections.Counter[str] = collections.Counter()

#: programs per (b, h) row the split passes aim at, times the device's multiprocessors
_WAVES = 2
#: the token block of the passes over n (a ``tuned`` override may change it per pass)
TOKEN_BLOCK = 64
#: ``tl.dot`` input precisions the per-head kernels' float32 m×m products may take (``PINV_DOT``): IEEE on
#: CUDA cores, or three TF32 / six bfloat16 tensor-core products, each within 2× IEEE's error of the pinv
#: (tests/ops/test_pinv_dot_precision.py; plain "tf32" is ~1000× off, "bf16x3" ~30×). The GPU sweep times them.
PINV_DOTS = ("ieee", "tf32x3", "bf16x6")
#: the per-head kernels' choice until a GPU run picks the fastest
PINV_DOT = "ieee"

_settings: dict[str, object] = {"programs": None, "tuned": {}}


def block(size: int) -> int:
    """A tile side for ``size``: the next power of two, at least 16 (``tl.dot``'s smallest)."""
    return max(16, 1 << (size - 1).bit_length())


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """The large products' ``tl.dot`` options for inputs of ``dtype``: ``DOT``, the operands' dtype, and
    ``PRECISION``: IEEE for float32 (PyTorch's matmuls default to it; TF32 would round to 10 bits).

    Under Triton's interpreter bfloat16 operands are multiplied as float32 (exact products and float32
    sums, what the tensor cores compute): Triton 3.9's interpreter multiplies bfloat16 tiles' bit
    patterns as integers (numpy has no bfloat16)."""
    import triton.language as tl

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if dtype == torch.float32 or (interpreted and dtype == torch.bfloat16):
        return {"DOT": tl.float32, "PRECISION": "ieee"}
    return {"DOT": {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype], "PRECISION": "tf32"}


@contextlib.contextmanager
def split_programs(programs: int) -> Iterator[None]:
    """Within the block the passes that cut n aim at ``programs`` programs per call instead of
    ``_WAVES`` × the device's multiprocessors: forces several splits on a CPU (where the interpreter
    sees one multiprocessor), so the tests run the multi-program paths (the key pass's combine, the
    backward's split sums) that a GPU runs."""
    if not isinstance(programs, int) or programs < 1:
        raise ValueError(f"programs must be a positive int, got {programs!r}")
    before = _settings["programs"]
    _settings["programs"] = programs
    try:
        yield
    finally:
        _settings["programs"] = before


def splits(n: int, bh: int, bn: int, device: torch.device) -> tuple[int, int]:
    """(tokens per split, splits) for the passes that cut n: enough programs for ``_WAVES`` waves over
    the device's multiprocessors (or :func:`split_programs`'), each split a whole number of ``bn`` blocks."""
    programs = _settings["programs"]
    if programs is None:
        units = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        programs = _WAVES * units
    want = max(1, -(-programs // bh))  # splits per (b, h)
    blocks = -(-n // bn)
    per_split = -(-blocks // min(want, blocks)) * bn
    return per_split, -(-n // per_split)


#: the input dtypes' keys in :data:`.configs.WARPS`
_WARPS_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def warps(kernel: str, bm: int, dtype: torch.dtype | None = None, *, bd: int = 128, bdv: int | None = None) -> int:
    """``num_warps`` for ``kernel`` at the landmark tile ``bm``, the head-dim tile ``bd`` and the value tile
    ``bdv`` (default ``bd``), inputs of ``dtype`` (None: bfloat16's): the sweep's choice (:mod:`.configs`,
    from the kernels compiled for every target arch; docs/gpu/kernel_resources.md), which keeps every
    config :func:`~nystrom.ops.nystrom.fused.covers` takes within its shared memory and spill bounds."""
    from nystrom.ops.nystrom.fused import configs

    bdv = bd if bdv is None else bdv
    tiles = configs.TILES[kernel]
    if "BD" in tiles and "BDV" in tiles and (bd, bdv) not in configs.PAIRS:
        bd = bdv = max(bd, bdv)  # a pair not compiled: the square tile of its larger side (at least its needs)
    key = (kernel, None if kernel in configs.DTYPE_FREE else _WARPS_DTYPE.get(dtype, "bf16"),
           bm if "BM" in tiles else 16, bd if "BD" in tiles else 16, bdv if "BDV" in tiles else 16)  # fmt: skip
    return configs.WARPS.get(key, 4)


#: what :func:`tuned` may set per kernel beside ``num_warps`` and ``num_stages``
_TUNABLE = {
    "key_pass": {"BN"}, "query_pass": {"BN"}, "query_backward": {"BN"},
    "landmark_pinv": {"PINV_DOT", "CONCURRENT"}, "key_combine": {"PINV_DOT"}, "landmark_backward": {"PINV_DOT"},
}  # fmt: skip


@contextlib.contextmanager
def tuned(configs: Mapping[str, Mapping[str, int | str]]) -> Iterator[None]:
    """Within the block, launches of the named kernels take these ``num_warps`` / ``num_stages`` (and,
    for ``key_pass``, ``query_pass`` and ``query_backward``, ``BN``: the token block of that pass; the
    backward's ``key_backward`` shares ``query_backward``'s splits; for the per-head kernels
    ``landmark_pinv``, ``key_combine`` and ``landmark_backward``, ``PINV_DOT``: one of :data:`PINV_DOTS`;
    for ``landmark_pinv``, ``CONCURRENT``: 1 runs it on a side stream beside the key pass, see
    :func:`side_stream`): what the GPU script's sweep tries. Unknown kernels, keys or precisions raise."""
    from nystrom.ops.nystrom.fused.configs import TILES  # every kernel's name

    known = set(TILES)
    for name, config in configs.items():
        keys = {"num_warps", "num_stages"} | _TUNABLE.get(name, set())
        if name not in known or not set(config) <= keys or config.get("PINV_DOT", PINV_DOT) not in PINV_DOTS:
            raise ValueError(f"tuned: {name!r} {dict(config)} is not a kernel of {sorted(known)} with keys {sorted(keys)}")
    before = _settings["tuned"]
    _settings["tuned"] = {**before, **{k: dict(v) for k, v in configs.items()}}
    try:
        yield
    finally:
        _settings["tuned"] = before


#: one side stream per CUDA device, made on first use
_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device, kernel: str) -> torch.cuda.Stream | None:
    """The stream ``kernel`` runs on beside the current one when :func:`tuned` sets its ``CONCURRENT``
    (the pinv of A is independent of the key pass: on a GPU its few long programs can overlap the key
    pass's many short ones); None (the current stream, one after the other) otherwise and off CUDA."""
    if device.type != "cuda" or not _settings["tuned"].get(kernel, {}).get("CONCURRENT"):
        return None
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


@contextlib.contextmanager
def on_stream(side: torch.cuda.Stream | None) -> Iterator[None]:
    """Launches in the block run on ``side`` after the current stream's work so far (nothing to do for
    None); :func:`join` makes the current stream wait for them."""
    if side is None:
        yield
        return
    side.wait_stream(torch.cuda.current_stream(side.device))
    with torch.cuda.stream(side):
        yield


def join(side: torch.cuda.Stream | None) -> None:
    """The current stream waits for what was launched on ``side`` (a CUDA graph capture rejoins it too)."""
    if side is not None:
        torch.cuda.current_stream(side.device).wait_stream(side)


def token_block(kernel: str) -> int:
    """The token block ``BN`` of the pass that ``kernel`` launches (:data:`TOKEN_BLOCK` unless tuned)."""
    return int(_settings["tuned"].get(kernel, {}).get("BN", TOKEN_BLOCK))


#: float32 elements each scratch tensor of :func:`scratch` starts at a multiple of (256 bytes: Triton
#: specialises pointers on 16-byte alignment, and a misaligned one would compile another variant)
_ALIGN = 64


def scratch(device: torch.device, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    """Contiguous float32 tensors of ``shapes`` carved from ONE allocation (each allocation is host time
    on every call; a backward needs eight scratch tensors)."""
    sizes = [int(torch.Size(shape).numel()) for shape in shapes]
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += -(-size // _ALIGN) * _ALIGN
    flat = torch.empty(total, dtype=torch.float32, device=device)
    return [flat[start : start + size].view(shape) for start, size, shape in zip(starts, sizes, shapes)]


def check_devices(**tensors: torch.Tensor | None) -> torch.device:
    """The one device of the given tensors (None skipped); two devices raise, naming both."""
    device = None
    first = ""
    for name, t in tensors.items():
        if t is None:
            continue
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(
                f"nystrom fused attention: {first} is on {device} but {name} is on {t.device}; move every"
                " input to one device (e.g. tensor.to(q.device))"
            )
    assert device is not None, "check_devices needs a tensor"
    return device


@contextlib.contextmanager
def on_device(device: torch.device) -> Iterator[None]:
    """Makes ``device`` the current CUDA device for the block: Triton launches on the current device and
    its current stream, not on the tensors' (a ``cuda:1`` tensor while ``cuda:0`` is current would be read
    from the wrong GPU, or fault). Nothing to do on other devices."""
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        yield


def launch(kernel, grid: tuple[int, ...], *args, **meta) -> None:
    """``kernel[grid](*args, **meta)``, counted in :data:`LAUNCHES`, with :func:`tuned`'s warps/stages."""
    name = kernel.__name__
    LAUNCHES[name] += 1
    override = {k: v for k, v in _settings["tuned"].get(name, {}).items() if k not in ("BN", "CONCURRENT")}
    try:
        kernel[grid](*args, **{**meta, **override})
    except Exception as error:  # compile errors, OutOfResources, CUDA faults: say how to get going again
        raise RuntimeError(
            f"the fused Nyström kernel {name} failed ({type(error).__name__}: {error}). Run the PyTorch path"
            " instead with NYSTROM_FUSED=0 in the environment, or in code with"
            " `with nystrom.ops.nystrom.fused.fused_kernels(False):`, and please report it with your GPU,"
            " dtype and shapes (docs/fused_kernels.md)"
        ) from error
