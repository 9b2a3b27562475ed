"""From the sweep's table (docs/gpu/kernel_resources.json): the library's launch choices
(``nystrom/ops/nystrom/fused/configs.py``, data only) and the rendered doc (docs/gpu/kernel_resources.md).

Both are pure functions of the JSON, so the tests check that the committed files agree with it.
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.bench.gpu import kernel_grid as grid
from nystrom_lab.bench.gpu.kernel_sweep import choose, load, refresh, save

CONFIGS = Path("src/nystrom/ops/nystrom/fused/configs.py")
_COMMAND = "python -m nystrom_lab.bench.gpu.kernel_resources"


def configs_text(table: dict) -> str:
    """The text of ``configs.py`` for ``table``."""
    chosen = choose(table["rows"])
    lines = [
        '"""The fused kernels\' launch choices, generated: do not edit.',
        "",
        f"Written by ``{_COMMAND} --write`` (``--sweep`` compiles the missing cells",
        "first) from docs/gpu/kernel_resources.json: every kernel compiled without a GPU for each target arch;",
        "docs/gpu/kernel_resources.md has the table, the bounds and how warps were chosen. Read by",
        ":func:`nystrom.ops.nystrom.fused.launch.warps`.",
        '"""',
        "",
        "#: the (BD, BDV) tile pairs compiled (another pair takes the square tile of its larger side)",
        "PAIRS = (",
        *(f"    {_py(p)}," for p in grid.PAIRS),
        ")",
        "#: the tiles each kernel takes (a config's others are 16)",
        "TILES = {",
        *(f"    {_py(k)}: {_py(grid._uses(k))}," for k in grid.KERNELS),
        "}",
        "#: the kernels whose pointers are all float32: one compile, one choice for every input dtype",
        f"DTYPE_FREE = {_py(grid.DTYPE_FREE)}",
        "#: num_warps per (kernel, dtype, BM, BD, BDV) where it is not 4; dtype None: the kernel's pointers are all",
        "#: float32 (one compile for every input dtype); a kernel's unused tiles are 16",
        "WARPS = {",
    ]
    lines += [f"    {_py(tuple(c))}: {w}," for c, (w, _ok) in sorted(chosen.items(), key=_order) if w != 4]
    uncovered, shared = _shapes(table, chosen)
    lines += [
        "}",
        "#: the call shapes (dtype, BM, BD, BDV) one of whose kernels breaks a bound on sm_80 or sm_90 at every",
        "#: warps tried: covers() sends them to the PyTorch path on CUDA",
        *(
            ["UNCOVERED = {", *(f"    {_py(s)}," for s in uncovered), "}"]
            if uncovered
            else ["UNCOVERED = set()"]
        ),
        f"#: the other call shapes whose kernels need more than {grid.SMALL_SHARED // 1024} KB of shared memory per block on some arch:",
        "#: the most they need (bytes), which covers() compares with the GPU's opt-in shared memory per block",
        "SHARED = {",
        *(f"    {_py(s)}: {b}," for s, b in shared.items()),
    ]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _shapes(table: dict, chosen: dict) -> tuple[list[tuple], dict[tuple, int]]:
    """The call shapes some kernel of which breaks a bound at every warps tried, and the other shapes'
    most shared memory per block over every compiled arch where it is above :data:`grid.SMALL_SHARED`."""
    rows = table["rows"]
    by_config: dict[tuple, int] = {}
    for r in rows:
        if r["aligned"] is True and "error" not in r:
            ce = r["constexprs"]
            key = (r["kernel"], r["dtype"], ce.get("BM", 16), ce.get("BD", 16), ce.get("BDV", 16), r["warps"])
            by_config[key] = max(by_config.get(key, 0), r["shared_bytes"])
    uncovered, shared = [], {}
    for shape in grid.shapes():
        configs = grid.shape_configs(*shape)
        if not all(chosen[c][1] for c in configs):
            uncovered.append(shape)
            continue
        need = max(by_config[(c.kernel, c.dtype or "bf16", c.bm, c.bd, c.bdv, chosen[c][0])] for c in configs)
        if need > grid.SMALL_SHARED:
            shared[shape] = need
    return uncovered, shared


