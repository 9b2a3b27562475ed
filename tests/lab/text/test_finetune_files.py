"""`nystrom finetune --train-file` on the user's own CSV/JSONL files, and `nystrom predict` on its model.

The whole flow on a tiny model and tokenizer: string labels train, the output folder loads
and predicts label names, and ``--device cuda`` without CUDA fails clearly.
"""

import io
import json
import random
from pathlib import Path

import pytest
import torch

from lab.text.tiny_text import tiny_text_setup
from nystrom_lab.cli import main as cli_main
from nystrom_lab.data.records import read_metrics
from nystrom_lab.text.predict import load_classifier, predict_texts

POS = ["the train reached the coast", "every token looks at attention", "the child counted the cows"]
NEG = ["the cost grows with the square", "long documents are expensive", "a book chapter may hold tokens"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tiny_text_setup(tmp_path_factory.mktemp("files"), max_positions=64)
    rng = random.Random(0)
    rows = [(t, "pos") for t in POS] * 4 + [(t, "neg") for t in NEG] * 4
    rng.shuffle(rows)
    (root / "train.csv").write_text("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows))
    (root / "dev.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows[:6]))
    return root


def _model_args(tiny):
    return ["--init-from", str(tiny / "tiny.json"), "--tokenizer", str(tiny / "tokenizer.json"), "--attention",
            "nystrom-4,conv_kernel_size=3", "--batch-size", "4", "--lr", "3e-3", "--dropout", "0", "--no-progress",
            "--device", "cpu", "--max-length", "32"]  # fmt: skip


def test_done_when_csv_with_string_labels_trains_and_predicts_names(tiny, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    code = cli_main([
        "finetune", "--train-file", str(tiny / "train.csv"), "--validation-file", str(tiny / "dev.csv"),
        "--text-column", "text", "--label-column", "label", "--epochs", "15", "--out", str(out), *_model_args(tiny),
    ])  # fmt: skip
    assert code == 0
    res = json.loads((out / "finetune_results.json").read_text())
    assert set(res["validation"]) >= {"accuracy", "macro_f1", "matthews", "f1", "examples"}
    assert res["validation"]["accuracy"] >= 5 / 6  # 2 easy classes, 24 examples, 15 epochs
    assert res["loop"]["metric"] == "accuracy" and res["loop"]["best_step"] > 0
    train_logs = [r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"]
    assert all(r["tokens_per_s"] > 0 for r in train_logs)
    preds = (out / "predictions_validation.tsv").read_text().splitlines()
    assert preds[0] == "index\tprediction" and {p.split("\t")[1] for p in preds[1:]} <= {"neg", "pos"}

    clf = load_classifier(out / "model")
    assert clf.labels.names == ("neg", "pos") and clf.labels.problem_type == "single_label_classification"
    recs = predict_texts(clf, POS + NEG)
    assert sum(r["label"] == y for r, y in zip(recs, ["pos"] * 3 + ["neg"] * 3)) >= 5
    assert all(r["score"] == pytest.approx(max(r["scores"].values())) for r in recs)
    assert all(sum(r["scores"].values()) == pytest.approx(1.0) for r in recs)
    expect = {t: r["label"] for t, r in zip(POS + NEG, recs)}

    from transformers import pipeline  # the folder is a transformers model: pipeline reports the names

    pipe = pipeline("text-classification", model=str(out / "model"), device="cpu")
    piped = pipe(POS + NEG)
    assert [p["label"] for p in piped] == [r["label"] for r in recs]
    assert [p["score"] for p in piped] == pytest.approx([r["score"] for r in recs], abs=1e-4)

    (tmp_path / "new.txt").write_text(f"{POS[1]}\n\n{NEG[2]}\n{POS[2]}\n")
    capsys.readouterr()
    assert cli_main(["predict", str(out / "model"), "--input", str(tmp_path / "new.txt"), "--no-progress",
                     "--device", "cpu", "--output", str(tmp_path / "p.jsonl")]) == 0  # fmt: skip
    lines = [json.loads(ln) for ln in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["label"] for r in lines] == [expect[POS[1]], expect[NEG[2]], expect[POS[2]]]  # blank line skipped
    assert cli_main(["predict", str(out / "model"), "--input", str(tiny / "dev.csv"), "--no-progress"]) == 0
    stdout = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert len(stdout) == 6 and all(r["label"] in ("neg", "pos") for r in stdout)
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{NEG[0]}\n{POS[0]}\n"))
    assert cli_main(["predict", str(out / "model"), "--input", "-", "--no-progress"]) == 0
    assert [json.loads(ln)["label"] for ln in capsys.readouterr().out.splitlines()] == [expect[NEG[0]], expect[POS[0]]]


def test_device_cuda_without_cuda_fails_clearly(tiny, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = cli_main(["finetune", "--train-file", str(tiny / "train.csv"), "--out", str(tmp_path / "x"),
                     *_model_args(tiny), "--device", "cuda"])  # fmt: skip
    assert code == 2  # a usage error, found while parsing: before any data is read
    err = capsys.readouterr().err
    assert "--device" in err and "CUDA is not available" in err and "use --device cpu" in err
    assert not (tmp_path / "x").exists()


def test_jsonl_regression_and_multi_label(tiny, tmp_path):
    reg = tmp_path / "reg.jsonl"
    reg.write_text("".join(json.dumps({"sentence": t, "score": s}) + "\n" for t, s in
                           [(POS[0], 0.9), (NEG[0], 0.1), (POS[1], 0.8), (NEG[1], 0.25)] * 3))  # fmt: skip
    out = tmp_path / "reg"
    assert cli_main(["finetune", "--train-file", str(reg), "--validation-file", str(reg), "--text-column", "sentence",
                     "--label-column", "score", "--epochs", "1", "--out", str(out), *_model_args(tiny)]) == 0  # fmt: skip
    res = json.loads((out / "finetune_results.json").read_text())
    assert (
        set(res["validation"]) == {"pearson", "spearman", "mse", "examples"}
        and res["loop"]["metric"] == "pearson"
    )
    clf = load_classifier(out / "model")
    assert clf.labels.problem_type == "regression" and set(predict_texts(clf, ["x"])[0]) == {"score"}

    multi = tmp_path / "multi.jsonl"
    multi.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in
                             [(POS[0], ["a", "b"]), (NEG[0], []), (POS[1], ["b"]), (NEG[1], ["a"])] * 3))  # fmt: skip
    out = tmp_path / "multi"
    assert cli_main(["finetune", "--train-file", str(multi), "--validation-file", str(multi), "--epochs", "1",
                     "--metric", "micro_f1", "--out", str(out), *_model_args(tiny)]) == 0  # fmt: skip
    res = json.loads((out / "finetune_results.json").read_text())
    assert set(res["validation"]) == {"accuracy", "macro_f1", "micro_f1", "examples"}
    rec = predict_texts(load_classifier(out / "model"), ["x"])[0]
    assert set(rec["scores"]) == {"a", "b"} and set(rec["labels"]) <= {"a", "b"}


def test_a_bad_file_names_file_line_and_column(tiny, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("sentence,label\nfine,pos\n")
    assert cli_main(["finetune", "--train-file", str(bad), "--out", str(tmp_path / "o"), *_model_args(tiny)]) == 1
    err = capsys.readouterr().err
    assert "bad.csv: no column 'text'; the columns are ['sentence', 'label']" in err
    assert not (tmp_path / "o").exists()  # nothing written before the data is checked
    (tmp_path / "dev.csv").write_text("text,label\nfine,pos\nbad,maybe\n")
    args = ["--train-file", str(tiny / "train.csv"), "--validation-file", str(tmp_path / "dev.csv")]
    assert cli_main(["finetune", *args, "--out", str(tmp_path / "p"), *_model_args(tiny)]) == 1
    assert "dev.csv line 3: column 'label': label 'maybe' is not among the training labels" in capsys.readouterr().err


def test_predict_on_a_folder_that_is_no_model_says_so(tmp_path, capsys):
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    (tmp_path / "in.txt").write_text("a line\n")
    assert cli_main(["predict", str(tmp_path / "run"), "--input", str(tmp_path / "in.txt"), "--no-progress"]) == 1
    assert f"did you mean {tmp_path / 'run' / 'model'}?" in capsys.readouterr().err
    assert cli_main(["predict", str(tmp_path / "run"), "--input", str(tmp_path / "missing.txt")]) == 2


def test_the_bare_command_defaults_to_minilm_and_a_runs_folder(tiny, monkeypatch, tmp_path):
    """`nystrom finetune --train-file train.csv --validation-file dev.csv --text-column text --label-column
    label`, exactly: the bundled MiniLM is the starting point and runs/finetune/train the output."""
    import nystrom_lab.text.finetune as ft

    seen = []
    monkeypatch.setattr(ft, "run_finetune", lambda run, progress: seen.append(run) or {"loop": {}})
    monkeypatch.chdir(tmp_path)
    argv = ["finetune", "--train-file", str(tiny / "train.csv"), "--validation-file", str(tiny / "dev.csv"),
            "--text-column", "text", "--label-column", "label"]  # fmt: skip
    assert cli_main(argv) == 0
    assert seen[0].init_from == "minilm" and seen[0].out == Path("runs/finetune/train")


def test_long_documents_from_a_converted_model_report_their_truncation(tiny, tmp_path, capsys):
    """`finetune --init-from` a `convert long` folder: documents beyond --max-length are cut, and said so."""
    from nystrom.model import NystromformerConfig, NystromformerForMaskedLM

    cfg = NystromformerConfig.from_json_file(tiny / "tiny.json").replace(attention="softmax")
    torch.manual_seed(0)
    NystromformerForMaskedLM(cfg).save_pretrained(tmp_path / "short")
    (tmp_path / "short" / "tokenizer.json").write_bytes((tiny / "tokenizer.json").read_bytes())
    assert cli_main(["convert", "long", "--init-from", str(tmp_path / "short"), "--max-length", "256",
                     "--out", str(tmp_path / "long"), "--attention", "nystrom-8,conv_kernel_size=3"]) == 0  # fmt: skip
    docs = [(" ".join([POS[i % 3]] * (4 + 8 * i)), "pos") for i in range(6)] + [(NEG[i % 3], "neg") for i in range(6)]
    (tmp_path / "docs.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in docs))
    out = tmp_path / "run"
    capsys.readouterr()
    code = cli_main(["finetune", "--init-from", str(tmp_path / "long"), "--train-file", str(tmp_path / "docs.csv"),
                     "--validation-file", str(tmp_path / "docs.csv"), "--max-length", "128", "--epochs", "1",
                     "--batch-size", "4", "--out", str(out), "--no-progress", "--device", "cpu"])  # fmt: skip
    assert code == 0
    from nystrom_lab.data.text import load_tokenizer

    lengths = [2 + len(ids) for ids in load_tokenizer(tiny / "tokenizer.json").encode([t for t, _ in docs])]
    cut = sum(n > 128 for n in lengths)
    assert 0 < cut < 12
    printed = capsys.readouterr().out
    assert f"train: {cut} of 12 examples longer than 128 tokens were cut" in printed
    res = json.loads((out / "finetune_results.json").read_text())
    assert res["truncated"]["train"]["examples"] == cut and res["truncated"]["train"]["of"] == 12
    assert res["truncated"]["train"]["tokens_dropped"] == sum(max(0, n - 128) for n in lengths)
