"""What the kernel-resources sweep compiles, the limits a compiled kernel must stay within, and the
reference GPU whose local memory each arch's rows are priced on.

Legend: BM, BD, BDV the landmark, head-dim and value-dim tiles (``launch.block`` of m, d, dv: powers of two
≥ 16); a *config* is what ``launch.warps`` selects on, (kernel, dtype, BM, BD, BDV); a *cell* is one compile:
a config with its remaining constexprs (the conv on or off), warps, stages, an arch and the alignment.

m and d matter only through their tiles, so each distinct compile runs once: m ∈ [1, 64] is BM ∈ {16, 32,
64} (m < 16 is BM 16), d ∈ [1, 128] is BD ∈ {16, 32, 64, 128} (80 and 96 are BD 128).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

#: the archs compiled: every cell on sm_90 and sm_80; the 99 KB-shared archs (sm_86, sm_89, sm_120, whose
#: code Triton builds as sm_80's) at the chosen warps where sm_80's row comes near that limit or spills;
#: sm_100 (tcgen05 products) where sm_90's spills and at the largest tiles
FULL_ARCHS = (90, 80)
SMALL_SHARED_ARCHS = (86, 89, 120)
SAMPLED_ARCHS = (100,)
#: a full arch's row "near a bound" (compiled for the archs that build like it: the 99 KB ones for sm_80,
#: sm_100 for sm_90) needs more shared memory than this, or spills more than half its stack bound
SHARED_NEAR = 64 * 1024


class Reference(NamedTuple):
    """The GPU an arch's local-memory reservation is priced on."""

    gpu: str
    sms: int
    threads_per_sm: int
    shared_limit: int  # opt-in shared memory per block, bytes


#: the local memory a kernel reserves when it first launches is its stack × the threads an SM can hold ×
#: the SMs (the driver sizes it for full occupancy, whatever the grid), on this GPU of each arch
REFERENCE = {
    80: Reference("A100", 108, 2048, 163 * 1024),
    86: Reference("RTX 3090", 82, 1536, 99 * 1024),
    89: Reference("RTX 4090", 128, 1536, 99 * 1024),
    90: Reference("H100 SXM", 132, 2048, 227 * 1024),
    100: Reference("B200", 148, 2048, 227 * 1024),
    120: Reference("RTX 5090", 170, 1536, 99 * 1024),
}

#: the token-block kernels (programs over n): their stack, if any, is paid on every token
TOKEN_KERNELS = ("landmarks", "key_pass", "query_pass", "query_backward", "key_backward", "query_landmarks")
#: spill bounds in bytes per thread: the passes over n (at most ~400 MiB of local memory reserved on any
#: reference GPU; the half-precision grid's worst is 1152 B); the forward's per-head kernels; the
#: backward's per-head pinv sweep (about ten live m×m float32 tiles at BM = 64, once per head per step)
STACK_BOUND = {"token": 1536, "landmark_pinv": 2048, "key_combine": 2048, "landmark_backward": 8192}


def stack_bound(kernel: str) -> int:
    """The spill bound of ``kernel`` in bytes per thread."""
    return STACK_BOUND["token"] if kernel in TOKEN_KERNELS else STACK_BOUND[kernel]


KERNELS = ("landmarks", "landmark_pinv", "key_pass", "key_combine", "query_pass", "query_backward",
           "landmark_backward", "key_backward", "query_landmarks")  # fmt: skip
#: the kernels whose pointers are all float32 (one compile serves every input dtype)
DTYPE_FREE = ("landmark_pinv", "landmark_backward")
DTYPES = ("bf16", "fp16", "fp32")
BMS = (16, 32, 64)
#: (BD, BDV): every pair of head-dim and value-dim tiles
PAIRS = tuple(itertools.product((16, 32, 64, 128), repeat=2))
BN = 64  # the token block (launch.TOKEN_BLOCK)


class Config(NamedTuple):
    """What ``launch.warps`` selects on; ``dtype`` is None for the dtype-free kernels."""

    kernel: str
    dtype: str | None
    bm: int
    bd: int
    bdv: int


def configs() -> list[Config]:
    """Every config of the swept grid, once (a kernel's unused tiles are pinned to 16)."""
    out = []
    for kernel in KERNELS:
        dtypes = (None,) if kernel in DTYPE_FREE else DTYPES
        for dtype, bm, (bd, bdv) in itertools.product(dtypes, BMS, PAIRS):
            uses = _uses(kernel)
            out.append(Config(kernel, dtype, bm if "BM" in uses else 16, bd if "BD" in uses else 16,
                              bdv if "BDV" in uses else 16))  # fmt: skip
    return list(dict.fromkeys(out))


def shapes() -> list[tuple[str, int, int, int]]:
    """Every call shape of the grid: (dtype, BM, BD, BDV), what ``covers()`` looks up."""
    return [(dtype, bm, bd, bdv) for dtype, bm, (bd, bdv) in itertools.product(DTYPES, BMS, PAIRS)]


