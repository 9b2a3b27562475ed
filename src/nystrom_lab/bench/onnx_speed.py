"""ONNX Runtime vs our eager forward on this CPU: one encoder exported once by
:func:`nystrom.convert.export_onnx`, then timed at each length and batch size in both engines.

Legend: b batch, n tokens, e width, f FFN width, m landmarks.

Run: ``python -m nystrom_lab.bench.onnx_speed`` (MiniLM's shape: 6 layers, e = 384, 12 heads, f = 1536, Nyström
m = 64 with the text commands' conv kernel 65; n 512 / 4096 / 16384, b 1 and 8). The model is a fresh
:class:`~nystrom.model.NystromformerModel` (random weights: the speed does not depend on them), exported at
length 16 (and checked there by ONNX Runtime against eager at two other lengths). Eager: ``model(...)`` under
``torch.inference_mode()``. ONNX Runtime: an ``InferenceSession`` on the CPU provider with its default
optimisations and as many intra-op threads as torch uses (no tuning). Every row of a case is real (no padding).

Interleaved rounds: each round runs every case once in each engine, the engines' order alternating round by
round, so a slow spell of the shared machine hits both alike; a case's time is its median over rounds and
"ORT / eager" the median of the per-round ratios. Every timed call follows an untimed rest (``--settle-s``,
0.2 s): the engine before it leaves worker threads spinning that would take its cores. ``--masked-only`` also exports the graph without the
branch on every token real (:mod:`nystrom.convert.onnx_graph`) and times it in the same rounds: "ORT /
masked-only" is what the branch buys on these unpadded inputs. ``--budget-s`` stops a case's rounds early once its own
timed calls have taken that long (at least one round). The outputs of the two engines are compared once per case (largest absolute difference of
``last_hidden_state``). Writes OUT/onnx_speed.json (machine, versions, settings, every time) and
OUT/onnx_speed.md (the table, also printed).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nystrom_lab.argtypes import (
    ArgumentParser,
    non_negative_float,
    non_negative_int,
    output_dir,
    positive_int,
)
from nystrom_lab.attention_spec import attention
from nystrom_lab.bench.record import command_line, write_record

PACKAGES = ("transformers", "onnx", "onnxscript", "onnxruntime")


def build_model(*, attention_spec: str, hidden: int, layers: int, heads: int, ffn: int, max_length: int):
    """A fresh encoder of the given shape (vocabulary 30522, dropout 0), eval mode."""
    import torch

    from nystrom.model import NystromformerConfig, NystromformerModel
    from nystrom_lab.text.models import text_attention

    cfg = NystromformerConfig.preset(
        "bert-small", vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, max_position_embeddings=max_length, dropout=0.0,
        attention=text_attention(attention_spec, max_length=max_length),
    )  # fmt: skip
    torch.manual_seed(0)
    return NystromformerModel(cfg).eval()


def random_inputs(b: int, n: int, vocab: int, seed: int) -> dict:
    """Random ids (b, n) from the upper vocabulary (above the special tokens), every token real, one type."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(1000, vocab // 2), vocab, (b, n), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


#: seconds of rest before each timed call. After a call an engine's worker threads spin-wait for more
#: work (ONNX Runtime's intra-op pool, torch's OpenMP threads); on a small machine they take the cores from
#: the next engine's call. Measured on the 2-core VM at 512 tokens, batch 1, calls back to back: whichever
#: of three ORT graphs was timed second in a round ran 13-16 % slower than the others; eager's call took 95
#: ms right after ORT's against 84 ms after a rest.
SETTLE_S = 0.2


def time_rounds(
    engines: dict[str, Callable[[tuple[int, int]], object]], cases: list[tuple[int, int]], times: dict, *,
    rounds: int, budget_s: float, settle_s: float = 0.0, clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], object] = time.sleep,
) -> None:  # fmt: skip
    """Interleaved rounds of every case in every engine (their order reversed every other round), each
    call's seconds appended to ``times[case][engine]``; a case stops once its own timed calls have taken
    ``budget_s`` (at least one round). ``settle_s``: an untimed rest before every call (:data:`SETTLE_S`)."""
    spent = dict.fromkeys(cases, 0.0)  # seconds of each case's own timed calls (not the other cases')
    names = list(engines)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for case in cases:
            if r > 0 and spent[case] > budget_s:
                continue
            for name in order:
                if settle_s > 0:
                    sleep(settle_s)
                t = clock()
                engines[name](case)
                times[case][name].append(clock() - t)
                spent[case] += times[case][name][-1]
            took = ", ".join(f"{name} {1e3 * times[case][name][-1]:.1f} ms" for name in names)
            print(f"[onnx_speed] round {r + 1}/{rounds} n={case[0]} b={case[1]}: {took}", file=sys.stderr, flush=True)


