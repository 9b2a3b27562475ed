"""The fused Triton kernels compiled for the GPU without one (Triton's own ptxas): a sample of the sweep's
cells compiles to the committed table's numbers and within its bounds, the launch configs and the doc
are the ones the committed table gives, and every config ``covers()`` takes was compiled within the
bounds on every target arch (docs/gpu/kernel_resources.md). Triton's interpreter, which runs the kernels
in the CPU tests, cannot show any of that."""

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nystrom.ops.nystrom import fused
from nystrom.ops.nystrom.fused import configs
from nystrom.ops.nystrom.fused.launch import block, warps
from nystrom_lab.bench.gpu import kernel_grid as grid
from nystrom_lab.bench.gpu import kernel_table
from nystrom_lab.bench.gpu.kernel_sweep import index, load

ROOT = Path(__file__).resolve().parents[3]
TABLE = ROOT / "docs" / "gpu" / "kernel_resources.json"

#: compiled on every CI run (about 30 s on 2 cores): each kernel, on both fully swept archs, at the
#: corners of the grid where it is heaviest, and three rows of the other archs (kernel, dtype, m, d, dv,
#: conv, arch)
SAMPLE = [
    ("landmarks", "fp32", 64, 128, 128, False, 80),
    ("landmark_pinv", "fp32", 64, 128, 128, False, 90),
    ("key_pass", "bf16", 64, 128, 128, False, 90),
    ("key_combine", "bf16", 64, 64, 128, False, 80),
    ("query_pass", "fp16", 64, 96, 80, True, 80),
    ("query_backward", "bf16", 64, 64, 64, False, 90),
    ("landmark_backward", "bf16", 32, 128, 128, False, 80),
    ("key_backward", "bf16", 64, 128, 128, True, 90),
    ("query_landmarks", "fp32", 64, 128, 128, False, 90),
    ("query_backward", "bf16", 64, 64, 128, False, 80),  # the worst half-precision token pass
    ("key_backward", "fp32", 32, 128, 16, False, 86),  # the most shared memory on a 99 KB arch
    ("query_pass", "bf16", 64, 128, 128, True, 100),
]

_SCRIPT = """
import json, sys
from nystrom_lab.bench.gpu.kernel_resources import launched
print(json.dumps([launched(*case) for case in json.loads(sys.argv[1])]))
"""


@pytest.fixture(scope="module")
def table() -> dict:
    return load(TABLE)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_a_sample_of_the_sweep_compiles_to_the_committed_numbers_within_the_bounds(table, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    env |= {
        "PYTHONPATH": str(ROOT / "src"),
        "TRITON_CACHE_DIR": str(tmp_path),
        "TRITON_DEFAULT_FP_FUSION": "1",
    }
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(SAMPLE)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert {r["kernel"] for r in rows} == set(grid.KERNELS)
    committed = index(table["rows"])
    same_triton = table["meta"]["triton"] == importlib.import_module("triton").__version__
    for r in rows:
        assert grid.within(r), r
        key = grid.cell_key(r["kernel"], r["arch"], r["dtype"], r["constexprs"], r["warps"], r["aligned"])
        assert key in committed, f"the launch's choice was never swept: {r}"
        if same_triton:  # ptxas is deterministic: another Triton may allocate differently
            want = {k: committed[key][k] for k in ("registers", "stack_bytes", "shared_bytes")}
            assert {k: r[k] for k in want} == want, r["kernel"]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_table_was_compiled_from_the_kernels_as_they_are(table):
    """A kernel edited since the sweep leaves its rows stale (the sample above may not notice)."""
    from nystrom_lab.bench.gpu.kernel_compile import fingerprints

    current = fingerprints()
    stale = sorted({r["kernel"] for r in table["rows"] if r["source"] != current[r["kernel"]]})
    assert not stale, f"{stale} changed: rerun python -m nystrom_lab.bench.gpu.kernel_resources --sweep"


def test_the_launch_configs_and_the_doc_are_the_committed_tables(table):
    assert (ROOT / kernel_table.CONFIGS).read_text() == kernel_table.configs_text(table)
    doc = (ROOT / "docs" / "gpu" / "kernel_resources.md").read_text()
    assert doc == kernel_table.render(table, notes=doc.split("<!-- generated:")[0])


def test_warps_reads_the_sweep_choices():
    chosen = {c: w for c, (w, _ok) in kernel_table.choose(load(TABLE)["rows"]).items()}
    for c, w in chosen.items():
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, None: torch.bfloat16}[
            c.dtype
        ]
        assert warps(c.kernel, c.bm, dtype, bd=c.bd, bdv=c.bdv) == w, c
    assert set(configs.TILES) == set(grid.KERNELS)


def test_every_shape_covers_takes_on_a_gpu_was_compiled_within_the_bounds(table, monkeypatch):
    """For each target arch, every call covers() sends to the kernels launches configs (at the warps
    warps() gives) that were compiled for that arch within the bounds, or, on the archs compiled only
    where the arch that builds like them comes near a bound (sm_86/sm_89/sm_120: sm_80; sm_100: sm_90),
    whose twin there stays far from every bound."""
    found = index(table["rows"])
    monkeypatch.setattr(fused, "TRITON_INSTALLED", True)
    monkeypatch.setattr(fused, "_capability", lambda device: (9, 0))
    names = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
    sizes = (8, 16, 32, 48, 64, 80, 96, 128)
    covered = 0
    for arch, ref in grid.REFERENCE.items():
        monkeypatch.setattr(fused, "_shared_per_block", lambda device, limit=ref.shared_limit: limit)
        for dtype, m, d, dv in itertools.product(names, (1, 16, 17, 32, 33, 64), sizes, sizes):
            q = SimpleNamespace(device=torch.device("cuda"), dtype=dtype, shape=(1, 2, 100, d))
            v = SimpleNamespace(shape=(1, 2, 100, dv))
            if not fused.covers(q, v, num_landmarks=m, pinv="iterative", pinv_init="per_matrix"):
                continue
            covered += 1
            for config in grid.shape_configs(names[dtype], block(m), block(d), block(dv)):
                w = warps(config.kernel, config.bm, dtype, bd=block(d), bdv=block(dv))
                for cell in grid.cells(config, w, (arch,)):
                    row = found.get(grid.key_of(cell))
                    if row is not None:
                        assert grid.within(row), row
                        continue
                    assert arch not in grid.FULL_ARCHS, cell
                    twin = found[grid.key_of(cell._replace(arch=90 if arch in grid.SAMPLED_ARCHS else 80))]
                    assert not grid.near(twin), (cell, twin)  # else the sweep compiled it for this arch
    assert covered > 0
