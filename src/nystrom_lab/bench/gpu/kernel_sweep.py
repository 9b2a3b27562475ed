"""The kernel-resources sweep: compiles the grid of :mod:`.kernel_grid` one cell at a time, appending each
row to a JSON table as it finishes (a restarted sweep skips the rows already there), and chooses each
config's warps from the rows.

Order, so that a sweep cut short still holds the most useful rows: (1) every config at its starting warps
on sm_90 and sm_80; (2) the next warps candidate of each config that broke a bound, until one meets them
all (a candidate stops at its first row over a bound; :func:`.kernel_grid.costly` configs only where a
representative of the same kernel found warps within the bounds); (3) the chosen warps of the configs
within the bounds on the 99 KB-shared archs where sm_80's rows come near a bound
(:func:`.kernel_grid.near`); (4) samples of those configs: sm_100 (where sm_90's come near a bound), and
builds without the alignment marks.

Each row records a hash of its kernel's source (``kernel_resources.fingerprints``): the sweep drops rows
compiled from other source and compiles them again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from nystrom_lab.bench.gpu import kernel_grid as grid
from nystrom_lab.bench.gpu.kernel_grid import Cell, Config

#: seconds after which one compile is recorded as timed out (m = 128 tiles took over 10 minutes)
TIMEOUT_S = 300


def load(path: Path) -> dict:
    """The table at ``path`` ({"meta": ..., "rows": [...]}), or an empty one."""
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "rows": []}


def save(table: dict, path: Path) -> None:
    """Writes the table atomically (a sweep killed mid-write leaves the previous file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=None, separators=(",", ":")).replace('},{"', '},\n{"') + "\n")
    os.replace(tmp, path)


def index(rows: list[dict]) -> dict[tuple, dict]:
    """The rows by their compile's identity."""
    return {grid.cell_key(r["kernel"], r["arch"], r["dtype"], r["constexprs"], r["warps"], r["aligned"]): r
            for r in rows}  # fmt: skip


def _verdict(config: Config, warps: int, found: dict[tuple, dict]) -> str:
    """The verdict on ``config`` at ``warps``: "fail" if a compiled row breaks a bound (on the archs
    compiled only where they come near one, its stack bound: the shared-memory check of covers() keeps
    shapes off GPUs too small for them), else "missing" if a row on sm_90 or sm_80 is not compiled,
    else "pass"."""
    rows = [found.get(grid.key_of(c)) for c in grid.cells(config, warps, grid.FULL_ARCHS)]
    if any(r is not None and not grid.within(r) for r in rows):
        return "fail"
    others = (
        found.get(grid.key_of(c))
        for c in grid.cells(config, warps, grid.SMALL_SHARED_ARCHS + grid.SAMPLED_ARCHS)
    )
    if any(
        r is not None and ("error" in r or r["stack_bytes"] > grid.stack_bound(r["kernel"])) for r in others
    ):
        return "fail"
    return "missing" if any(r is None for r in rows) else "pass"


def choose(rows: list[dict]) -> dict[Config, tuple[int, bool]]:
    """Each config's (warps, within the bounds): the first candidate whose rows meet every bound on sm_90
    and sm_80 and the stack bound wherever else it was compiled; where none does (or not all are compiled
    yet), the candidate with the smallest worst stack."""
    found = index(rows)
    out = {}
    for config in grid.configs():
        tried = []
        for w in grid.candidates(config):
            cells = grid.cells(config, w, grid.FULL_ARCHS)
            verdict = _verdict(config, w, found)
            if verdict == "pass":
                out[config] = (w, True)
                break
            present = [found[grid.key_of(c)] for c in cells if grid.key_of(c) in found]
            if present:
                tried.append((max(r.get("stack_bytes", 1 << 30) for r in present), w))
        else:
            out[config] = (min(tried)[1] if tried else grid.starting_warps(config), False)
    return out


def samples(config: Config, warps: int, found: dict[tuple, dict]) -> list[Cell]:
    """Phase 4's cells of ``config`` (within the bounds) at its chosen warps: sm_100 where sm_90's rows
    come near a bound and at the largest tiles; builds without the alignment marks (none at all, or none
    on m and n) at BM 64 with d = dv = 64 or 128."""
    big = config.bm == 64 and (config.bd, config.bdv) in ((64, 64), (128, 128))
    near = any(grid.near(found[grid.key_of(c)]) for c in grid.cells(config, warps, (90,)))
    out = []
    if near or (big and config.bd == 128):
        out += grid.cells(config, warps, grid.SAMPLED_ARCHS)
    if big and config.dtype != "fp16":
        out += grid.cells(config, warps, grid.FULL_ARCHS, aligned=False)
        out += grid.cells(config, warps, grid.FULL_ARCHS, aligned="strides")
    return out


