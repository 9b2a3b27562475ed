"""GLUE/IMDB readers in the real formats, malformed rows, F1, and `nystrom finetune` end to end."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from lab.text.tiny_text import FIX, tiny_text_setup
from nystrom_lab.cli import run_command as main
from nystrom_lab.data.glue import encode_pair, load_glue_file, load_imdb_reviews, load_task, read_tsv
from nystrom_lab.data.records import read_metrics
from nystrom_lab.text.finetune import FinetuneRun, make_step
from nystrom_lab.training.metrics import check_metric, single_label_metrics

GLUE, IMDB = FIX / "glue", FIX / "aclImdb"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_text_setup(tmp_path_factory.mktemp("ft"))


def test_glue_readers_find_columns_by_header():
    sst = load_glue_file(GLUE, "sst2", "train.tsv", labelled=True)
    assert len(sst.text_a) == 8 and sst.text_b is None and sst.labels == [1, 1, 1, 1, 0, 0, 0, 0]
    assert sst.text_a[7] == 'a tedious , "clumsy and confused story'  # QUOTE_NONE: a quote is text
    mrpc = load_glue_file(GLUE / "MRPC", "mrpc", "train.tsv", labelled=True)  # the task folder itself, BOM
    assert mrpc.labels == [1, 0, 1, 0] and mrpc.text_b[0].startswith("The meeting will begin")
    qnli = load_glue_file(GLUE, "qnli", "train.tsv", labelled=True)
    assert qnli.labels == [0, 1, 0, 1] and qnli.index == ["0", "1", "2", "3"]
    qqp = load_glue_file(GLUE, "qqp", "dev.tsv", labelled=True)
    assert qqp.index == ["10", "11", "12"] and qqp.labels == [0, 1, 0]
    mnli = load_task(GLUE, "mnli")
    assert [e.name for e in mnli["dev"]] == ["mnli/dev_matched", "mnli/dev_mismatched"]
    assert mnli["dev"][0].labels == [1, 2, 0] and mnli["train"][0].text_b[2] == "The shop closes at six ."
    test = load_task(GLUE, "sst2")["test"][0]
    assert test.labels is None and test.index == ["0", "1", "2"]


def test_malformed_row_names_file_and_line(tmp_path):
    shutil.copytree(GLUE / "SST-2", tmp_path / "SST-2")
    with open(tmp_path / "SST-2" / "train.tsv", "a") as f:
        f.write("fine\t1\n" * 7 + "too\tmany\t1\n")
    with pytest.raises(
        ValueError, match=r"SST-2/train\.tsv line 17: expected 2 tab-separated fields, got 3$"
    ):
        load_glue_file(tmp_path, "sst2", "train.tsv", labelled=True)
    (tmp_path / "SST-2" / "dev.tsv").write_text("sentence\tlabel\ngood\t7\n")
    with pytest.raises(ValueError, match=r"SST-2/dev\.tsv line 2: label '7'"):
        load_glue_file(tmp_path, "sst2", "dev.tsv", labelled=True)
    with pytest.raises(FileNotFoundError, match="SST-2/missing.tsv"):
        read_tsv(tmp_path / "SST-2" / "missing.tsv", display="SST-2/missing.tsv")


def test_imdb_reader():
    train = load_imdb_reviews(IMDB, "train")
    assert train.index == ["neg/0_2", "neg/1_2", "pos/0_9", "pos/1_9"] and train.labels == [0, 0, 1, 1]
    assert "<br" not in train.text_a[2] and train.text_a[2].startswith("This movie was wonderful.")


def f1_score(pred: list[int], gold: list[int]) -> float:
    """F1 of class 1, written plainly."""
    tp = sum(p == 1 and g == 1 for p, g in zip(pred, gold))
    fp = sum(p == 1 and g != 1 for p, g in zip(pred, gold))
    fn = sum(p != 1 and g == 1 for p, g in zip(pred, gold))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def test_f1_against_a_hand_computed_example():
    pred, gold = [1, 1, 0, 0, 1, 0], [1, 0, 1, 0, 1, 0]  # tp 2, fp 1, fn 1, tn 2
    logits = torch.nn.functional.one_hot(torch.tensor(pred), 2).float()
    m = single_label_metrics(logits, torch.tensor(gold))
    assert m["f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1)) == pytest.approx(f1_score(pred, gold))
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["macro_f1"] == pytest.approx((2 / 3 + 2 / 3) / 2)  # class 0: tp 2, fp 1, fn 1 as well
    assert single_label_metrics(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([1, 0]))["f1"] == 0.0

    class Fixed(torch.nn.Module):
        def forward(self, **_):
            return type("O", (), {"logits": logits})

    loss, rows = make_step("single_label_classification")(Fixed(), {"labels": torch.tensor(gold)})
    assert torch.equal(rows["logits"], logits) and torch.equal(rows["labels"], torch.tensor(gold))
    assert float(loss) == pytest.approx(float(torch.nn.functional.cross_entropy(logits, torch.tensor(gold))))


def test_pair_encoding_truncates_longest_first(setup):
    from nystrom_lab.data.text import load_tokenizer

    tok = load_tokenizer(setup / "tokenizer.json")
    ids, types = encode_pair(list(range(10, 20)), [7, 8, 9], tok, 10)
    assert ids.tolist() == [tok.cls_id, 10, 11, 12, 13, tok.sep_id, 7, 8, 9, tok.sep_id]
    assert types.tolist() == [0] * 6 + [1] * 4


def _run(setup, task, out, data, *extra):
    args = ["finetune", task, "--data", str(data), "--out", str(out), "--init-from", str(setup / "tiny.json"),
            "--tokenizer", str(setup / "tokenizer.json"), "--attention", "nystrom-4,conv_kernel_size=3",
            "--batch-size", "4", "--epochs", "2", "--lr", "1e-3", "--no-progress", *extra]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "finetune_results.json").read_text())


def _predictions(path: Path) -> list[list[str]]:
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction"
    return [ln.split("\t") for ln in lines[1:]]


def test_finetune_sst2_writes_predictions(setup, tmp_path):
    res = _run(setup, "sst2", tmp_path, GLUE)
    assert res["dev"]["examples"] == 4 and 0 <= res["dev"]["accuracy"] <= 1
    dev = _predictions(tmp_path / "predictions_dev.tsv")
    test = _predictions(tmp_path / "predictions_test.tsv")
    assert [r[0] for r in dev] == ["0", "1", "2", "3"] and [r[0] for r in test] == ["0", "1", "2"]
    assert all(r[1] in ("0", "1") for r in dev + test)
    gold = load_glue_file(GLUE, "sst2", "dev.tsv", labelled=True).labels
    assert res["dev"]["accuracy"] == sum(int(r[1]) == g for r, g in zip(dev, gold)) / 4
    assert len(res["loop"]) and (tmp_path / "metrics.jsonl").is_file()
    # the output folder is a transformers model with its tokenizer: a pipeline gives the dev predictions
    import transformers

    clf = transformers.pipeline("text-classification", model=str(tmp_path / "model"))
    texts = load_glue_file(GLUE, "sst2", "dev.tsv", labelled=True).text_a
    assert [p["label"] for p in clf(texts)] == [r[1] for r in dev]


def test_finetune_mrpc_f1_and_mnli_two_dev_sets(setup, tmp_path):
    res = _run(setup, "mrpc", tmp_path / "mrpc", GLUE)
    preds = [int(r[1]) for r in _predictions(tmp_path / "mrpc" / "predictions_dev.tsv")]
    assert res["dev"]["f1"] == pytest.approx(f1_score(preds, [1, 0]))
    res = _run(setup, "mnli", tmp_path / "mnli", GLUE)
    assert set(res) == {"loop", "truncated", "dev_matched", "dev_mismatched"}
    rows = _predictions(tmp_path / "mnli" / "predictions_dev_mismatched.tsv")
    assert len(rows) == 3 and all(r[1] in ("contradiction", "entailment", "neutral") for r in rows)


def test_finetune_selects_best_dev_step_by_f1(setup, tmp_path):
    res = _run(setup, "mrpc", tmp_path, GLUE, "--select-metric", "f1", "--epochs", "4")
    devs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "dev"]
    assert len(devs) >= 2 and all("f1" in r for r in devs)
    best = max(devs, key=lambda r: (r["f1"], -r["step"]))  # the first step reaching the highest F1
    assert res["loop"]["metric"] == "f1"
    assert (res["loop"]["best_dev"], res["loop"]["best_step"]) == (best["f1"], best["step"])


def test_metric_must_be_one_the_task_reports():
    with pytest.raises(ValueError, match="f1 is the F1 of class 1 of a two-class task"):
        check_metric("f1", "single_label_classification", 3)
    with pytest.raises(ValueError, match="'pearson' is not reported for single_label_classification"):
        check_metric("pearson", "single_label_classification", 2)
    with pytest.raises(ValueError, match="give either --train-file FILE or a GLUE/IMDB task"):
        FinetuneRun(out=Path("unused"))


def test_imdb_from_a_pretrain_run(setup, tmp_path):
    pre = tmp_path / "pre"
    assert main([
        "pretrain", "--corpus", str(FIX / "corpus"), "--tokenizer", str(setup / "tokenizer.json"),
        "--init-from", str(setup / "tiny.json"), "--attention", "nystrom-4,conv_kernel_size=3", "--max-length", "32",
        "--steps", "2", "--batch-size", "4", "--dev-fraction", "0.2", "--out", str(pre), "--no-progress",
    ]) == 0  # fmt: skip
    out = tmp_path / "imdb"
    args = ["finetune", "imdb", "--data", str(IMDB), "--out", str(out), "--init-from", str(pre),
            "--batch-size", "2", "--epochs", "1", "--max-length", "64", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    res = json.loads((out / "finetune_results.json").read_text())
    assert res["test"]["examples"] == 4
    assert [r[0] for r in _predictions(out / "predictions_test.tsv")] == [
        "neg/0_2",
        "neg/1_2",
        "pos/0_9",
        "pos/1_9",
    ]
