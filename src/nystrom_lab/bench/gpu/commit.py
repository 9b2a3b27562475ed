"""``commit``: a GPU run's files into docs/gpu/ (``scripts/gpu_bench_commit.sh``), one run at a time."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

#: what a case cut by the stage's time budget says in its row
BUDGET_SKIP = "over the run's time budget"


def _budget_skipped(path: Path) -> int:
    """How many cases of a table file were cut by the time budget."""
    if path.suffix == ".csv":
        with path.open() as f:
            return sum(BUDGET_SKIP in (r.get("skipped") or "") for r in csv.DictReader(f))
    if path.name.startswith("bench_models"):
        return sum(BUDGET_SKIP in r.get("skipped", "") for r in json.loads(path.read_text())["rows"])
    return 0


def commit(out: Path, *, files: tuple[str, ...], provenance: tuple[str, ...], root: Path, force: bool = False,
           render: bool = True) -> list[str]:
    """Replace the run in ``root``/docs/gpu/ with the one in ``out`` and re-render the docs; the names copied.

    docs/gpu/ holds one run, so that no doc shows one run's table beside another's: a file of
    ``files`` the run did not write is removed there, and so is a table with cases cut by the time
    budget (copied only with ``force``); the docs then say the run has no such table. The run's
    ``provenance`` files are copied too. Refuses a dry run's folder."""
    if (out / "DRY").exists():
        raise SystemExit(f"{out} holds a dry run's outputs (CPU, tiny sizes): not copied into docs/gpu/")
    gpu = root / "docs" / "gpu"
    copied, removed = [], []
    for name in files:
        src = out / name
        cut = _budget_skipped(src) if src.exists() else 0
        if src.exists() and (force or not cut):
            shutil.copy(src, gpu / name)
            copied.append(name)
            continue
        print(
            f"left out: {name} " + (f"has {cut} case(s) over the time budget" if cut else "not in this run")
        )
        if (gpu / name).exists():
            (gpu / name).unlink()
            removed.append(name)
    for name in provenance:
        if (out / name).exists():
            shutil.copy(out / name, gpu / name)
        else:
            print(f"no {name} in {out}: write docs/gpu/{name} (see scripts/gpu_bench.sh)")
    print("copied into docs/gpu/:", ", ".join(copied) or "nothing")
    if "fused_tuning.json" in copied:  # no generator reads it yet: see the TODO in docs/fused_kernels.md
        print("docs/gpu/fused_tuning.json: the fused stage's chosen launch configuration; the launch"
              " defaults (fused/configs.py) are not regenerated from it yet (TODO in docs/fused_kernels.md,"
              " 'Targets')")
    if removed:
        print("removed from docs/gpu/ (an earlier run's, not this one's):", ", ".join(removed))
    if not render:
        return copied
    done = subprocess.run(
        [sys.executable, "-m", "nystrom_lab.cli", "docs", "render", "--plots", "--root", str(root)], cwd=root
    )
    if done.returncode:
        print("nystrom docs render failed: see above (the copied files stay)")
    return copied
