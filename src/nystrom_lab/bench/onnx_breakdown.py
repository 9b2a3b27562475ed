"""Where ONNX Runtime and our eager forward each spend a call, in the same four categories.

Legend: b batch, n tokens.

Run: ``python -m nystrom_lab.bench.onnx_breakdown MODEL_DIR --max-length 4096 --batch-size 1
--out runs/bench/onnx-breakdown``. MODEL_DIR is a folder that :func:`nystrom.convert.export_onnx` wrote for a
model of ours. The eager model is built from the ``config.json`` beside ``model.onnx`` with fresh weights
(the time does not depend on them). Both engines run the same random ids (every token real) under their own
profilers: ONNX Runtime's (kernel times) and torch's (each op's self CPU time). Each op lands in one of four
categories:

* **linear layers**: the products with a constant weight (q/k/v, the attention's output, the FFN), their
  bias additions and GELU. ONNX Runtime's nodes are found in its optimised graph (a MatMul, Gemm or
  FusedMatMul whose second input is an initializer); eager's are oneDNN's and ATen's linear ops.
* **attention**: the other products, the softmaxes and the conv skip (with ONNX Runtime's layout reorders
  for its NCHWc convolution, which exist for the conv alone).
* **data movement**: copies, transposes, slices, pads, gathers and scatters.
* **norms and elementwise**: the rest (LayerNorm, residual additions, the pseudo-inverse's small ops).

``--rounds`` rounds alternate the engines, ``--calls`` profiled calls each, every call after an untimed rest of
``--settle-s``. Writes OUT/onnx_breakdown.json (machine, versions, the milliseconds per call by category and
the plain calls' wall times) and OUT/onnx_breakdown.md (the table, also printed). Profilers slow both engines:
compare the categories, and time the engines with :mod:`nystrom_lab.bench.onnx_speed`.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nystrom.convert.onnx_graph import all_graphs
from nystrom_lab.argtypes import ArgumentParser, existing_dir, non_negative_float, output_dir, positive_int
from nystrom_lab.bench.onnx_profile import CONTROL_FLOW, vocab_size
from nystrom_lab.bench.onnx_speed import PACKAGES, SETTLE_S, random_inputs
from nystrom_lab.bench.record import command_line, write_record

LINEAR = "linear layers (GEMMs with a weight, their biases, GELU)"
ATTENTION = "attention (other products, softmaxes, conv skip)"
MOVEMENT = "data movement (copies, transposes, slices, gathers, scatters)"
ELEMENTWISE = "norms, residual additions, other elementwise"
CATEGORIES = (LINEAR, ATTENTION, MOVEMENT, ELEMENTWISE)

_ORT_ACTIVATIONS = {"Gelu", "BiasGelu", "FastGelu", "QuickGelu"}
_ORT_ATTENTION = {"MatMul", "FusedMatMul", "Gemm", "Softmax", "Conv", "ReorderInput", "ReorderOutput"}
_ORT_MOVEMENT = {
    "Transpose", "Slice", "Pad", "ScatterND", "ScatterElements", "Gather", "GatherElements", "GatherND",
    "Concat", "Split", "Expand", "Tile", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Cast", "Shape",
}  # fmt: skip
_TORCH_ATTENTION = {"aten::bmm", "aten::baddbmm", "aten::mm", "aten::_softmax", "aten::convolution",
                    "aten::_convolution", "aten::mkldnn_convolution"}  # fmt: skip
_TORCH_MOVEMENT = {
    "aten::copy_", "aten::index_select", "aten::index_add_", "aten::index", "aten::cat", "aten::embedding",
    "aten::clone", "aten::scatter_add_", "aten::gather", "aten::constant_pad_nd", "aten::narrow_copy",
}  # fmt: skip


def linear_nodes(model) -> set[str]:
    """Names of the nodes of an ONNX ``model`` (every subgraph included) that belong to its linear layers: a
    MatMul, Gemm or FusedMatMul whose second input is an initializer, and an Add of an initializer to one's
    output (its bias)."""
    graphs = all_graphs(model.graph)
    nodes = [n for g in graphs for n in g.node]
    initializers = {t.name for g in graphs for t in g.initializer}
    initializers |= {o for n in nodes if n.op_type == "Constant" for o in n.output}
    linear = {
        n.name for n in nodes if n.op_type in ("MatMul", "Gemm", "FusedMatMul") and n.input[1] in initializers
    }
    outputs = {o for n in nodes if n.name in linear for o in n.output}
    bias = {
        n.name
        for n in nodes
        if n.op_type == "Add" and len(set(n.input) & outputs) == 1 and set(n.input) - outputs <= initializers
    }
    return linear | bias


def ort_category(op: str, node: str, linear: set[str]) -> str:
    """The category of one ONNX Runtime kernel: its op type and whether its node is a linear layer's."""
    if node in linear or op in _ORT_ACTIVATIONS:
        return LINEAR
    if op in _ORT_ATTENTION:
        return ATTENTION
    return MOVEMENT if op in _ORT_MOVEMENT else ELEMENTWISE


