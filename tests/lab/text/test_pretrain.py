"""`nystrom pretrain` on the shared loop: the loss falls, outputs, MiniLM init, DDP = 1 process, Fig. 5 plot."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nystrom.model import NystromformerConfig, NystromformerForPreTraining
from nystrom_lab.cli import run_command as main
from nystrom_lab.data.records import read_metrics
from nystrom_lab.data.text import train_wordpiece
from nystrom_lab.text.figure5 import plot_runs
from nystrom_lab.text.models import text_attention
from nystrom_lab.text.pretrain import PretrainRun, build_model, run_pretrain, same_run

CORPUS = Path(__file__).parents[2] / "fixtures" / "text" / "corpus"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A WordPiece tokenizer (300 ids) of the fixture corpus and a 2-layer 64-wide config JSON."""
    root = tmp_path_factory.mktemp("pre")
    tok = train_wordpiece(sorted(CORPUS.glob("*.txt")), root / "tokenizer.json", vocab_size=300)
    cfg = NystromformerConfig.preset(
        "bert-small", vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=64, classifier_hidden=64,
    )  # fmt: skip
    cfg.to_json_file(root / "tiny.json")
    return root


def _args(setup: Path, out: Path, *extra: str) -> list[str]:
    return [
        "pretrain", "--corpus", str(CORPUS), "--tokenizer", str(setup / "tokenizer.json"),
        "--init-from", str(setup / "tiny.json"), "--attention", "nystrom-8,conv_kernel_size=5",
        "--max-length", "48", "--batch-size", "8", "--dev-fraction", "0.2", "--dropout", "0",
        "--out", str(out), "--no-progress", *extra,
    ]  # fmt: skip


def test_text_attention_takes_the_papers_bert_conv_kernel_unless_the_spec_sets_one():
    assert text_attention("nystrom-64") == {"name": "nystrom", "conv_kernel_size": 65, "num_landmarks": 64}
    assert text_attention("nystrom") == {"name": "nystrom", "conv_kernel_size": 65}  # m: the constructor's
    assert text_attention("nystrom,conv_kernel_size=none") == {"name": "nystrom", "conv_kernel_size": None}
    assert text_attention("softmax") == {"name": "softmax"} and text_attention(None) is None
    linformer = {"name": "linformer", "proj_len": 256, "max_seq_len": 512}
    assert text_attention("linformer-256", max_length=512) == linformer
    with pytest.raises(ValueError, match="sequence length"):
        text_attention("linformer-64")