def _py(value: object) -> str:
    """``value`` (str, int, None or a tuple of them) as ``ruff format`` writes it: double quotes."""
    if isinstance(value, tuple):
        return "(" + ", ".join(_py(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _order(item) -> tuple:
    c = item[0]
    return grid.KERNELS.index(c.kernel), c.dtype or "", c.bm, c.bd, c.bdv


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def _launched(table: dict) -> dict[int, list[dict]]:
    """Per arch, the rows a covered call launches on its reference GPU: the chosen warps' aligned rows of
    every shape not in UNCOVERED whose shared memory fits that GPU (compiled for that arch)."""
    chosen = choose(table["rows"])
    uncovered, shared = _shapes(table, chosen)
    keys = {}
    for arch, ref in grid.REFERENCE.items():
        for shape in grid.shapes():
            if shape in uncovered or shared.get(shape, 0) > ref.shared_limit:
                continue
            for c in grid.shape_configs(*shape):
                keys.update({grid.key_of(cell): arch for cell in grid.cells(c, chosen[c][0], (arch,))})
    out: dict[int, list[dict]] = {arch: [] for arch in grid.REFERENCE}
    for r in table["rows"]:
        key = grid.cell_key(r["kernel"], r["arch"], r["dtype"], r["constexprs"], r["warps"], r["aligned"])
        if key in keys:
            out[r["arch"]].append(r)
    return out


def _summary(table: dict) -> list[str]:
    rows, launched = table["rows"], _launched(table)
    out = ["| arch | reference GPU | compiles | over a bound | launched by covered calls | over a bound | worst stack"
           " (B/thread) | its reservation (MiB) | most shared (KB) | limit (KB) | compile s |",
           "|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|"]  # fmt: skip
    for arch, ref in grid.REFERENCE.items():
        mine = [r for r in rows if r["arch"] == arch]
        used = [r for r in launched[arch] if "error" not in r]
        stack = max(used, key=lambda r: r["stack_bytes"])
        shared = max(used, key=lambda r: r["shared_bytes"])
        out.append(f"| sm_{arch} | {ref.gpu} ({ref.sms} SMs × {ref.threads_per_sm} threads) | {len(mine)}"
                   f" | {sum(not r['within'] for r in mine)} | {len(launched[arch])} | {sum(not r['within'] for r in launched[arch])}"
                   f" | {stack['stack_bytes']}: `{stack['kernel']}` {_cell(stack)} | {_mb(stack['reservation_bytes'])}"
                   f" | {shared['shared_bytes'] / 1024:.0f}: `{shared['kernel']}` {_cell(shared)} | {ref.shared_limit // 1024}"
                   f" | {sum(r.get('compile_s', 0) for r in mine):.0f} |")  # fmt: skip
    return out


def _per_kernel(table: dict) -> list[str]:
    """The worst stack (B/thread) and shared memory (KB) per kernel and arch among the launched rows."""
    launched = _launched(table)
    archs = list(grid.REFERENCE)
    out = ["| kernel | " + " | ".join(f"sm_{a}" for a in archs) + " |", "|---|" + "---:|" * len(archs)]
    for kernel in grid.KERNELS:
        cells = []
        for arch in archs:
            mine = [r for r in launched[arch] if r["kernel"] == kernel]
            cells.append(f"{max(r['stack_bytes'] for r in mine)} / {max(r['shared_bytes'] for r in mine) / 1024:.0f}"
                         if mine else "")  # fmt: skip
        out.append(f"| `{kernel}` | " + " | ".join(cells) + " |")
    return out


_ALIGNED = {True: "", False: ", unaligned", "strides": ", m and n unaligned"}


def _cell(r: dict) -> str:
    ce = r["constexprs"]
    parts = [f"{k} {ce[k]}" for k in ("BM", "BD", "BDV") if k in ce]
    conv = "" if "CONV" not in ce else (", conv" if ce["CONV"] else ", no conv")
    dtype = "any" if r["kernel"] in grid.DTYPE_FREE else r["dtype"]
    return f"({dtype}, {', '.join(parts)}{conv}, {r['warps']} warps{_ALIGNED[r['aligned']]})"


def _warps_table(table: dict) -> list[str]:
    """Per (kernel, dtype, BM): the warps most of its tiles take, and the tiles that take other warps or
    break a bound at every candidate (✗)."""
    chosen = choose(table["rows"])
    out = [
        "| kernel | dtype | BM | warps | other tiles (BD/BDV: warps; ✗ over a bound) |",
        "|---|---|---:|---:|---|",
    ]
    groups: dict[tuple, list] = {}
    for c, choice in sorted(chosen.items(), key=_order):
        groups.setdefault((c.kernel, c.dtype, c.bm), []).append((c, *choice))
    for (kernel, dtype, bm), items in groups.items():
        counts = [w for _c, w, _ok in items]
        usual = max(set(counts), key=counts.count)
        uses = grid._uses(kernel)
        tiles = lambda c: "/".join(str(t) for t, n in ((c.bd, "BD"), (c.bdv, "BDV")) if n in uses)  # noqa: E731
        other = [f"{tiles(c)}: {w}{'' if ok else ' ✗'}" for c, w, ok in items if w != usual or not ok]
        out.append(f"| `{kernel}` | {dtype or 'any'} | {bm} | {usual} | {'; '.join(other)} |")
    return out


def _rows_table(rows: list[dict]) -> list[str]:
    out = ["| kernel | arch | dtype | BM | BD | BDV | conv | warps | aligned | registers | stack (B) | reservation (MiB)"
           " | shared (B) | compile s | within |", "|---|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in sorted(rows, key=lambda r: (grid.KERNELS.index(r["kernel"]), r["dtype"], r["constexprs"].get("BM", 0),
                                         r["constexprs"].get("BD", 0), r["constexprs"].get("BDV", 0), r["arch"], r["warps"])):  # fmt: skip
        ce = r["constexprs"]
        conv = "" if "CONV" not in ce else ("on" if ce["CONV"] else "off")
        dtype = "any" if r["kernel"] in grid.DTYPE_FREE else r["dtype"]
        head = (f"| `{r['kernel']}` | sm_{r['arch']} | {dtype} | {ce.get('BM', '')} | {ce.get('BD', '')} | {ce.get('BDV', '')}"
                f" | {conv} | {r['warps']} | {_ALIGNED[r['aligned']].strip(', ') or 'yes'}")  # fmt: skip
        if "error" in r:
            out.append(f"{head} | | | | | | ✗ {r['error'][:80]} |")
            continue
        out.append(f"{head} | {r['registers']} | {r['stack_bytes']} | {_mb(r['reservation_bytes'])} | {r['shared_bytes']}"
                   f" | {r['compile_s']} | {'yes' if r['within'] else '**no**'} |")  # fmt: skip
    return out


def render(table: dict, *, notes: str = "") -> str:
    """docs/gpu/kernel_resources.md for ``table``; ``notes``: the hand-written part (kept between
    regenerations: everything above the generated marker)."""
    rows = table["rows"]
    meta = table["meta"]
    gen = [
        f"<!-- generated: everything below is written by `{_COMMAND} --write` from kernel_resources.json -->",
        "",
        f"Triton {meta.get('triton')}; {len(rows)} compiles, {sum(r.get('compile_s', 0) for r in rows) / 60:.0f} minutes of"
        " compiling on one core.",
        "",
        "### Per arch",
        "",
        "A covered call launches, on its arch's reference GPU, the rows at the chosen warps of every shape",
        "not in `UNCOVERED` whose shared memory fits that GPU (on sm_86/89/100/120 those compiled there).",
        "",
        *_summary(table),
        "",
        "Worst stack (B/thread) / most shared memory (KB) per kernel among the rows covered calls launch (blank:",
        "none compiled for that arch, as its twin on sm_80 or sm_90 stays far from every bound):",
        "",
        *_per_kernel(table),
        "",
        "### The warps chosen (✗: over a bound at every warps tried: its shapes are in `UNCOVERED`)",
        "",
        *_warps_table(table),
        "",
        "### Every compile",
        "",
        *_rows_table(rows),
    ]
    return notes.rstrip() + "\n\n" + "\n".join(gen) + "\n"


def write(path: Path) -> None:
    """Writes ``configs.py`` and the doc (``path`` with ``.md``) from the table at ``path``."""
    table = load(path)
    refresh(table["rows"])
    save(table, path)
    CONFIGS.write_text(configs_text(table))
    doc = path.with_suffix(".md")
    text = doc.read_text() if doc.exists() else "# Fused kernels: resources per compile\n"
    notes = text.split("<!-- generated:")[0]
    doc.write_text(render(table, notes=notes))
