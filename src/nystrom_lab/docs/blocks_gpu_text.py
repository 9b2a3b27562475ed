"""Every sentence of the docs that states a number of the GPU run committed in docs/gpu/ (README.md,
docs/benchmarks.md, docs/training.md), rendered from that run's files: where ours wins and where it loses,
what crashed, which tests failed. A new run (``scripts/gpu_bench_commit.sh``) re-renders them all.

Legend: n tokens; *SDPA* PyTorch's fused exact attention; *exact models* transformers' BERT and ours with
SDPA attention.
"""

from __future__ import annotations

from pathlib import Path

from nystrom_lab.docs.block import Block
from nystrom_lab.docs.data import read_csv, read_json
from nystrom_lab.docs.gpu_run import (
    ENV,
    GRAPHED_RUN,
    LAUNCHES,
    MODELS_RUN,
    PROVENANCE,
    STAGES,
    TABLES,
    TESTS,
    crossing,
    k,
    model_errors,
    model_ms,
    module_ms,
    ms,
    run_info,
    speedups,
    spread,
    stages,
    tests_summary,
    the_run,
    versus,
    x,
)  # fmt: skip

DOC = "docs/benchmarks.md"
MODEL_NAMES = {"ours-nystrom": "ours", "hf-bert": "transformers' BERT", "ours-softmax": "ours with SDPA",
               "hf-nystromformer": "transformers' Nystromformer"}  # fmt: skip


def provenance(env: Path, readme: Path, log: Path) -> str:
    """The run: machine, software, commit, and each stage's exit status and time."""
    info, st = run_info(env, readme), stages(log)
    parts = [
        f"{name} {s}" + ("" if rc == 0 else f" (exit {rc})")
        for name, (rc, s) in st.items()
        if name != "total"
    ]
    return (f"Run on {info['date']} on one **{info['gpu']}** (driver {info['driver']}; torch {info['torch']}, CUDA "
            f"{info['cuda']}, transformers {info['transformers']}, Python {info['python']}) at commit {info['commit']} "
            f"by the GPU benchmark script. Its stages, in seconds: {', '.join(parts)}; {st['total'][1]} in all"
            + (" (exit 124: past the stage's time budget)" if any(rc == 124 for rc, _ in st.values()) else "")
            + ". How it was run and what failed: [docs/gpu/README.md](gpu/README.md); every file of the run is in "
            "[docs/gpu/](gpu/).")  # fmt: skip


def tests_line(log: Path) -> str:
    """``pytest -m gpu``'s counts in the run, with the failed tests."""
    summary, failed = tests_summary(log)
    return f"`pytest -m gpu`: {summary}" + (f" (failed: {'; '.join(failed)})" if failed else "")


def _against_sdpa(title: str, rows: list[dict]) -> str:
    """``bf16 forward: 5.1× slower at 4K, 1.5× faster at 16K, ... (the crossing near 12K)``."""
    s = speedups(rows)
    c = crossing(s)
    where = ("ours never the faster" if c is None else "ours faster at every length" if c <= min(s)
             else f"the crossing near {c / 1024:.0f}K")  # fmt: skip
    return f"{title}: " + ", ".join(f"{versus(r)} at {k(n)}" for n, r in s.items()) + f" ({where})"


def _against(rows: list[dict], other: str) -> str:
    """Ours against another method of the same table, per n: ``2.5× faster at 4K, ...``."""
    ours, theirs = module_ms(rows, "nystrom-64"), module_ms(rows, other)
    return ", ".join(f"{versus(theirs[n] / ours[n])} at {k(n)}" for n in sorted(ours) if n in theirs)