def test_pretraining_loss_falls_and_writes_a_loadable_model(setup, tmp_path):
    out = tmp_path / "run"
    assert (
        main(_args(setup, out, "--steps", "40", "--lr", "3e-3", "--warmup", "2", "--eval-every", "20",
                   "--dupe-factor", "1")) == 0  # one draw per pair: the tiny corpus repeats, the loss falls fast
    )
    train = [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"]
    assert len(train) == 20  # log every 2 steps
    assert sum(train[-3:]) / 3 < 0.75 * sum(train[:3]) / 3
    dev = [r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "dev"]
    assert [r["step"] for r in dev] == [20, 40]
    assert all(0 <= r[k] <= 1 for r in dev for k in ("mlm_accuracy", "sop_accuracy"))
    assert dev[-1]["mlm_loss"] + dev[-1]["sop_loss"] == pytest.approx(dev[-1]["loss"], rel=1e-5)
    import transformers

    model = transformers.AutoModelForPreTraining.from_pretrained(out / "model")
    assert isinstance(model, NystromformerForPreTraining) and model.config.attention["num_landmarks"] == 8
    fill = transformers.pipeline("fill-mask", model=str(out / "model"))
    assert len(fill(f"the {fill.tokenizer.mask_token} is")) == 5
    res = json.loads((out / "results.json").read_text())
    assert res["metric"] == "mlm_accuracy" and res["best_dev"] == max(r["mlm_accuracy"] for r in dev)


def test_init_from_minilm_keeps_the_encoder():
    run = PretrainRun(corpus=("python-docstrings",), out=Path("unused"), init_from="minilm", attention="softmax")
    model, tok, preset = build_model(run)
    assert not preset
    from nystrom.model import from_bert, minilm_path

    ref = from_bert(minilm_path(), attention="softmax")
    assert tok is not None and tok.name == "tokenizer.json"
    own = model.nystromformer.state_dict()
    for k, v in ref.state_dict().items():
        assert torch.equal(own[k], v), k
    ids = torch.tensor([[101, 7592, 2088, 102]])
    model.eval()
    assert torch.allclose(model.nystromformer(ids).last_hidden_state, ref(ids).last_hidden_state, atol=1e-6)


def test_resume_with_other_options_is_refused(setup, tmp_path):
    run = PretrainRun(
        corpus=(str(CORPUS),), out=tmp_path, tokenizer=setup / "tokenizer.json", init_from=str(setup / "tiny.json"),
        attention="nystrom-8", max_length=48, steps=1, batch_size=4, dev_fraction=0.2,
    )  # fmt: skip
    run_pretrain(run, progress=False)
    with pytest.raises(ValueError, match=r"other options \(attention, model_config differ\)"):
        run_pretrain(PretrainRun(**{**run.__dict__, "attention": "softmax"}), progress=False)


def test_a_record_written_before_later_options_describes_the_same_run():
    # regression: the #37 source's record (lr_scale None, no position_extension) refused its own retraining
    config = {"hidden_size": 8, "position_extension": None}
    new = {"lr": 1e-4, "lr_scale": [], "dev_seed": None, "model_config": config}
    old = {"lr": 1e-4, "lr_scale": None, "model_config": {"hidden_size": 8}}
    assert same_run(old, new)
    assert not same_run({**old, "model_config": {"hidden_size": 16}}, new)
    assert not same_run(old, {**new, "model_config": {**config, "position_extension": {"name": "copy"}}})


def test_ddp_two_processes_equals_one_process(setup, tmp_path, free_port):
    one, two = tmp_path / "one", tmp_path / "two"
    # batch 4: the 5 dev examples make 2 evaluation batches, one per process
    extra = ("--steps", "4", "--lr", "1e-3", "--eval-every", "2", "--batch-size", "4")
    cmd = [sys.executable, "-m", "nystrom_lab.cli"]
    subprocess.run([*cmd, *_args(setup, one, *extra)], check=True, env=ENV, capture_output=True)
    ddp = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port}", "-m"]
    proc = subprocess.run(
        [*ddp, "nystrom_lab.cli", *_args(setup, two, *extra)],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (
        load_file(str(one / "last" / "model.safetensors")),
        load_file(str(two / "last" / "model.safetensors")),
    )
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), (k, float((a[k] - b[k]).abs().max()))
    d1 = [r for r in read_metrics(one / "metrics.jsonl") if r["split"] == "dev"]
    d2 = [r for r in read_metrics(two / "metrics.jsonl") if r["split"] == "dev"]
    for r1, r2 in zip(d1, d2, strict=True):
        assert r1["mlm_accuracy"] == pytest.approx(r2["mlm_accuracy"], abs=1e-9)
        assert r1["sop_loss"] == pytest.approx(r2["sop_loss"], abs=1e-5)


def test_plot_runs_draws_and_tabulates(tmp_path):
    runs = []
    for name, base in (("nystrom-64", 0.30), ("softmax", 0.32)):
        run = tmp_path / name
        run.mkdir()
        (run / "pretrain_run.json").write_text(json.dumps({"attention": name}))
        recs = [
            {"step": s, "split": "dev", "mlm_accuracy": base + s / 1000, "sop_accuracy": 0.5}
            for s in (10, 20)
        ]
        recs.insert(0, {"step": 5, "split": "train", "loss": 3.0})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        runs.append(run)
    table = plot_runs(runs, tmp_path / "fig5.png", tmp_path / "fig5.md")
    assert (tmp_path / "fig5.png").stat().st_size > 5000
    lines = table.splitlines()
    assert "nystrom-64 MLM acc" in lines[0] and "softmax SOP acc" in lines[0]
    assert lines[2] == "| 10 | 0.3100 | 0.5000 | 0.3300 | 0.5000 |"
    assert (tmp_path / "fig5.md").read_text() == table
    # the conv-skip ablation is a second nystrom-64 run: drawn beside the first under its own label
    ablation = tmp_path / "ablation" / "nystrom-64"
    ablation.mkdir(parents=True)
    (ablation / "metrics.jsonl").write_text((runs[0] / "metrics.jsonl").read_text())
    record = {"attention": "nystrom-64", "model_config": {"attention": {"name": "nystrom", "conv_kernel_size": None}}}
    (ablation / "pretrain_run.json").write_text(json.dumps(record))
    header = plot_runs([*runs, ablation], tmp_path / "ab.png").splitlines()[0]
    assert "nystrom-64 MLM acc" in header and "nystrom-64 no conv MLM acc" in header
    # a spec that says so itself is not labelled twice
    record["attention"] = "nystrom-64,conv_kernel_size=none"
    (ablation / "pretrain_run.json").write_text(json.dumps(record))
    header = plot_runs([*runs, ablation], tmp_path / "ab.png").splitlines()[0]
    assert "nystrom-64,conv_kernel_size=none MLM acc" in header and "no conv" not in header
