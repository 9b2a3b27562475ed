"""Where ONNX Runtime spends its time in an exported graph: its own profiler, summed by operator type.

Legend: b batch, n tokens.

Run: ``python -m nystrom_lab.bench.onnx_profile MODEL.onnx [MODEL2.onnx ...] --max-length 4096 --batch-size 1
--out runs/bench/onnx-profile``. Each model runs ``--calls`` times on random ids of the vocabulary that
the config.json beside it names (all rows real), in an ``InferenceSession`` with the profiler on (CPU
provider, as many threads as torch uses), after one untimed call; the profiler's kernel times are summed
per operator type and per node, and divided by the calls. Writes
OUT/onnx_profile.json (machine, versions, every model's op types and its slowest nodes with their shapes) and
OUT/onnx_profile.md (the table, also printed). Kernel times under the profiler run above the plain call's time:
read the shares, not the milliseconds.
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
import time
from pathlib import Path

from nystrom_lab.argtypes import ArgumentParser, positive_int
from nystrom_lab.bench.onnx_speed import PACKAGES, random_inputs
from nystrom_lab.bench.record import command_line, write_record

#: the slowest nodes kept per model
TOP_NODES = 12


#: operators whose kernel time is their subgraphs' (the export's If on "every token real"), left out of the sums
CONTROL_FLOW = ("If", "Loop", "Scan")


def vocab_size(path: Path) -> int:
    """The vocabulary of the model at ``path``, from the config.json that export_onnx writes beside it."""
    config = path.parent / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"no config.json beside {path}: profile a folder that export_onnx wrote")
    return int(json.loads(config.read_text())["vocab_size"])


def profile(path: Path, *, tokens: int, batch: int, calls: int, threads: int, seed: int = 0) -> dict:
    """ONNX Runtime's profile of ``path`` at (batch, tokens): ms per call by op type and the slowest nodes."""
    import onnxruntime as ort

    vocab = vocab_size(path)
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        every = random_inputs(batch, tokens, vocab, seed)
        feed = {i.name: every[i.name].numpy() for i in session.get_inputs()}
        session.run(None, feed)  # untimed: the first call allocates
        wall = []
        for _ in range(calls):
            t = time.perf_counter()
            session.run(None, feed)
            wall.append(time.perf_counter() - t)
        events = json.loads(Path(session.end_profiling()).read_text())
    per_call = calls + 1  # the profiler also recorded the untimed call
    by_type: collections.Counter = collections.Counter()
    by_node: collections.Counter = collections.Counter()
    shapes = {}
    for e in events:
        # a control-flow node's time holds its subgraph's nodes, which the profiler records too: not twice
        node = e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
        if node and e["args"]["op_name"] not in CONTROL_FLOW:
            by_type[e["args"]["op_name"]] += e["dur"]
            by_node[e["name"]] += e["dur"]
            shapes[e["name"]] = (e["args"].get("input_type_shape"), e["args"].get("output_type_shape"))
    total = sum(by_type.values())
    return {
        "model": str(path),
        "tokens": tokens,
        "batch": batch,
        "calls": calls,
        "wall_ms": [1e3 * w for w in wall],
        "kernel_ms": total / 1e3 / per_call,
        "op_types": [
            {"op": op, "ms": us / 1e3 / per_call, "share": us / total} for op, us in by_type.most_common()
        ],
        "nodes": [
            {"node": name.removesuffix("_kernel_time"), "ms": us / 1e3 / per_call, "shapes": shapes[name]}
            for name, us in by_node.most_common(TOP_NODES)
        ],
    }


def render(res: dict, *, top: int = 10) -> str:
    """Markdown: each model's op types by share of the kernel time (the ``top`` first, the rest summed)."""
    mach = res["machine"]
    lines = [
        "# ONNX Runtime's profile by operator type",
        "",
        f"Machine: {mach['cpu']}, {mach['cores']} cores, onnxruntime {mach['onnxruntime']} ({res['threads']} threads).",
    ]
    for p in res["profiles"]:
        lines += [
            "",
            f"`{p['label']}` at n = {p['tokens']}, b = {p['batch']}: {p['kernel_ms']:.0f} ms of kernels per call"
            f" under the profiler.",
            "",
            "| operator | ms per call | share |",
            "|---|---:|---:|",
        ]
        for row in p["op_types"][:top]:
            lines.append(f"| {row['op']} | {row['ms']:.1f} | {100 * row['share']:.1f} % |")
        rest = p["op_types"][top:]
        if rest:
            ms, share = sum(r["ms"] for r in rest), sum(r["share"] for r in rest)
            lines.append(f"| {len(rest)} others | {ms:.1f} | {100 * share:.1f} % |")
    lines += ["", f"Command: `{res['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    from nystrom_lab.data.records import environment

    p = ArgumentParser(
        prog="python -m nystrom_lab.bench.onnx_profile", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("models", type=Path, nargs="+", help="model.onnx files (or folders holding one)")
    p.add_argument("--label", nargs="+", default=None, help="one name per model (default: the paths)")
    p.add_argument("--max-length", type=positive_int, default=4096, help="tokens n (default 4096)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="batch b (default 1)")
    p.add_argument("--calls", type=positive_int, default=3, help="profiled calls per model (default 3)")
    p.add_argument("--out", type=Path, default=Path("runs/bench/onnx-profile"), help="folder of the record")
    a = p.parse_args(argv)
    paths = [m / "model.onnx" if m.is_dir() else m for m in a.models]
    for path in paths:
        if not path.is_file():
            p.error(f"{path} is not a file: give model.onnx or the folder export_onnx wrote")
    labels = a.label or [str(m) for m in a.models]
    if len(labels) != len(paths):
        p.error(f"--label takes one name per model: {len(paths)} models, {len(labels)} labels")
    threads = torch.get_num_threads()
    res = {
        "command": command_line("nystrom_lab.bench.onnx_profile", argv),
        "machine": environment(*PACKAGES),
        "threads": threads,
        "profiles": [],
    }
    for label, path in zip(labels, paths):
        print(f"[onnx_profile] {label}: n={a.max_length} b={a.batch_size}", file=sys.stderr, flush=True)
        one = profile(path, tokens=a.max_length, batch=a.batch_size, calls=a.calls, threads=threads)
        res["profiles"].append({"label": label, **one})
    write_record(a.out, "onnx_profile", res, render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
