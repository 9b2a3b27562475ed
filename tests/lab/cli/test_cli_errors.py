"""Command-line errors (#15): one line ``nystrom: error: ...`` plus a hint, exit 2 for usage errors, 1 for
other failures, 130 after Ctrl-C, a traceback only with --debug / NYSTROM_DEBUG; every option is checked
before any data is generated or loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from nystrom_lab.cli import main


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("NYSTROM_DEBUG", raising=False)  # a developer's NYSTROM_DEBUG=1 adds tracebacks


def _err(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()


# ---------------------------------------------------------------- usage errors: before any work
def test_a_bogus_attention_fails_at_parse_time_before_listops_is_generated(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["lra", "listops", "--attention", "bogus", "--listops-sizes", "200,50,50", "--out", str(out)]
    assert main(argv) == 2
    lines = _err(capsys)
    assert lines[0].startswith("nystrom: error: argument --attention: unknown attention 'bogus'; expected NAME[-M]")
    assert "nystrom-32,conv_kernel_size=none,pinv=exact" in lines[0]  # the valid forms, by example
    assert lines[1] == "hint: `nystrom lra --help` lists the options" and len(lines) == 2
    assert not out.exists()  # nothing generated (the official set takes 40 s and 1.1 GB)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1e-4", "fast"])
def test_the_learning_rate_must_be_a_finite_positive_number(value, capsys):
    for argv in (["lra", "listops"], ["pretrain", "--corpus", "python-docstrings", "--out", "x"]):
        assert main([*argv, f"--lr={value}"]) == 2  # = form: argparse reads -inf as an option
        assert (
            _err(capsys)[0] == f"nystrom: error: argument --lr: expected a finite number > 0, got {value!r}"
        )


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("x")
    return path


#: (command line, the option and the words the one-line error must name); "{f}" is a file, "{m}" missing,
#: "{d}" an empty folder
# fmt: off
BAD = [
    # nystrom lra
    (["lra", "listops", "--steps", "0"], "--steps: expected a positive integer, got '0'"),
    (["lra", "listops", "--batch-size=-4"], "--batch-size: expected a positive integer"),
    (["lra", "listops", "--eval-every", "0"], "--eval-every: expected a positive integer"),
    (["lra", "listops", "--eval-batches", "1.5"], "--eval-batches: expected a positive integer"),
    (["lra", "listops", "--max-length", "0"], "--max-length: expected a positive integer"),
    (["lra", "text", "--data", "{m}"], "--data: '{m}' does not exist"),
    (["lra", "text", "--data", "{f}"], "--data: '{f}' is a file, not a folder"),
    (["lra", "listops", "--out", "{f}"], "--out: '{f}' is a file"),
    (["lra", "listops", "--attention", "nystrom-0"], "--attention: nystrom: num_landmarks must be a positive int"),
    (["lra", "listops", "--attention", "softmax-64"], "--attention: 'softmax-64': softmax takes no -M number"),
    (["lra", "listops", "--attention", "nystrom,landmarks=8"], "'landmarks=8' is not key=value with a key of nystrom (num_landmarks,"),
    (["lra", "listops", "--listops-sizes", "10,0,5"], "--listops-sizes: expected TRAIN,DEV,TEST positive"),
    (["lra", "image", "--listops-sizes", "10,5,5"], "only applies to the listops task"),
    # nystrom pretrain / finetune / plot-runs / convert
    (["pretrain", "--corpus", "{m}", "--out", "o"], "--corpus: '{m}' does not exist"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--attention", "bogus"], "--attention: unknown attention 'bogus'"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--steps", "0"], "--steps: expected a positive"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--warmup=-1"], "--warmup: expected an integer >= 0"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--dev-fraction", "1"], "--dev-fraction: expected a number between 0 and 1"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--init-from", "{m}.json"], "--init-from: '{m}.json' does not exist"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--init-from", "bert-huge"], "--init-from: 'bert-huge' is neither an existing folder nor a preset"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--tokenizer", "{m}"], "--tokenizer: '{m}' does not exist"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--init-from", "{m}"], "--init-from: '{m}' is neither"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--init-from", "{d}"], "--init-from: '{d}' holds no config.json"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--grad-accum", "0"], "--grad-accum: expected a positive"),
    (["pretrain", "--corpus", "python-docstrings", "--out", "o", "--dropout", "1"], "--dropout: expected a probability"),
    (["finetune", "sst2", "--data", "{m}", "--out", "o"], "--data: '{m}' does not exist"),
    (["finetune", "sst2", "--data", ".", "--out", "o", "--epochs", "inf"], "--epochs: expected a finite number > 0"),
    (["finetune", "sst2", "--data", ".", "--out", "o", "--init-from", "{f}"], "--init-from: '{f}' is neither"),
    (["finetune", "sst2", "--data", ".", "--out", "o", "--max-length", "0"], "--max-length: expected a positive"),
    (["plot-runs", "{m}", "--png", "x.png"], "runs: '{m}' does not exist"),
    (["plot-runs", ".", "--png", "{m}/x.png"], "--png: the folder of '{m}/x.png' does not exist"),
    (["convert", "long", "--init-from", "{m}", "--max-length", "9", "--out", "o"], "--init-from: '{m}' is neither"),
    (["convert", "to-hf", "--init-from", "{d}", "--out", "o"], "--init-from: '{d}' holds no config.json"),
    # nystrom data
    (["data", "listops", "{f}"], "OUT_DIR: '{f}' is a file"),
    (["data", "listops", "o", "--train=-1"], "--train: expected an integer >= 0"),
    (["data", "listops", "o", "--workers", "0"], "--workers: expected a positive integer"),
    (["data", "pathfinder", "o", "--count", "0"], "--count: expected a positive integer"),
    (["data", "pathfinder", "o", "--images-per-batch", "x"], "--images-per-batch: expected a positive integer"),
    # nystrom bench / approx
    (["bench", "--lengths", "512,0"], "--lengths: expected positive integers"),
    (["bench", "--budget", "inf"], "--budget: expected a finite number > 0"),
    (["bench", "--repeats", "0"], "--repeats: expected a positive integer"),
    (["bench", "--out", "{f}"], "--out: '{f}' is a file"),
    (["bench", "--attention", "nystrom-32"], "option(s) ['--attention'] do not apply"),
    (["bench", "core", "--attention", "softmax"], "bench core compares Nyström implementations"),
    (["bench", "core", "--attention", "nystrom,pinv=exact"], "give nystrom or nystrom-M"),
    (["bench", "--methods", "nystrom-64,bogus"], "--methods: unknown ['bogus']"),
    (["bench", "core", "--impls", "bogus"], "--impls: unknown ['bogus']"),
    (["approx", "--text", "{m}"], "--text: '{m}' does not exist"),
    (["approx", "--trials", "0"], "--trials: expected a positive integer"),
    (["approx", "--methods", "bogus"], "--methods: unknown ['bogus']"),
    (["approx", "--layer", "6"], "--layer: expected an integer from 0 to 5, got '6'"),
    (["approx", "--fig-head=-1"], "--fig-head: expected an integer from 0 to 11"),
]
# fmt: on


@pytest.mark.parametrize("argv, words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_every_bad_option_is_a_usage_error_naming_it(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative outputs (o, x.png) land in the test's folder, if anywhere
    (tmp_path / "empty").mkdir()
    fill = {"{f}": str(_file(tmp_path)), "{m}": str(tmp_path / "missing"), "{d}": str(tmp_path / "empty")}
    for key, val in fill.items():
        argv = [a.replace(key, val) for a in argv]
        words = words.replace(key, val)
    assert main(argv) == 2
    lines = _err(capsys)
    assert lines[0].startswith("nystrom: error: ") and words in lines[0], lines
    assert lines[1].startswith("hint: ") and len(lines) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "empty"]  # nothing was written


OLD = [
    (["finetune", "sst2", "--data", ".", "--from-pretrain", "x"], "--from-pretrain", "--init-from"),
    (["finetune", "sst2", "--data", ".", "--from-hf", "x"], "--from-hf", "--init-from"),
    (["pretrain", "--corpus", "c", "--init-from-bert", "minilm"], "--init-from-bert", "--init-from"),
    (["pretrain", "--corpus", "c", "--model", "bert-base"], "--model", "--init-from"),
    (["pretrain", "--corpus", "c", "--seq-len=64"], "--seq-len", "--max-length"),
    (["pretrain", "--corpus", "c", "--conv-kernel", "5"], "--conv-kernel", "--attention nystrom,conv_kernel_size=K"),
    (["convert", "long", "--num-landmarks", "8"], "--num-landmarks", "--attention nystrom-M"),
    (["bench", "core", "--landmarks", "8"], "--landmarks", "--attention nystrom-M"),
]


@pytest.mark.parametrize("argv, old, new", OLD, ids=[o for _, o, _ in OLD])
def test_an_old_option_is_unknown_and_the_hint_names_the_new_one(argv, old, new, capsys):
    """One name per concept: the old spellings are gone (no aliases), and the error says what replaced them."""
    assert main(argv) == 2
    lines = _err(capsys)
    assert lines[0].startswith("nystrom: error: ") and lines[1].startswith(f"hint: {old} is now {new} (")


# ---------------------------------------------------------------- failures while running
def _failing_demo(monkeypatch, err: BaseException) -> None:
    def demo(*, quick: bool) -> int:
        raise err

    monkeypatch.setattr("nystrom_lab.demo.main", demo)


@pytest.mark.parametrize(
    "err",
    [
        ValueError("the dev split is empty"),
        TypeError("conv_kernel_size must be an int, got True"),
        FileNotFoundError(2, "No such file or directory", "x/config.json"),
        FloatingPointError("non-finite training loss nan at step 3; lower the lr"),
    ],
)
def test_a_user_error_is_one_line_with_a_hint_and_exit_1(err, monkeypatch, capsys):
    _failing_demo(monkeypatch, err)
    assert main(["demo"]) == 1
    assert _err(capsys) == [
        f"nystrom: error: {err}",
        "hint: run again with --debug (or NYSTROM_DEBUG=1) for the full traceback",
    ]


def test_a_bug_says_internal_error_and_asks_for_a_report(monkeypatch, capsys):
    _failing_demo(monkeypatch, KeyError("accuracy"))
    assert main(["demo"]) == 1
    assert _err(capsys) == [
        "nystrom: error: internal error (KeyError: 'accuracy')",
        "hint: this is a bug in nystrom; please report it with the full traceback "
        "(run again with --debug or NYSTROM_DEBUG=1)",
    ]


@pytest.mark.parametrize("how", ["--debug first", "--debug last", "NYSTROM_DEBUG=1"])
def test_debug_prints_the_traceback(how, monkeypatch, capsys):
    _failing_demo(monkeypatch, ValueError("bad value"))
    argv = {"--debug first": ["--debug", "demo"], "--debug last": ["demo", "--debug"]}.get(how, ["demo"])
    if how.startswith("NYSTROM_DEBUG"):
        monkeypatch.setenv("NYSTROM_DEBUG", "1")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "raise err" in err
    assert err.rstrip().endswith("nystrom: error: bad value")  # no "run again with --debug" hint


def test_ctrl_c_exits_130_and_says_the_run_can_be_resumed(monkeypatch, capsys):
    _failing_demo(monkeypatch, KeyboardInterrupt())
    assert main(["demo"]) == 130
    lines = _err(capsys)
    assert lines[0] == "nystrom: interrupted" and "resumes from its last checkpoint" in lines[1]


def test_missing_data_files_in_an_existing_folder_are_a_usage_error(tmp_path, capsys):
    assert main(["lra", "retrieval", "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    lines = _err(capsys)
    assert lines[0].startswith(f"nystrom: error: retrieval: data not found at {tmp_path}")
    assert "new_aan_pairs.train.tsv" in lines[0] and len(lines) == 2
    assert not (tmp_path / "o").exists()  # the refused run leaves no empty output folder


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "--debug" in capsys.readouterr().out


def test_options_that_do_not_go_together_are_a_usage_error_with_the_commands_help(capsys):
    assert main(["lra", "image", "--listops-sizes", "10,5,5"]) == 2
    assert _err(capsys) == [
        "nystrom: error: listops_sizes (--listops-sizes) only applies to the listops task",
        "hint: `nystrom lra --help` lists the options",
    ]


def test_the_approx_ranges_are_those_of_the_bundled_minilm():
    import json

    from nystrom.model import minilm_path
    from nystrom_lab.bench.approx.commands import MINILM_HEADS, MINILM_LAYERS

    cfg = json.loads((minilm_path() / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (MINILM_LAYERS, MINILM_HEADS)


def test_out_of_memory_hints_at_the_batch_size(monkeypatch, capsys):
    _failing_demo(monkeypatch, MemoryError("cannot allocate 8 GiB"))
    assert main(["demo"]) == 1
    assert _err(capsys) == [
        "nystrom: error: cannot allocate 8 GiB",
        "hint: reduce --batch-size (or the sequence length)",
    ]


def test_a_bad_data_file_is_one_line_naming_file_and_line(tmp_path, capsys):
    data = tmp_path / "listops"
    data.mkdir()
    for split in ("train", "val", "test"):
        (data / f"basic_{split}.tsv").write_text("Source\tTarget\n( [MAX 2 9 ] )\t9\n[MIN 1 2 ]\tx\n")
    out = tmp_path / "run"
    assert main(["lra", "listops", "--data", str(data), "--out", str(out)]) == 1
    lines = _err(capsys)
    assert lines[0].startswith(f"nystrom: error: {data / 'basic_train.tsv'} line 3: ") and len(lines) == 2
    assert not out.exists()  # refused at load time: no lock, record or checkpoint left behind
