"""``nystrom lra``: spec parsing, presets, ListOps end to end through the command, retrieval wiring, errors."""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_model

from nystrom.attention import NystromAttention
from nystrom.model import NystromformerForDualSequenceClassification, NystromformerForSequenceClassification
from nystrom_lab.argtypes import UsageError
from nystrom_lab.data.records import read_metrics
from nystrom_lab.lra.commands import register
from nystrom_lab.lra.experiment import (
    LRARun,
    MissingDataError,
    build_model,
    make_task,
    model_config,
    run_lra,
    train_config,
)
from nystrom_lab.lra.presets import SCHEDULES, TASKS


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nystrom")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def _cli(argv: list[str]) -> int:
    args = _parse(argv)
    return args.func(args)


# ---------------------------------------------------------------- attention specs (grammar: test_attention_spec.py)
@pytest.mark.parametrize(
    "spec, expected",
    [
        ("nystrom", {"name": "nystrom", "conv_kernel_size": 35}),  # the official LRA conv kernel
        ("nystrom-32", {"name": "nystrom", "conv_kernel_size": 35, "num_landmarks": 32}),
        ("nystrom-32,conv_kernel_size=none", {"name": "nystrom", "conv_kernel_size": None, "num_landmarks": 32}),
        ("softmax", {"name": "softmax"}),
        ("linformer-256", {"name": "linformer", "proj_len": 256, "max_seq_len": 2000}),
        ("performer-256", {"name": "performer", "num_features": 256}),
    ],
)
def test_lra_model_takes_the_spec_over_the_official_preset(spec, expected):
    cfg = model_config(LRARun(task="listops", attention=spec, max_length=2000))
    assert cfg.attention == expected


def test_a_bare_name_runs_the_constructors_default_and_names_the_folder_by_it():
    m = inspect.signature(NystromAttention).parameters["num_landmarks"].default
    run = LRARun(task="listops", attention="nystrom", max_length=128)
    layers = [mod for mod in build_model(run).modules() if isinstance(mod, NystromAttention)]
    assert layers and {mod.num_landmarks for mod in layers} == {m}
    assert run.out_dir().name == f"listops-nystrom-{m}-official-seed0"


def test_argparse_rejects_bad_numbers():
    with pytest.raises(SystemExit):
        _parse(["lra", "listops", "--steps", "0"])
    with pytest.raises(SystemExit):
        _parse(["lra", "listops", "--listops-sizes", "10,5"])
    with pytest.raises(SystemExit):
        _parse(["lra", "sudoku"])
    with pytest.raises(ValueError, match="cannot go with --data"):
        LRARun(task="listops", data=Path("x"), listops_sizes=(1, 1, 1))


@pytest.mark.parametrize(
    "spec", ["nystrom-8", "softmax", "linformer-16", "performer-16", "reformer-2", "longformer-9"]
)
def test_every_variant_builds_the_paper_model_and_runs(spec):
    run = LRARun(task="listops", attention=spec, max_length=48)
    model = build_model(run)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads) == (
        2,
        64,
        128,
        2,
    )
    assert (cfg.norm_position, cfg.pooling, cfg.max_position_embeddings, cfg.num_labels) == (
        "pre",
        "mean",
        48,
        10,
    )
    ids = torch.randint(1, 16, (2, 48))
    ids[1, 30:] = 0
    out = model(ids, attention_mask=ids != 0, labels=torch.tensor([3, 7]))
    assert out.logits.shape == (2, 10) and torch.isfinite(out.loss)


# ---------------------------------------------------------------- presets
OFFICIAL = {  # task: (length, batch, steps, warm-up, eval every), mlpen/Nystromformer LRA/code/lra_config.py
    "listops": (2000, 32, 5000, 1000, 50),
    "text": (4000, 32, 20000, 8000, 500),
    "retrieval": (4000, 32, 30000, 800, 300),
    "image": (1024, 256, 35000, 175, 175),
    "pathfinder": (1024, 256, 62400, 312, 312),
}


@pytest.mark.parametrize("task", TASKS)
def test_official_preset_matches_the_released_schedule(task):
    s = SCHEDULES["official"][task]
    assert (s.max_length, s.batch_size, s.steps, s.warmup, s.eval_every) == OFFICIAL[task]
    cfg = train_config(LRARun(task=task))
    assert (cfg.batch_size, cfg.steps, cfg.warmup, cfg.eval_every) == OFFICIAL[task][1:]
    assert (cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay, cfg.clip) == (1e-4, (0.9, 0.999), 1e-6, 0.0, None)