def run(
    *, lengths: list[int], batches: list[int], attention_spec: str, hidden: int, layers: int, heads: int,
    ffn: int, rounds: int, warmup: int, budget_s: float, out: Path, command: str, masked_only: bool = False,
    settle_s: float = SETTLE_S,
) -> dict:  # fmt: skip
    """Export, then time every (n, b) in both engines; the record written as JSON. ``masked_only``: also
    export without the branch on every token real (``unpadded_branch=False``) and time that graph in the
    same rounds (engine ``ort_masked_only``)."""
    import onnxruntime as ort
    import torch

    from nystrom.convert import export_onnx
    from nystrom_lab.data.records import environment

    model = build_model(
        attention_spec=attention_spec,
        hidden=hidden,
        layers=layers,
        heads=heads,
        ffn=ffn,
        max_length=max(lengths),
    )
    t0 = time.perf_counter()
    path = export_onnx(model, out / "model")
    export_s = time.perf_counter() - t0
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    sessions = {"ort": session}
    if masked_only:
        masked = export_onnx(model, out / "model-masked-only", unpadded_branch=False)
        sessions["ort_masked_only"] = ort.InferenceSession(str(masked), opts, providers=["CPUExecutionProvider"])
    cases = [(n, b) for n in lengths for b in batches]
    feeds = {c: random_inputs(c[1], c[0], model.config.vocab_size, seed=i) for i, c in enumerate(cases)}

    def eager(case):
        with torch.inference_mode():
            return model(**feeds[case]).last_hidden_state

    def in_ort(name):
        def call(case):
            feed = {k: v.numpy() for k, v in feeds[case].items() if k in wanted}
            return sessions[name].run(["last_hidden_state"], feed)[0]

        return call

    onnx = in_ort("ort")
    engines = {"eager": eager} | {name: in_ort(name) for name in sessions}
    times: dict = {c: {name: [] for name in engines} for c in cases}
    diffs = {}
    for case in cases:  # warm-up calls, and the one comparison of the outputs
        print(f"[onnx_speed] warm-up n={case[0]} b={case[1]}", file=sys.stderr, flush=True)
        for _ in range(warmup):
            for fn in engines.values():
                fn(case)
        diffs[case] = float((torch.from_numpy(onnx(case)) - eager(case)).abs().max())
    time_rounds(engines, cases, times, rounds=rounds, budget_s=budget_s, settle_s=settle_s)
    rows = []
    for (n, b), t in times.items():
        ratios = [o / e for e, o in zip(t["eager"], t["ort"])]
        rows.append({
            "tokens": n, "batch": b, "rounds": len(ratios), "eager_ms": [1e3 * x for x in t["eager"]],
            "ort_ms": [1e3 * x for x in t["ort"]], "eager_median_ms": 1e3 * statistics.median(t["eager"]),
            "ort_median_ms": 1e3 * statistics.median(t["ort"]), "ort_over_eager": statistics.median(ratios),
            "max_abs_diff": diffs[(n, b)],
        })  # fmt: skip
        if masked_only:
            rows[-1]["ort_masked_only_ms"] = [1e3 * x for x in t["ort_masked_only"]]
            rows[-1]["ort_masked_only_median_ms"] = 1e3 * statistics.median(t["ort_masked_only"])
            rows[-1]["ort_over_masked_only"] = statistics.median(
                [o / x for o, x in zip(t["ort"], t["ort_masked_only"])]
            )
    return {
        "command": command,
        "machine": environment(*PACKAGES),
        "ort_threads": opts.intra_op_num_threads,
        "model": {
            "hidden": hidden,
            "layers": layers,
            "heads": heads,
            "ffn": ffn,
            "attention": model.config.attention,
        },
        "export_s": export_s,
        "onnx_bytes": sum(p.stat().st_size for p in path.parent.glob("model.onnx*")),
        "rounds": rounds,
        "warmup": warmup,
        "settle_s": settle_s,
        "rows": rows,
    }


