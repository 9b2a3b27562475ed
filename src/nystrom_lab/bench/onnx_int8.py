"""int8 dynamic quantization of a fine-tuned classifier in ONNX Runtime: test accuracy and speed against the
float32 graph and our eager forward, on the same test file, in one run.

Legend: N test examples, b batch, n tokens, c classes.

Run: ``python -m nystrom_lab.bench.onnx_int8 MODEL_DIR --test-file test.csv --out runs/bench/onnx-int8``.
MODEL_DIR is ``nystrom finetune``'s ``OUT/model`` (a sequence classifier with its tokenizer and labels). It is
exported once (:func:`nystrom.convert.export_onnx`) and quantized (:func:`nystrom.convert.quantize_onnx`:
MatMul weights in int8, activations quantized call by call). The test examples are tokenized as ``nystrom
finetune`` does (cut to the model's fine-tuning length), sorted by length into batches of ``--batch-size``,
and every batch runs in the three engines in an order that alternates batch by batch, each call after an
untimed rest of :data:`~nystrom_lab.bench.onnx_speed.SETTLE_S` (eager under
``torch.inference_mode()``; ONNX Runtime's CPU provider with as many threads as torch uses). Reported per
engine: accuracy on the file's labels, the predictions that differ from eager's, the largest logit
difference to eager, the total time over ``--rounds`` passes (median), and the file's size. Writes
OUT/onnx_int8.json and OUT/onnx_int8.md (also printed).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from nystrom_lab.argtypes import ArgumentParser, positive_int
from nystrom_lab.bench.onnx_speed import PACKAGES, SETTLE_S
from nystrom_lab.bench.record import command_line, write_record

ENGINES = ("eager", "ort-fp32", "ort-int8")


def _batches(data, *, pad_id: int, batch_size: int) -> list[dict]:
    """The test set as padded batches of similar length (labels kept aside under "labels")."""
    from nystrom_lab.data.glue import collate_classification

    order = sorted(range(len(data)), key=lambda i: len(data.items[i][0]))
    return [
        collate_classification([data[i] for i in order[lo : lo + batch_size]], pad_id=pad_id)
        for lo in range(0, len(order), batch_size)
    ]


def run(*, model_dir: Path, test_file: Path, text_column: str, label_column: str, batch_size: int, rounds: int,
        out: Path, command: str) -> dict:  # fmt: skip
    """Export, quantize, then run the test set in the three engines; the record."""
    import onnxruntime as ort
    import torch

    from nystrom.convert import export_onnx, quantize_onnx
    from nystrom_lab.data.glue import ClassificationDataset
    from nystrom_lab.data.records import environment
    from nystrom_lab.data.tables import read_table, table_examples
    from nystrom_lab.text.predict import load_classifier

    clf = load_classifier(model_dir)
    if clf.labels.problem_type != "single_label_classification":
        raise ValueError(f"{model_dir} is a {clf.labels.problem_type} model: this bench scores single-label accuracy")
    examples = table_examples(read_table(test_file), text_column=text_column, label_column=label_column,
                              labels=clf.labels, name="test")  # fmt: skip
    if examples.labels is None:
        raise ValueError(f"{test_file} has no column {label_column!r}: accuracy needs the labels")
    data = ClassificationDataset(examples, clf.tokenizer, max_length=clf.max_length)
    batches = _batches(data, pad_id=clf.tokenizer.pad_id, batch_size=batch_size)
    fp32 = export_onnx(model_dir, out / "onnx", progress=False)
    files = {"ort-fp32": fp32, "ort-int8": quantize_onnx(fp32)}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    sessions = {
        name: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"]) for name, p in files.items()
    }
    wanted = {i.name for i in sessions["ort-fp32"].get_inputs()}
    model = clf.model.eval()

    def call(engine: str, batch: dict) -> torch.Tensor:
        feed = {k: v for k, v in batch.items() if k in wanted}
        if engine == "eager":
            with torch.inference_mode():
                return model(**feed).logits.float()
        return torch.from_numpy(sessions[engine].run(["logits"], {k: v.numpy() for k, v in feed.items()})[0])

    logits: dict[str, list[torch.Tensor]] = {e: [] for e in ENGINES}
    totals: dict[str, list[float]] = {e: [] for e in ENGINES}
    for r in range(rounds):
        spent = dict.fromkeys(ENGINES, 0.0)
        for i, batch in enumerate(batches):
            order = ENGINES if (r + i) % 2 == 0 else ENGINES[::-1]
            for engine in order:
                time.sleep(SETTLE_S)  # untimed: the last engine's spinning worker threads stop first
                t = time.perf_counter()
                y = call(engine, batch)
                spent[engine] += time.perf_counter() - t
                if r == 0:
                    logits[engine].append(y)
        for e in ENGINES:
            totals[e].append(spent[e])
        print(f"[onnx_int8] round {r + 1}/{rounds}: " + ", ".join(f"{e} {spent[e]:.1f} s" for e in ENGINES),
              file=sys.stderr, flush=True)  # fmt: skip
    labels = torch.cat([b["labels"] for b in batches])
    ref = torch.cat(logits["eager"])
    rows = []
    for e in ENGINES:
        y = torch.cat(logits[e])
        rows.append({
            "engine": e, "accuracy": float((y.argmax(-1) == labels).float().mean()),
            "differ_from_eager": int((y.argmax(-1) != ref.argmax(-1)).sum()),
            "max_logit_diff": float((y - ref).abs().max()), "median_total_s": statistics.median(totals[e]),
            "totals_s": totals[e],
            "bytes": files[e].stat().st_size if e in files else None,
        })  # fmt: skip
    lengths = [int(b["attention_mask"].sum(-1).max()) for b in batches]
    return {
        "command": command, "machine": environment(*PACKAGES), "threads": opts.intra_op_num_threads,
        "model": str(model_dir), "test_file": str(test_file), "examples": len(data), "batch_size": batch_size,
        "batches": len(batches), "longest": max(lengths), "max_length": clf.max_length, "rounds": rounds,
        "labels": list(clf.labels.names), "rows": rows,
    }  # fmt: skip


def render(res: dict) -> str:
    """The Markdown table of a record."""
    mach = res["machine"]
    eager = next(r for r in res["rows"] if r["engine"] == "eager")
    lines = [
        "# int8 dynamic quantization in ONNX Runtime",
        "",
        f"Model `{res['model']}` on `{res['test_file']}`: {res['examples']} examples cut to {res['max_length']} "
        f"tokens, {res['batches']} batches of {res['batch_size']}. Machine: {mach['cpu']}, {mach['cores']} cores, "
        f"torch {mach['torch']}, onnxruntime {mach['onnxruntime']} ({res['threads']} threads); median of "
        f"{res['rounds']} passes, the engines alternating batch by batch.",
        "",
        "| engine | accuracy | predictions ≠ eager | max logit diff | time (s) | time / eager | file (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        size = "-" if r["bytes"] is None else f"{r['bytes'] / 2**20:.1f}"
        lines.append(
            f"| {r['engine']} | {100 * r['accuracy']:.1f} % | {r['differ_from_eager']} | {r['max_logit_diff']:.1e} |"
            f" {r['median_total_s']:.2f} | {r['median_total_s'] / eager['median_total_s']:.2f} | {size} |"
        )
    lines += ["", f"Command: `{res['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m nystrom_lab.bench.onnx_int8", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("model_dir", type=Path, help="a fine-tuned classifier folder (nystrom finetune's OUT/model)")
    p.add_argument("--test-file", type=Path, required=True, help="CSV/TSV/JSONL with texts and labels")
    p.add_argument("--text-column", default="text", help="column of the texts (default text)")
    p.add_argument("--label-column", default="label", help="column of the labels (default label)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="examples per batch (default 8)")
    p.add_argument("--rounds", type=positive_int, default=3, help="timed passes over the test set (default 3)")
    p.add_argument("--out", type=Path, default=Path("runs/bench/onnx-int8"), help="folder of the record")
    a = p.parse_args(argv)
    res = run(
        model_dir=a.model_dir, test_file=a.test_file, text_column=a.text_column, label_column=a.label_column,
        batch_size=a.batch_size, rounds=a.rounds, out=a.out, command=command_line("nystrom_lab.bench.onnx_int8", argv),
    )  # fmt: skip
    write_record(a.out, "onnx_int8", res, render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