def shape_configs(dtype: str, bm: int, bd: int, bdv: int) -> list[Config]:
    """The nine kernels' configs that one call of this shape launches (forward and backward)."""
    out = []
    for kernel in KERNELS:
        uses = _uses(kernel)
        out.append(Config(kernel, None if kernel in DTYPE_FREE else dtype, bm if "BM" in uses else 16,
                          bd if "BD" in uses else 16, bdv if "BDV" in uses else 16))  # fmt: skip
    return out


def _uses(kernel: str) -> tuple[str, ...]:
    return {"landmarks": ("BD",), "landmark_pinv": ("BM", "BD"), "key_combine": ("BM", "BDV"),
            "query_landmarks": ("BM", "BD")}.get(kernel, ("BM", "BD", "BDV"))  # fmt: skip


def constexprs(config: Config) -> list[dict]:
    """The constexprs of ``config``'s compiles: one dict each (the conv on and off where it is one)."""
    k, uses = config.kernel, _uses(config.kernel)
    tiles = {"BM": config.bm, "BD": config.bd, "BDV": config.bdv}
    base = {name: tiles[name] for name in uses}
    if k in ("landmarks", "key_pass", "query_pass", "query_backward", "key_backward", "query_landmarks"):
        base = {"BN": BN, **base}
    if k == "query_pass":
        return [{**base, "CONV": True}, {**base, "CONV": False}]
    if k == "key_backward":  # BK: the taps' tile, 128 for the default 65-tap conv
        return [{**base, "BK": 128, "CONV": True}, {**base, "BK": 16, "CONV": False}]
    return [base]


def costly(config: Config) -> bool:
    """The float32 token passes with a 128 tile at BM ≥ 32: each compile takes 5-25 s and spills 5-14 KB
    per thread at 4 or 8 warps, so the sweep tries other warps on :func:`representative` ones first."""
    return (config.dtype == "fp32" and config.bm >= 32 and max(config.bd, config.bdv) == 128
            and config.kernel in ("key_pass", "query_pass", "query_backward", "key_backward"))  # fmt: skip


def representative(config: Config) -> bool:
    """The costly configs whose warps candidates are all compiled: the square tile and both extremes."""
    return (config.bd, config.bdv) in ((128, 128), (128, 16), (16, 128))


def starting_warps(config: Config) -> int:
    """The warps the launchers used before the sweep (tried first: kept where it meets the bounds)."""
    if config.bm < 64:
        return 4
    if config.dtype == "fp32" and config.kernel in (
        "key_pass",
        "query_pass",
        "query_backward",
        "key_backward",
    ):
        return 8
    return {"landmark_pinv": 8, "key_combine": 8, "landmark_backward": 16}.get(config.kernel, 4)


#: the kernels launched without ``num_warps`` (Triton's default, 4): nothing else to try
FIXED_WARPS = ("landmarks", "query_landmarks")


def candidates(config: Config) -> list[int]:
    """The warps tried for ``config``, in order: the starting value, then more, then fewer."""
    start = starting_warps(config)
    if config.kernel in FIXED_WARPS:
        return [start]
    return [start, *(w for w in (8, 16) if w > start), *(w for w in (8, 4) if w < start)]


class Cell(NamedTuple):
    """One compile."""

    config: Config
    constexprs: dict
    warps: int
    arch: int
    dtype: str  # the compile's dtype: the config's, bf16 for a dtype-free kernel, fp16 in samples
    aligned: bool | str = True  # True: every mark; "strides": m and n unmarked; False: none


def cell_key(kernel: str, arch: int, dtype: str, constexprs: dict, warps: int, aligned: bool | str) -> tuple:
    """A row's identity in the table (rows with equal keys are the same compile)."""
    return kernel, arch, dtype, tuple(sorted(constexprs.items())), warps, aligned


def key_of(cell: Cell) -> tuple:
    return cell_key(cell.config.kernel, cell.arch, cell.dtype, cell.constexprs, cell.warps, cell.aligned)


def cells(config: Config, warps: int, archs: tuple[int, ...], *, dtype: str | None = None,
          aligned: bool | str = True) -> list[Cell]:  # fmt: skip
    """``config``'s compiles at ``warps`` for each arch (each conv variant)."""
    dt = dtype or config.dtype or "bf16"
    return [Cell(config, c, warps, arch, dt, aligned) for arch in archs for c in constexprs(config)]


def within(row: dict) -> bool:
    """Whether a compiled row meets the bounds: compiled, shared memory within its arch's limit, stack within
    its kernel's bound."""
    if row.get("error"):
        return False
    return row["shared_bytes"] <= REFERENCE[row["arch"]].shared_limit and row["stack_bytes"] <= stack_bound(
        row["kernel"]
    )


#: the smallest opt-in shared memory per block among the targets (sm_86, sm_89, sm_120)
SMALL_SHARED = 99 * 1024


def near(row: dict) -> bool:
    """Whether a compiled row comes near a bound (:data:`SHARED_NEAR`, half the stack bound)."""
    return row["shared_bytes"] > SHARED_NEAR or 2 * row["stack_bytes"] > stack_bound(row["kernel"])


def reservation(stack_bytes: int, arch: int) -> int:
    """Bytes of local memory a kernel with this stack reserves on ``arch``'s reference GPU when it first
    launches."""
    ref = REFERENCE[arch]
    return stack_bytes * ref.threads_per_sm * ref.sms