def pending(rows: list[dict]) -> Iterator[Cell]:
    """The cells still to compile, in the sweep's order (recomputed from the rows: phases 2-4 depend on
    what the earlier ones found)."""
    found = index(rows)
    fresh = lambda cells: [c for c in cells if grid.key_of(c) not in found]  # noqa: E731
    for config in grid.configs():  # (1) starting warps, both full archs
        yield from fresh(grid.cells(config, grid.starting_warps(config), grid.FULL_ARCHS))
    chosen = choose(rows)
    # (2) the next candidate while the last broke a bound: first outside the costly class, then its
    # representatives, then the rest of a kernel's costly configs where one of its representatives found
    # warps within the bounds
    wide = [c for c in grid.configs() if grid.costly(c)]
    for config in [c for c in grid.configs() if not grid.costly(c)] + [
        c for c in wide if grid.representative(c)
    ]:
        yield from _next_candidate(config, found)
    hopeful = {c.kernel for c in wide if grid.representative(c) and chosen[c][1]}
    for config in wide:
        if config.kernel in hopeful:
            yield from _next_candidate(config, found)
    # (3) the 99 KB archs, at the chosen warps of the configs within the bounds, where sm_80's rows come
    # near a bound (those over 99 KB are kept off those GPUs by the shared-memory check: nothing to learn)
    for config, (w, ok) in chosen.items():
        near = [found[grid.key_of(c)] for c in grid.cells(config, w, (80,))] if ok else []
        if any(grid.near(r) for r in near) and all(r["shared_bytes"] <= grid.SMALL_SHARED for r in near):
            yield from fresh(grid.cells(config, w, grid.SMALL_SHARED_ARCHS))
    for config, (w, ok) in chosen.items():  # (4) samples
        if ok:
            yield from fresh(samples(config, w, found))


def _next_candidate(config: Config, found: dict[tuple, dict]) -> list[Cell]:
    """The missing cells of ``config``'s first candidate not yet known to break a bound (none once one
    meets them all); sm_90's first, so that a failing candidate usually costs one compile."""
    for w in grid.candidates(config):
        cells = grid.cells(config, w, grid.FULL_ARCHS)
        verdict = _verdict(config, w, found)
        if verdict == "pass":
            return []
        if verdict == "missing":
            return [c for c in cells if grid.key_of(c) not in found][:1]
    return []


def refresh(rows: list[dict]) -> None:
    """Recomputes each row's derived fields (reference GPU, limits, reservation, within) from the grid's
    current bounds, in place."""
    for r in rows:
        ref = grid.REFERENCE[r["arch"]]
        r.update(gpu=ref.gpu, shared_limit=ref.shared_limit, stack_bound=grid.stack_bound(r["kernel"]))
        if "stack_bytes" in r:
            r["reservation_bytes"] = grid.reservation(r["stack_bytes"], r["arch"])
        r["within"] = grid.within(r)


def row(cell: Cell, measured: dict) -> dict:
    """The table row of a compiled ``cell`` (``measured``: compile_kernel's result, or an error)."""
    ref = grid.REFERENCE[cell.arch]
    out = {"kernel": cell.config.kernel, "arch": cell.arch, "dtype": cell.dtype, "constexprs": cell.constexprs,
           "warps": cell.warps, "aligned": cell.aligned, **measured, "gpu": ref.gpu,
           "shared_limit": ref.shared_limit, "stack_bound": grid.stack_bound(cell.config.kernel)}  # fmt: skip
    if "stack_bytes" in out:
        out["reservation_bytes"] = grid.reservation(out["stack_bytes"], cell.arch)
    out["within"] = grid.within(out)
    return out


def meta() -> dict:
    """What the table's numbers depend on besides the kernels."""
    import triton

    return {
        "triton": triton.__version__,
        "aligned": "true: every pointer and every stride, m, n, d, dv and split length marked divisible by 16"
        " (Triton's tt.divisibility), as a launch on 16-byte-aligned tensors with such sizes is compiled;"
        " 'strides': m and n unmarked; false: nothing marked",
        "references": {str(a): r._asdict() for a, r in grid.REFERENCE.items()},
        "stack_bound": grid.STACK_BOUND,
        "timeout_s": TIMEOUT_S,
    }


def sweep(path: Path, *, limit: int | None = None, log=print) -> int:
    """Compiles pending cells one at a time (at most ``limit``), saving after each; returns how many ran."""
    from nystrom_lab.bench.gpu.kernel_compile import compile_kernel, fingerprints

    table = load(path)
    table["meta"] = meta()
    current = fingerprints()
    stale = [r for r in table["rows"] if r.get("source") != current[r["kernel"]]]
    if stale:  # compiled from other kernel source: compiled again
        log(
            f"dropping {len(stale)} rows compiled from other source of {sorted({r['kernel'] for r in stale})}"
        )
        table["rows"] = [r for r in table["rows"] if r.get("source") == current[r["kernel"]]]
    refresh(table["rows"])
    save(table, path)
    done = 0
    while limit is None or done < limit:
        cell = next(pending(table["rows"]), None)
        if cell is None:
            break
        try:
            measured = compile_kernel(cell.config.kernel, arch=cell.arch, dtype=cell.dtype,
                                      constexprs=cell.constexprs, num_warps=cell.warps, aligned=cell.aligned,
                                      timeout_s=TIMEOUT_S)  # fmt: skip
        except Exception as error:  # recorded, so that a restart does not retry it
            measured = {
                "error": f"{type(error).__name__}: {str(error)[-300:]}",
                "source": current[cell.config.kernel],
            }
        table["rows"].append(row(cell, measured))
        save(table, path)
        done += 1
        r = table["rows"][-1]
        log(f"{done:4d} {r['kernel']:18s} sm_{r['arch']:<3d} {r['dtype']} {r['constexprs']} w{r['warps']}"
            f"{'' if r['aligned'] is True else ' ' + str(r['aligned'])}: {r.get('registers')} regs, {r.get('stack_bytes')} B stack,"
            f" {r.get('shared_bytes')} B shared, {r.get('compile_s')} s {r.get('error', '')}")  # fmt: skip
    return done