def torch_category(op: str) -> str:
    """The category of one torch op, by its profiler name."""
    if "linear" in op or op in ("aten::addmm", "aten::gelu"):
        return LINEAR
    # our CPU kernels record as their autograd Functions: _ShortKeyAttention, _LongKeyAttention
    low = op.lower()
    if "attention" in low or "softmax" in low or op.startswith("nystrom::") or op in _TORCH_ATTENTION:
        return ATTENTION
    return MOVEMENT if op in _TORCH_MOVEMENT else ELEMENTWISE


def eager_model(folder: Path):
    """A model of ours with the architecture that ``folder/config.json`` names, fresh weights, eval mode."""
    import torch

    import nystrom.model
    from nystrom.model import NystromformerConfig

    config = NystromformerConfig.from_pretrained(str(folder))
    arch = (config.architectures or ["NystromformerModel"])[0]
    cls = getattr(nystrom.model, arch, None)
    if cls is None:
        raise ValueError(
            f"{folder}/config.json names {arch!r}, not a model of ours: the breakdown builds its eager twin"
        )
    torch.manual_seed(0)
    return cls(config).eval()


def breakdown(
    folder: Path, *, tokens: int, batch: int, rounds: int, calls: int, settle_s: float, threads: int
) -> dict:  # fmt: skip
    """Milliseconds per call by category in both engines, and their plain wall times (under the profilers)."""
    import onnx
    import onnxruntime as ort
    import torch
    from torch.profiler import ProfilerActivity, profile

    path = folder / "model.onnx"
    model = eager_model(folder)
    every = random_inputs(batch, tokens, vocab_size(path), seed=0)
    ms = {"eager": collections.Counter(), "ort": collections.Counter()}
    wall: dict[str, list[float]] = {"eager": [], "ort": []}
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        opts.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")  # the graph the profiler names
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        linear = linear_nodes(onnx.load(opts.optimized_model_filepath, load_external_data=False))
        feed = {i.name: every[i.name].numpy() for i in session.get_inputs()}
        inputs = {k: v for k, v in every.items() if k in feed}

        def timed(engine: str, call) -> None:
            for _ in range(calls):
                time.sleep(settle_s)
                t = time.perf_counter()
                call()
                wall[engine].append(1e3 * (time.perf_counter() - t))

        with torch.inference_mode():
            model(**inputs)  # untimed: the first calls allocate
            session.run(None, feed)
            for _ in range(rounds):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    timed("eager", lambda: model(**inputs))
                for e in prof.key_averages():
                    ms["eager"][torch_category(e.key)] += e.self_cpu_time_total / 1e3
                timed("ort", lambda: session.run(None, feed))
        for e in json.loads(Path(session.end_profiling()).read_text()):
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                op = e["args"]["op_name"]
                if op not in CONTROL_FLOW:  # their time is their subgraphs' nodes', recorded too
                    category = ort_category(op, e["name"].removesuffix("_kernel_time"), linear)
                    ms["ort"][category] += e["dur"] / 1e3
    # ORT's profiler also saw the untimed first call
    profiled = {"eager": rounds * calls, "ort": rounds * calls + 1}
    return {
        "tokens": tokens,
        "batch": batch,
        "linear_nodes": len(linear),
        "ms_per_call": {eng: {c: ms[eng][c] / profiled[eng] for c in CATEGORIES} for eng in ms},
        "wall_ms": wall,
    }