def attention_summary(bf16_fwd: Path, bf16_fwdbwd: Path, fp32_fwd: Path) -> str:
    """Where our module wins and loses against SDPA and transformers' Nyström, per precision and pass."""
    fwd, fb, f32 = read_csv(bf16_fwd), read_csv(bf16_fwdbwd), read_csv(fp32_fwd)
    ours, sdpa = module_ms(fwd, "nystrom-64"), module_ms(fwd, "sdpa")
    mem = {r["n"]: r["peak_mb"] for r in fwd if r["method"] == "nystrom-64" and "ms" in r}
    mem_sdpa = {r["n"]: r["peak_mb"] for r in fwd if r["method"] == "sdpa" and "ms" in r}
    ns = sorted(n for n in ours if n in sdpa)
    return (f"Ours against SDPA, {_against_sdpa('bf16 forward', fwd)}; {_against_sdpa('bf16 forward + backward', fb)}; "
            f"{_against_sdpa('fp32 forward', f32)}. Our bf16 forward takes {ms(ours[ns[0]])} at {k(ns[0])} and "
            f"{ms(ours[ns[1]])} at {k(ns[1])}. Against transformers' Nyström-64, ours is {_against(fwd, 'hf-nystrom-64')} "
            f"in the bf16 forward, and {_against(f32, 'hf-nystrom-64')} in fp32. Peak memory (bf16 forward): ours "
            f"{spread([mem[n] / mem_sdpa[n] for n in ns])} SDPA's.")  # fmt: skip


def _model_line(inf: dict, n: int) -> str:
    """``7.2 ms against transformers' BERT's 6.4 ms and ours with SDPA's 6.2 ms at 4K (1.2× slower than the
    fastest)``."""
    others = {m: t for (m, nn), t in inf.items() if nn == n and m in ("hf-bert", "ours-softmax")}
    best = min(others.values())
    return (f"{ms(inf[('ours-nystrom', n)])} against " + " and ".join(f"{MODEL_NAMES[m]}'s {ms(t)}" for m, t in others.items())
            + f" at {k(n)} (" + ("the fastest model" if inf[("ours-nystrom", n)] < best else
                                 f"{x(inf[('ours-nystrom', n)] / best)} slower than the fastest") + ")")  # fmt: skip


def models_summary(eager: Path, graphed: Path) -> str:
    """Whole-model inference against the exact models and transformers' Nystromformer; the graphed and
    compiled forwards; the training step."""
    run, g = read_json(eager), read_json(graphed)
    inf, gi, tr = model_ms(run, "inference"), model_ms(g, "inference"), model_ms(run, "train")
    ns = sorted({n for (m, n) in inf if m == "ours-nystrom"})
    text = ("Inference (bf16 autocast, batch 1): ours takes " + "; ".join(_model_line(inf, n) for n in ns)
            + ". Against transformers' Nystromformer ours is "
            + ", ".join(f"{versus(inf[('hf-nystromformer', n)] / inf[('ours-nystrom', n)])} at {k(n)}" for n in ns) + ".")  # fmt: skip
    graphed_ms = {n: gi[("ours-nystrom-graphed", n)] for n in ns if ("ours-nystrom-graphed", n) in gi}
    if graphed_ms:
        text += (" Replayed as a CUDA graph, our forward takes " + " and ".join(f"{ms(t)} at {k(n)}" for n, t in graphed_ms.items())
                 + " (no other model was graphed).")  # fmt: skip
    comp = {n: gi[("ours-nystrom-compiled", n)] for n in ns if ("ours-nystrom-compiled", n) in gi}
    if comp:
        text += (
            ' Compiled (`mode="reduce-overhead"`), it runs at '
            + ", ".join(
                f"{inf[('ours-nystrom', n)] / t:.2f}× eager's speed at {k(n)}" for n, t in comp.items()
            )
            + "."
        )
    errors = model_errors(run, "ours-nystrom", "train")
    if errors:
        text += f" A training step of ours crashed at every length (`{errors[0]}`): the run has no GPU training time for it."
    others = [m for m in MODEL_NAMES if m != "ours-nystrom" and all((m, n) in tr for n in ns)]
    text += (" Training step: " + "; ".join(f"{MODEL_NAMES[m]} " + " / ".join(ms(tr[(m, n)]) for n in ns) for m in
                                           (["ours-nystrom"] if not errors else []) + others)
             + f" at {' / '.join(k(n) for n in ns)}.")  # fmt: skip
    cerr = model_errors(g, "ours-nystrom-compiled", "train")
    if cerr:
        text += f" Compiling the training step failed (`{cerr[0].split(':')[0]}`)."
    return text