def test_overrides_and_model_options():
    cfg = train_config(
        LRARun(task="listops", steps=500, batch_size=8, lr=3e-4, seed=4, precision="bf16", eval_batches=2)
    )
    assert (cfg.steps, cfg.warmup, cfg.batch_size, cfg.lr, cfg.seed, cfg.precision, cfg.eval_batches) == (
        500, 100, 8, 3e-4, 4, "bf16", 2,
    )  # fmt: skip
    assert model_config(LRARun(task="text", pool_padding=True)).pooling == "mean_with_padding"
    image = model_config(LRARun(task="image"))
    assert image.pad_token_id is None and image.vocab_size == 256  # grey level 0 is a real pixel
    assert model_config(LRARun(task="text", max_length=1000)).max_position_embeddings == 1000


# ---------------------------------------------------------------- ListOps end to end
LISTOPS_ARGS = ["lra", "listops", "--preset", "quick", "--steps", "4", "--batch-size", "8"]
LISTOPS_ARGS += ["--listops-sizes", "40,12,20", "--eval-batches", "1", "--no-progress"]


def test_listops_quick_end_to_end_resume_and_full_test(tmp_path, capsys):
    out = tmp_path / "run"
    assert _cli([*LISTOPS_ARGS, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    assert res["step"] == 4 and res["test_examples"] == 20
    assert f"test accuracy {res['test']['accuracy']:.4f} on 20 examples" in printed
    assert len((out / "data" / "basic_train.tsv").read_text().splitlines()) == 41  # header + 40
    # the reported test accuracy is the best-dev model on all 20 test examples (not --eval-batches 1)
    run = LRARun(task="listops", preset="quick", listops_sizes=(40, 12, 20), out=out)
    task = make_task(run, out)
    load_model(task.model, str(out / "best.safetensors"))
    task.model.eval()
    batch = task.collate([task.test[i] for i in range(len(task.test))])
    with torch.no_grad():
        pred = task.model(**batch).logits.argmax(-1)
    assert res["test"]["accuracy"] == pytest.approx(float((pred == batch["labels"]).float().mean()))
    # the same command resumes: no new training steps, same data
    stamp = (out / "data" / "generated.json").stat().st_mtime_ns
    assert _cli([*LISTOPS_ARGS, "--out", str(out)]) == 0
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps.count(4) == 2 and max(steps) == 4  # one train and one dev record of step 4
    assert (out / "data" / "generated.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="attention"):
        _cli([*LISTOPS_ARGS, "--out", str(out), "--attention", "nystrom-32"])


# ---------------------------------------------------------------- retrieval (dual encoder)
def _aan_fixture(root: Path) -> Path:
    root.mkdir()
    for split, n in (("train", 12), ("eval", 6), ("test", 5)):
        lines = []
        for i in range(n):
            a = f"paper {i} on attention " * (1 + i % 3)
            b = f"citing work {i}" * (1 + i % 2)
            lines.append(f"{i % 2}\tid{i}a\tid{i}b\t{a}\t{b}")
        (root / f"new_aan_pairs.{split}.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_retrieval_uses_one_shared_encoder_on_both_documents(tmp_path):
    data = _aan_fixture(tmp_path / "aan")
    run = LRARun(
        task="retrieval",
        preset="quick",
        data=data,
        max_length=32,
        steps=3,
        batch_size=4,
        out=tmp_path / "run",
    )
    task = make_task(run, tmp_path / "run")
    assert isinstance(task.model, NystromformerForDualSequenceClassification)
    assert task.model.classifier.dense.in_features == 4 * 64  # [a, b, a·b, a−b]
    batch = task.collate([task.train[i] for i in range(3)])
    assert set(batch) == {"input_ids_1", "input_ids_2", "attention_mask_1", "attention_mask_2", "labels"}
    assert batch["attention_mask_1"].sum(-1).tolist() == [21, 32, 32]  # bytes, cut to L = 32
    assert batch["attention_mask_2"].sum(-1).tolist() == [13, 26, 13]
    assert batch["labels"].tolist() == [0, 1, 0]
    loss, metrics = task.step(task.model, batch)
    assert torch.isfinite(loss) and metrics["accuracy"][1] == 3
    res = run_lra(run, progress=False)  # the two-tower model through the shared loop
    assert res["step"] == 3 and res["test_examples"] == 5
    assert res["test"]["accuracy"] * 5 == pytest.approx(round(res["test"]["accuracy"] * 5))  # k of 5 right


def test_single_sequence_tasks_use_the_single_classifier():
    assert isinstance(build_model(LRARun(task="image")), NystromformerForSequenceClassification)


# ---------------------------------------------------------------- missing data
def test_missing_data_folder_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):  # a --data folder that does not exist: a usage error at parse time
        _parse(["lra", "text", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert "nope" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"empty.*train/neg/\*\.txt.*aclImdb"):  # a folder without the files
        _cli(["lra", "text", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    with pytest.raises(UsageError, match="no --data given.*cifar-10-batches-py"):
        _cli(["lra", "image", "--out", str(tmp_path / "o")])
    with pytest.raises(MissingDataError, match=r"new_aan_pairs\.train\.tsv.*lra_release"):
        run_lra(LRARun(task="retrieval", data=tmp_path), progress=False)
    with pytest.raises(MissingDataError, match="curv_contour_length_14"):
        run_lra(LRARun(task="pathfinder", data=tmp_path), progress=False)
    with pytest.raises(MissingDataError, match="basic_val.tsv"):
        run_lra(LRARun(task="listops", data=tmp_path), progress=False)


# ---------------------------------------------------------------- trimmed batches, sorted evaluation
@pytest.mark.parametrize("pool_padding", [False, True])
def test_trimmed_batches_give_the_same_logits(pool_padding):
    from nystrom_lab.data.lra.collate import collate_single

    torch.manual_seed(0)
    run = LRARun(task="listops", attention="nystrom-8", max_length=96, pool_padding=pool_padding)
    model = build_model(run).double().eval()
    items = []
    for length, label in ((40, 1), (71, 4), (23, 0)):
        ids = torch.zeros(96, dtype=torch.int64)
        ids[:length] = torch.randint(1, 16, (length,))
        items.append((ids, torch.tensor(label)))
    full = collate_single(items, padded=True)
    cut = collate_single(items, padded=True, trim=True)
    assert cut["input_ids"].shape == (3, 71) and full["input_ids"].shape == (3, 96)
    same = torch.allclose(model(**cut).logits, model(**full).logits, rtol=0, atol=1e-12)
    assert same != pool_padding  # why make_task never trims when pooling averages over padding


def test_full_evaluation_is_length_sorted_and_order_invariant():
    from nystrom_lab.training import Task, TrainConfig, evaluate
    from nystrom_lab.training.loop import _eval_order

    class Lengths(list):
        lengths = (5, 1, 3, 1)

    assert _eval_order(Lengths([0, 1, 2, 3]), partial=False) == [1, 3, 2, 0]
    assert _eval_order(Lengths([0, 1, 2, 3]), partial=True) == [0, 1, 2, 3]
    assert _eval_order([0, 1, 2, 3], partial=False) == [0, 1, 2, 3]

    torch.manual_seed(0)
    xs = [(torch.randn(3), torch.tensor(i % 2)) for i in range(7)]
    model = torch.nn.Linear(3, 2)

    def step(m, batch):
        logits = m(batch["x"])
        loss = torch.nn.functional.cross_entropy(logits, batch["y"])
        return loss, {"accuracy": (float((logits.argmax(-1) == batch["y"]).sum()), len(batch["y"]))}

    def collate(items):
        return {"x": torch.stack([i[0] for i in items]), "y": torch.stack([i[1] for i in items])}

    class Sorted(list):
        lengths = (7, 1, 6, 2, 5, 3, 4)

    cfg = TrainConfig(steps=1, batch_size=2, lr=1e-3, warmup=0)
    task = Task(model=model, train=xs, collate=collate, step=step)
    plain, ordered = evaluate(task, model, xs, cfg), evaluate(task, model, Sorted(xs), cfg)
    assert plain.keys() == ordered.keys() == {"accuracy", "loss"}
    assert plain["accuracy"] == ordered["accuracy"]
    assert abs(plain["loss"] - ordered["loss"]) < 1e-6