def render(res: dict) -> str:
    """Markdown: the categories side by side, ORT minus eager, and the totals."""
    mach, r = res["machine"], res["breakdown"]
    e, o = r["ms_per_call"]["eager"], r["ms_per_call"]["ort"]
    lines = [
        "# ONNX Runtime against eager, by category",
        "",
        f"Machine: {mach['cpu']}, {mach['cores']} cores; torch {mach['torch']}, onnxruntime {mach['onnxruntime']}"
        f" ({res['threads']} threads each). n = {r['tokens']}, b = {r['batch']}, {res['rounds']} rounds of"
        f" {res['calls']} profiled calls. Milliseconds per call under each engine's profiler.",
        "",
        "| category | eager (ms) | ORT (ms) | ORT − eager (ms) |",
        "|---|---:|---:|---:|",
    ]
    for c in CATEGORIES:
        lines.append(f"| {c} | {e[c]:.1f} | {o[c]:.1f} | {o[c] - e[c]:+.1f} |")
    te, to = sum(e.values()), sum(o.values())
    lines.append(f"| **all ops** | {te:.1f} | {to:.1f} | {to - te:+.1f} |")
    we, wo = statistics.median(r["wall_ms"]["eager"]), statistics.median(r["wall_ms"]["ort"])
    lines += ["", f"Wall time per profiled call (median): eager {we:.1f} ms, ORT {wo:.1f} ms.", ""]
    lines += [f"Command: `{res['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    from nystrom_lab.data.records import environment

    p = ArgumentParser(
        prog="python -m nystrom_lab.bench.onnx_breakdown", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("model_dir", type=existing_dir, help="a folder export_onnx wrote for a model of ours")
    p.add_argument("--max-length", type=positive_int, default=4096, help="tokens n (default 4096)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="batch b (default 1)")
    p.add_argument(
        "--rounds", type=positive_int, default=3, help="rounds, the engines alternating (default 3)"
    )
    p.add_argument(
        "--calls", type=positive_int, default=5, help="profiled calls per engine per round (default 5)"
    )
    p.add_argument(
        "--settle-s", type=non_negative_float, default=SETTLE_S,
        help=f"untimed rest before each call (default {SETTLE_S}; see onnx_speed)",
    )  # fmt: skip
    p.add_argument("--out", type=output_dir, default="runs/bench/onnx-breakdown", help="folder of the record")
    a = p.parse_args(argv)
    if not (a.model_dir / "model.onnx").is_file():
        p.error(f"{a.model_dir} holds no model.onnx: give a folder that export_onnx wrote")
    threads = torch.get_num_threads()
    try:
        one = breakdown(a.model_dir, tokens=a.max_length, batch=a.batch_size, rounds=a.rounds, calls=a.calls,
                        settle_s=a.settle_s, threads=threads)  # fmt: skip
    except ValueError as err:
        p.error(str(err))
    res = {
        "command": command_line("nystrom_lab.bench.onnx_breakdown", argv),
        "machine": environment(*PACKAGES),
        "threads": threads,
        "rounds": a.rounds,
        "calls": a.calls,
        "settle_s": a.settle_s,
        "breakdown": one,
    }
    write_record(a.out, "onnx_breakdown", res, render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
