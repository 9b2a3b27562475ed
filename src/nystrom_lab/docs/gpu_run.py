"""The GPU run committed in docs/gpu/ (``scripts/gpu_bench_commit.sh``: one run at a time), read as numbers:
its machine and commit, its stages, the attention modules' and whole models' times. The GPU blocks
(:mod:`nystrom_lab.docs.blocks_gpu`, :mod:`nystrom_lab.docs.blocks_gpu_text`), the README's figure
(:mod:`nystrom_lab.docs.where_nystrom_wins`) and the tests read the run through these functions.

Legend: n tokens; *SDPA* PyTorch's fused exact attention; a *speed-up* is SDPA's ms ÷ ours (> 1: ours faster).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

GPU = "docs/gpu"
ENV, PROVENANCE, STAGES, TESTS = (
    f"{GPU}/{n}" for n in ("env.txt", "README.md", "stages.log", "gpu_tests.txt")
)
TABLES = {
    k: f"{GPU}/table1_{k}.csv" for k in ("bfloat16_fwd", "bfloat16_fwdbwd", "float16_fwd", "float32_fwd")
}
MODELS_RUN, GRAPHED_RUN, LAUNCHES = (f"{GPU}/{n}" for n in
                                     ("bench_models_gpu.json", "bench_models_gpu_graphed.json", "launches_gpu.json"))  # fmt: skip
#: the run's stage that writes each table (stages.log's names)
TABLE_STAGES = {"bfloat16_fwd": "table bf16 fwd", "bfloat16_fwdbwd": "table bf16 fwdbwd",
                "float16_fwd": "table fp16 fwd", "float32_fwd": "table fp32 fwd"}  # fmt: skip


def run_info(env: Path, provenance: Path) -> dict:
    """The run's GPU, driver, software and commit (``env.txt``, as the env stage writes it) and its date
    (the first ``YYYY-MM-DD`` of the run's README.md, written by whoever ran it)."""
    first, second, third = env.read_text(encoding="utf-8").splitlines()[:3]
    gpu, memory, driver = (s.strip() for s in first.split(","))
    words = second.split()
    soft = dict(zip(words[0:8:2], words[1:8:2]))  # python, torch, cuda, transformers
    date = re.search(r"\d{4}-\d{2}-\d{2}", provenance.read_text(encoding="utf-8"))
    return {"gpu": gpu, "memory": memory, "driver": driver, **soft,
            "commit": re.search(r"commit (\w+)", third).group(1), "date": date.group(0) if date else "undated"}  # fmt: skip


def the_run(info: dict) -> str:
    """How the docs name the run: ``the 2026-11-28 run on one NVIDIA H100 80GB HBM3, commit b3aa4d0``."""
    return f"the {info['date']} run on one {info['gpu']}, commit {info['commit']}"


def stages(log: Path) -> dict[str, tuple[int, int]]:
    """``stages.log``: stage name -> (exit status, seconds), in the run's order; ``total`` -> (0, seconds)."""
    out = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        if m := re.fullmatch(r"(.+) rc=(\d+) (\d+) s", line.strip()):
            out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
        elif m := re.fullmatch(r"total (\d+) s", line.strip()):
            out["total"] = (0, int(m.group(1)))
    return out


def module_ms(rows: list[dict], method: str) -> dict[int, float]:
    """One method's ms by n in a Table 1 CSV, where it ran."""
    return {r["n"]: r["ms"] for r in rows if r["method"] == method and "ms" in r}


def speedups(rows: list[dict]) -> dict[int, float]:
    """SDPA's ms ÷ ours per n, in n order (> 1: ours faster)."""
    sdpa, ours = module_ms(rows, "sdpa"), module_ms(rows, "nystrom-64")
    return {n: sdpa[n] / ours[n] for n in sorted(ours) if n in sdpa}


def crossing_of(ratios: list[tuple[int, float]]) -> float | None:
    """Where ours becomes the faster for good, given (n, ours' time ÷ the other's) in n order: the first n
    when ours wins at every length, None when it loses at the longest, else log-log interpolated between
    the last losing length and the next."""
    losing = [i for i, (_, r) in enumerate(ratios) if r >= 1]
    if not losing:
        return float(ratios[0][0])
    last = losing[-1]
    if last == len(ratios) - 1:
        return None
    (na, ra), (nb, rb) = ratios[last], ratios[last + 1]
    t = math.log(ra) / (math.log(ra) - math.log(rb))
    return na * (nb / na) ** t


def crossing(speedup: dict[int, float]) -> float | None:
    """Where ours starts beating SDPA for good (None: never at the lengths run), as the README's figure
    shades it."""
    return crossing_of([(n, 1 / r) for n, r in sorted(speedup.items())])


def model_ms(run: dict, mode: str) -> dict[tuple[str, int], float]:
    """(model, n) -> ms of a whole-model run's cases at batch 1 that ran."""
    return {(r["model"], r["n"]): 1e3 * r["median_s"] for r in run["rows"]
            if r["mode"] == mode and "median_s" in r and r["batch"] == 1}  # fmt: skip


def model_errors(run: dict, model: str, mode: str) -> list[str]:
    """The distinct errors of a model's cases in one mode (empty: none failed)."""
    return sorted(
        {r["error"] for r in run["rows"] if (r["model"], r["mode"]) == (model, mode) and "error" in r}
    )


def tests_summary(log: Path) -> tuple[str, list[str]]:
    """``pytest -m gpu``'s counts (``2 failed, 12 passed, 1 skipped``) and its failed tests, each with the
    first line of its error (``ValueError: input has 200 tokens ...``, up to its first ``;``)."""
    text = log.read_text(encoding="utf-8").strip()
    counts = re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", text.splitlines()[-1] if text else "")
    failed = []
    for m in re.finditer(r"^FAILED (\S+)", text, flags=re.M):
        name = m.group(1).split("::")[-1]
        section = re.search(rf"^_+ {re.escape(name)} _+$(.*?)(?=^_{{3,}} |^=+ )", text, flags=re.M | re.S)
        error = re.search(r"^E\s+(.+)$", section.group(1), flags=re.M) if section else None
        failed.append(f"`{name}`" + (f": {error.group(1).split(';')[0].strip()}" if error else ""))
    return ", ".join(f"{k} {w}" for k, w in counts), failed


def x(r: float) -> str:
    """A ratio as the docs write it: ``5.1×``."""
    return f"{r:.1f}×"


def k(n: int) -> str:
    """A length in K tokens: ``4K``, ``128K``."""
    return f"{n // 1024}K"


def ms(t: float) -> str:
    """A time in ms: ``7.2 ms``, below 1 ms to two decimals (``0.95 ms``)."""
    return f"{t:.2f} ms" if t < 1 else f"{t:.1f} ms"


def versus(speedup: float) -> str:
    """``1.5× faster`` (speed-up ≥ 1) or ``5.1× slower``; within 10 % of level to two decimals."""
    r = max(speedup, 1 / speedup)
    return (f"{r:.2f}×" if r < 1.1 else x(r)) + (" faster" if speedup >= 1 else " slower")


def spread(values: list[float]) -> str:
    """A range of ratios: ``1.5–2.0×`` (one value: ``1.5×``)."""
    lo, hi = f"{min(values):.1f}", f"{max(values):.1f}"
    return f"{lo}×" if lo == hi else f"{lo}–{hi}×"