def render(res: dict) -> str:
    """The Markdown table of a record."""
    m, mach = res["model"], res["machine"]
    lines = [
        "# ONNX Runtime vs eager (CPU)",
        "",
        f"Model: {m['layers']} layers, e = {m['hidden']}, {m['heads']} heads, f = {m['ffn']}, attention "
        f"{m['attention']}; exported in {res['export_s']:.0f} s ({res['onnx_bytes'] / 2**20:.0f} MiB).",
        f"Machine: {mach['cpu']}, {mach['cores']} cores, torch {mach['torch']} ({mach['threads']} threads), "
        f"onnxruntime {mach['onnxruntime']} ({res['ort_threads']} threads), onnx {mach['onnx']}, onnxscript "
        f"{mach['onnxscript']}. Median of {res['rounds']} interleaved rounds (fewer where a case ran out of budget).",
        "",
    ]
    masked = "ort_over_masked_only" in res["rows"][0]
    extra = " ORT masked-only graph (ms) | ORT / masked-only |" if masked else ""
    lines += [
        f"| n | b | eager (ms) | ORT (ms) | ORT / eager |{extra} rounds | max abs diff |",
        "|---:|---:|---:|---:|---:|" + ("---:|---:|" if masked else "") + "---:|---:|",
    ]
    for r in res["rows"]:
        cells = f" {r['ort_masked_only_median_ms']:.1f} | {r['ort_over_masked_only']:.2f} |" if masked else ""
        lines.append(
            f"| {r['tokens']} | {r['batch']} | {r['eager_median_ms']:.1f} | {r['ort_median_ms']:.1f} |"
            f" {r['ort_over_eager']:.2f} |{cells} {r['rounds']} | {r['max_abs_diff']:.1e} |"
        )
    lines += ["", f"Command: `{res['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m nystrom_lab.bench.onnx_speed", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--max-length", type=positive_int, nargs="+", default=[512, 4096, 16384], help="lengths n")
    p.add_argument("--batch-size", type=positive_int, nargs="+", default=[1, 8], help="batch sizes b")
    p.add_argument(
        "--attention", type=attention, default="nystrom-64", metavar="SPEC",
        help="attention spec, read as the text commands read it (default nystrom-64: conv kernel 65)",
    )  # fmt: skip
    p.add_argument("--hidden", type=positive_int, default=384, help="width e (default 384: MiniLM)")
    p.add_argument("--layers", type=positive_int, default=6, help="layers (default 6)")
    p.add_argument("--heads", type=positive_int, default=12, help="heads (default 12)")
    p.add_argument("--ffn", type=positive_int, default=1536, help="FFN width f (default 1536)")
    p.add_argument("--rounds", type=positive_int, default=5, help="timed interleaved rounds (default 5)")
    p.add_argument(
        "--warmup", type=non_negative_int, default=1, help="untimed calls per case first (default 1)"
    )
    p.add_argument(
        "--budget-s", type=float, default=600.0, help="seconds per case after which its rounds stop"
    )
    p.add_argument(
        "--settle-s", type=non_negative_float, default=SETTLE_S,
        help=f"untimed rest before every timed call, so that the last engine's spinning worker threads have"
        f" stopped (default {SETTLE_S})",
    )  # fmt: skip
    p.add_argument(
        "--masked-only", action="store_true",
        help="also export without the If on every token real (--no-unpadded-branch) and time that graph in the"
        " same rounds: what the branch buys",
    )  # fmt: skip
    p.add_argument("--out", type=output_dir, default="runs/bench/onnx", help="folder of onnx_speed.{json,md}")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    res = run(
        lengths=a.max_length, batches=a.batch_size, attention_spec=a.attention, hidden=a.hidden, layers=a.layers,
        heads=a.heads, ffn=a.ffn, rounds=a.rounds, warmup=a.warmup, budget_s=a.budget_s, out=a.out,
        command=command_line("nystrom_lab.bench.onnx_speed", argv), masked_only=a.masked_only,
        settle_s=a.settle_s,
    )  # fmt: skip
    write_record(a.out, "onnx_speed", res, render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