def readme_summary(env: Path, readme: Path, bf16_fwd: Path, eager: Path, tests: Path) -> str:
    """The README's GPU paragraph: where ours wins and loses on the run's GPU, and what failed there."""
    s = speedups(read_csv(bf16_fwd))
    c, (n0, n1, *_) = crossing(s), list(s)
    run = read_json(eager)
    inf = model_ms(run, "inference")
    ns = sorted({n for (m, n) in inf if m == "ours-nystrom"})
    vs_hf = [inf[("hf-nystromformer", n)] / inf[("ours-nystrom", n)] for n in ns]
    text = (f"On a GPU ({the_run(run_info(env, readme))}; bf16, batch 1; docs/benchmarks.md, \"On a GPU\"): the "
            f"attention module's forward is {versus(s[n0])} than exact SDPA (FlashAttention) at {k(n0)} tokens and "
            f"{versus(s[n1])} at {k(n1)} ({x(s[max(s)])} at {k(max(s))})"
            + (f", so below about {c / 1024:.0f}K tokens exact SDPA is the better choice" if c and c > n0 else "")
            + ". The whole MiniLM-size model's inference takes " + "; ".join(_model_line(inf, n) for n in ns)
            + f"; against transformers' Nystromformer ours is {spread(vs_hf)} faster.")  # fmt: skip
    if model_errors(run, "ours-nystrom", "train"):
        text += " Training our Nyström model under bf16 autocast crashed in that run: there is no GPU training time."
    return text + f" `pytest -m gpu` there: {tests_summary(tests)[0]} (docs/benchmarks.md has which and why)."


def training_status(env: Path, readme: Path, eager: Path, graphed: Path, tests: Path) -> str:
    """docs/training.md's GPU note: the run's tests, and what happened to our model's training step."""
    text = (
        f'**CUDA** ({the_run(run_info(env, readme))}; docs/benchmarks.md, "On a GPU"): {tests_line(tests)}.'
    )
    errors = model_errors(read_json(eager), "ours-nystrom", "train")
    if errors:
        text += (
            " A training step of our Nyström model (MiniLM size, MLM head, AdamW, `backward()` inside "
            f'`torch.autocast("cuda", torch.bfloat16)`) crashed: `{errors[0]}`.'
        )
    cerr = model_errors(read_json(graphed), "ours-nystrom-compiled", "train")
    if cerr:
        text += f" `torch.compile` of that step failed: `{cerr[0].split(':')[0]}`."
    return text


def gpu_syncs(path: Path) -> str:
    """The host syncs per call that the profiler counted on the GPU, ours and transformers'."""
    run = read_json(path)
    counts = {side: sorted({c[side][p]["syncs"] for c in run["cases"].values() for p in ("forward", "forward_backward")})
              for side in ("ours", "hf")}  # fmt: skip
    theirs = run["cases"].get("module", {}).get("hf", {}).get("forward", {}).get("syncs", 0)
    return (f"on the {run['device']} the profiler counted {'–'.join(map(str, counts['ours']))} host sync(s) per call "
            f"in each case of ours and {'–'.join(map(str, counts['hf']))} in transformers'"
            + (" (their attention module without a mask included)" if theirs else ""))  # fmt: skip


BLOCKS = [
    Block(DOC, "gpu-provenance", (ENV, PROVENANCE, STAGES), provenance),
    Block(DOC, "gpu-tests", (TESTS,), tests_line, inline=True),
    Block(DOC, "gpu-attention-summary", (TABLES["bfloat16_fwd"], TABLES["bfloat16_fwdbwd"], TABLES["float32_fwd"]),
          attention_summary),
    Block(DOC, "gpu-models-summary", (MODELS_RUN, GRAPHED_RUN), models_summary),
    Block(DOC, "gpu-syncs", (LAUNCHES,), gpu_syncs, inline=True),
    Block("README.md", "gpu-summary", (ENV, PROVENANCE, TABLES["bfloat16_fwd"], MODELS_RUN, TESTS), readme_summary),
    Block("README.md", "gpu-run", (ENV, PROVENANCE), lambda env, readme: the_run(run_info(env, readme)), inline=True),
    Block("docs/training.md", "gpu-training", (ENV, PROVENANCE, MODELS_RUN, GRAPHED_RUN, TESTS), training_status),
]  # fmt: skip
