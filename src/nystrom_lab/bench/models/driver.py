"""The driver of ``nystrom bench models``: interleaved rounds of fresh-process cases, ratios, the FLOP floor,
and the JSON / markdown / PNG it writes (see :mod:`nystrom_lab.bench.models.cases` for the cases themselves).

Legend: b batch, n tokens, e hidden size, f FFN width, v vocabulary, L layers, m landmarks.
"""

from __future__ import annotations

import json
import time
from itertools import product
from pathlib import Path

from nystrom_lab.bench.floors import model_floor_flops
from nystrom_lab.bench.models.cases import ALL_MODELS, MODELS, MODES, SIZES, refusal, summarise
from nystrom_lab.bench.models.report import plot, render
from nystrom_lab.docs.markers import replace_section

#: the transformers models our Nyström model is measured against (the fastest of them in each case)
OTHERS = ("hf-nystromformer", "hf-longformer", "hf-bigbird")


def gemm_rate(size: dict, *, n: int, device: str = "cpu") -> float:
    """fp32 GFLOP/s of the model's own FFN GEMM, (r, e) @ (e, f), on this machine: the best over r = n (a
    training step's shape) and r = the rows of one inference FFN block (``FFN_BLOCK_BYTES``), and over
    ATen's matmul and, on CPU, oneDNN's linear (which our inference runs, functional/dense.py). The best
    rate gives the lowest floor: no figure is flattered by a slow reference GEMM."""
    import torch

    from nystrom.layers.dense import dense, fuses
    from nystrom.model.layers import FFN_BLOCK_BYTES
    from nystrom_lab.bench.measure import median_time_ms

    e, f = size["hidden"], size["ffn"]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best = 0.0
    for r in sorted({n, min(n, max(1, FFN_BLOCK_BYTES // (4 * f)))}):
        a, w = torch.randn(r, e, device=device), torch.randn(e, f, device=device)
        ms = median_time_ms(lambda: (a @ w, sync()), repeats=7, warmup=2)
        with torch.inference_mode():
            wt = w.mT.contiguous()  # (f, e): nn.Linear's layout
            if fuses(a, wt, None):
                ms = min(ms, median_time_ms(lambda: dense(a, wt, None), repeats=7, warmup=2))
        best = max(best, 2 * r * e * f / (ms / 1e3) / 1e9)
    return best


def run(
    *, size: str = "minilm", lengths: tuple[int, ...] = (512, 4096, 8192, 16384), batches: tuple[int, ...] = (1,),
    models: tuple[str, ...] = MODELS, modes: tuple[str, ...] = MODES, rounds: int = 2, repeats: int = 2,
    dtype: str = "fp32", device: str = "cpu", threads: int = 0, timeout_s: float = 1800,
    out_dir: Path = Path("runs/bench"), name: str = "bench_models", progress: bool = True,
    deadline_s: float | None = None, fork: bool = False,
) -> dict:  # fmt: skip
    """Every (mode, n, b, model) case ``rounds`` times, models interleaved within each round; writes
    ``out_dir/bench_models.json`` (+ ``.md``, ``.png``) and returns the report.

    Resumable: every finished case is appended to ``out_dir/bench_models.partial.jsonl`` at once; a run
    with the same settings that finds that file skips what it holds (an interrupted hour-long run goes
    on where it stopped), and the file is removed once the report is written. A partial file of other
    settings raises instead of being overwritten.

    :data:`~nystrom_lab.bench.models.cases.GRAPHED` models may be asked for too; a case that cannot run
    (:func:`~nystrom_lab.bench.models.cases.refusal`: CUDA graphs off CUDA, a graphed training step) is
    reported as skipped with its reason and never started. With ``deadline_s`` (seconds from the start;
    a time-boxed run such as scripts/gpu_bench.sh) a case is killed at the deadline and the later ones
    are skipped ("over the run's time budget"), so the report is always written. ``fork``: each case
    forked from one worker that imported torch and transformers once (:mod:`nystrom_lab.bench.models.fork`)
    instead of a new interpreter, seconds less a case."""
    import subprocess

    from tqdm import tqdm

    from nystrom_lab.bench.harness import run_case
    from nystrom_lab.bench.measure import machine_info

    bad = sorted(set(models) - set(ALL_MODELS)) + sorted(set(modes) - set(MODES))
    if bad or size not in SIZES:
        raise ValueError(f"unknown {bad or size}: models {ALL_MODELS}, modes {MODES}, sizes {sorted(SIZES)}")
    groups = list(product(modes, sorted(lengths), batches))
    settings = {"size": size, "lengths": sorted(lengths), "batches": list(batches), "models": list(models),
                "modes": list(modes), "rounds": rounds, "repeats": repeats, "dtype": dtype, "device": device,
                "threads": threads}  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f"{name}.partial.jsonl"
    done = _resume(partial, settings)
    samples: dict[tuple, list[dict]] = {}
    for (_, *key), res in done.items():
        samples.setdefault(tuple(key), []).append(res)
    start = time.perf_counter()
    server = None
    target = "nystrom_lab.bench.models.cases:measure"
    if fork:
        import torch

        from nystrom_lab.bench.forkserver import CaseServer

        target = "nystrom_lab.bench.models.fork:measure"  # the worker imports the models' modules once
        server = CaseServer(target, threads=threads or torch.get_num_threads())
    bar = tqdm(
        total=rounds * len(groups) * len(models), desc="bench models", unit="case", disable=not progress
    )
    if done:
        bar.write(f"resuming: {len(done)} finished cases read from {partial}")
    for r in range(rounds):
        for mode, n, b in groups:
            for model in models:
                key = (mode, n, b, model)
                if (r, *key) in done or any("error" in s for s in samples.get(key, [])):
                    bar.update(1)  # finished before the interruption, or failed once: the error stands
                    continue
                case = {"model": model, "mode": mode, "n": n, "batch": b, "size": size, "repeats": repeats,
                        "dtype": dtype, "device": device, "threads": threads}  # fmt: skip
                left = timeout_s if deadline_s is None else deadline_s - (time.perf_counter() - start)
                limit = min(timeout_s, left)
                late = f"over the run's time budget ({deadline_s:g} s)" if left < 1 else None
                why = refusal(model, mode, device) or late
                try:
                    if why:
                        res = {"skipped": why}
                    else:
                        res = run_case(target, case, timeout_s=limit, server=server)
                except subprocess.TimeoutExpired:
                    res = {"error": f"timed out after {limit:.0f} s"}
                samples.setdefault(key, []).append(res)
                with partial.open("a") as f:
                    f.write(json.dumps({"round": r, "key": list(key), "result": res}) + "\n")
                bar.update(1)
    bar.close()
    if server is not None:
        server.close()
    rows = []
    for (mode, n, b, model), s in samples.items():
        row = {"mode": mode, "n": n, "batch": b, "model": model, **summarise(s)}
        if "median_s" in row:
            row["tokens_per_s"] = b * n / row["median_s"]
        rows.append(row)
    rates = {n: gemm_rate(SIZES[size], n=n, device=device) for n in sorted(lengths)}
    add_ratios(rows, SIZES[size], rates)
    report = {"size": size, "dtype": dtype, "device": device, "rounds": rounds, "repeats": repeats, "rows": rows,
              "gemm_gflops": rates, "machine": machine_info(), "wall_s": time.perf_counter() - start,
              "resumed_cases": len(done)}  # fmt: skip
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    replace_section(
        out_dir / f"{name}.md", "bench-models", render(report), header=""
    )  # `nystrom docs` re-renders it
    plot(report, out_dir / f"{name}.png")
    partial.unlink()
    return report


def _resume(partial: Path, settings: dict) -> dict[tuple, dict]:
    """The cases an interrupted run of the same ``settings`` finished, ``{(round, mode, n, b, model): result}``;
    starts ``partial`` with the settings where it does not exist. A torn last line (the process killed
    mid-write) is cut off; other settings raise."""
    if not partial.exists():
        partial.write_text(json.dumps({"settings": settings}) + "\n")
        return {}
    text = partial.read_text()
    if text and not text.endswith("\n"):  # killed mid-write: drop the torn line before appending after it
        text = text[: text.rfind("\n") + 1]
        partial.write_text(text)
    lines = text.splitlines()
    try:
        head = json.loads(lines[0])["settings"] if lines else None
    except (json.JSONDecodeError, KeyError, TypeError):
        head = None
    if head != settings:
        raise ValueError(
            f"{partial} holds an interrupted run with other settings ({head}); rerun with those to finish it, "
            f"or delete the file to start this one ({settings})"
        )
    done = {}
    for line in lines[1:]:
        try:
            rec = json.loads(line)
            done[(rec["round"], *rec["key"])] = rec["result"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(
                f"{partial}: unreadable line {line[:80]!r}; delete the file to start anew"
            ) from err
    return done


def add_ratios(rows: list[dict], size: dict, rates: dict[int, float]) -> None:
    """Per row of ours: speed and memory against the fastest of :data:`OTHERS` and against our exact
    model in the same (mode, n, b), and, for Nyström, time ÷ its FLOP floor."""
    by = {(r["mode"], r["n"], r["batch"], r["model"]): r for r in rows}
    for r in rows:
        if not r["model"].startswith("ours") or "median_s" not in r:
            continue
        key = (r["mode"], r["n"], r["batch"])
        others = [by[(*key, o)] for o in OTHERS if "median_s" in by.get((*key, o), {})]
        if others:
            best = min(others, key=lambda o: o["median_s"])
            r["vs_fastest_other"] = {"model": best["model"], "speedup": best["median_s"] / r["median_s"],
                                     "memory": r["peak_mb"] / best["peak_mb"]}  # fmt: skip
        exact = by.get((*key, "ours-softmax"), {})
        if r["model"].startswith("ours-nystrom") and "median_s" in exact:
            r["vs_ours_exact"] = {
                "speedup": exact["median_s"] / r["median_s"],
                "memory": r["peak_mb"] / exact["peak_mb"],
            }
        if r["model"].startswith("ours-nystrom"):
            floor = model_floor_flops(size, n=r["n"], batch=r["batch"], mode=r["mode"]) / (
                rates[r["n"]] * 1e9
            )
            r["floor_s"], r["x_floor"] = floor, r["median_s"] / floor
