"""One CLI vocabulary (#35): one attention spec grammar whose defaults are NystromAttention's, one start-point
option (``--init-from``, its kind read from config.json), ``--max-length``, ``--device`` wherever a command
computes, no default output under docs/, and no option spelled the old ways."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import pytest
import transformers

from nystrom.attention import REGISTRY, NystromAttention
from nystrom.model import NystromformerConfig, NystromformerModel
from nystrom_lab import attention_spec
from nystrom_lab.argtypes import RENAMED, UsageError, cpu_only
from nystrom_lab.attention_spec import ATTENTION_KEYS, MAIN_KEY, format_spec, label, parse, resolve
from nystrom_lab.cli import build_parser
from nystrom_lab.start_point import detect

transformers.logging.set_verbosity_error()
LAB = Path(attention_spec.__file__).parent
NYSTROM = {k: p.default for k, p in inspect.signature(NystromAttention).parameters.items()}


# ---------------------------------------------------------------- the attention spec grammar
@pytest.mark.parametrize(
    "text, spec",
    [
        ("nystrom", {"name": "nystrom"}),
        ("nystrom-32", {"name": "nystrom", "num_landmarks": 32}),
        ("nystrom-64,conv_kernel_size=33,pinv_iterations=6",
         {"name": "nystrom", "num_landmarks": 64, "conv_kernel_size": 33, "pinv_iterations": 6}),
        ("nystrom,conv_kernel_size=none,pinv=exact,recompute=true",
         {"name": "nystrom", "conv_kernel_size": None, "pinv": "exact", "recompute": True}),
        ("nystrom,pinv_iterations=0", {"name": "nystrom", "pinv_iterations": 0}),
        ("softmax", {"name": "softmax"}),
        ("linear", {"name": "linear"}),
        ("linformer-256", {"name": "linformer", "proj_len": 256}),
        ("performer-16,seed=-3", {"name": "performer", "num_features": 16, "seed": -3}),
        ("reformer-2,seed=none", {"name": "reformer", "n_hashes": 2, "seed": None}),
        ("longformer-257", {"name": "longformer", "window_size": 257}),
    ],
)  # fmt: skip
def test_valid_specs_parse_to_the_options_they_set_and_format_back(text, spec):
    assert parse(text) == spec
    assert parse(format_spec(spec)) == spec and format_spec(spec) == text


@pytest.mark.parametrize(
    "text, words",
    [
        ("bogus", "unknown attention 'bogus'; expected NAME[-M][,key=value,...]"),
        ("", "unknown attention ''"),
        ("Nystrom-64", "unknown attention"),
        ("nystrom-x", "unknown attention"),
        ("nystrom-64-2", "unknown attention"),
        ("softmax-64", "softmax takes no -M number"),
        ("nystrom-0", "num_landmarks must be a positive int"),
        ("longformer-256", "window_size must be an odd positive int"),
        ("nystrom,landmarks=8", "'landmarks=8' is not key=value with a key of nystrom"),
        ("nystrom,num_landmarks", "is not key=value"),
        ("nystrom-64,num_landmarks=32", "num_landmarks is given twice"),
        ("nystrom,pinv=svd", "pinv must be one of iterative, exact"),
        ("nystrom,conv_kernel_size=4", "conv_kernel_size must be an odd positive int or none"),
        ("nystrom,recompute=1", "recompute must be true or false"),
        ("softmax,num_landmarks=8", "a key of softmax (conv_kernel_size, block_size, scale, recompute)"),
    ],
)
def test_invalid_specs_name_the_fault_and_the_valid_forms(text, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        parse(text)
    with pytest.raises(argparse.ArgumentTypeError):
        attention_spec.attention(text)


def test_the_allowed_keys_are_the_constructors_keyword_names():
    """The parser's key lists (kept beside it so parsing needs no torch) cannot drift from the modules."""
    from nystrom.model.configuration_nystromformer import attention_option_names
    from nystrom.ops.nystrom import PINV_METHODS
    from nystrom.ops.pinv import PINV_INITS

    assert set(ATTENTION_KEYS) == set(REGISTRY)
    for name, keys in ATTENTION_KEYS.items():
        assert tuple(keys) == attention_option_names(name), name
    assert set(MAIN_KEY) <= set(ATTENTION_KEYS) and all(MAIN_KEY[n] in ATTENTION_KEYS[n] for n in MAIN_KEY)
    assert ATTENTION_KEYS["nystrom"]["pinv"] == PINV_METHODS
    assert ATTENTION_KEYS["nystrom"]["pinv_init"] == PINV_INITS


def test_unset_keys_are_the_constructors_defaults_resolved_when_the_model_is_built():
    """Defaults live once, in NystromAttention's signature: a spec dict carries only what it sets (and a
    domain preset's values), and the built module has the signature's defaults."""
    assert resolve("nystrom") == {"name": "nystrom"}
    assert resolve("nystrom", preset={"nystrom": {"conv_kernel_size": 35}}) == {
        "name": "nystrom",
        "conv_kernel_size": 35,
    }
    assert (
        resolve("nystrom,conv_kernel_size=none", preset={"nystrom": {"conv_kernel_size": 35}})[
            "conv_kernel_size"
        ]
        is None
    )
    assert resolve("linformer", max_length=128) == {"name": "linformer", "max_seq_len": 128}
    module = REGISTRY["nystrom"](
        32, heads=2, dim_head=16, **{k: v for k, v in resolve("nystrom").items() if k != "name"}
    )
    for key in ("num_landmarks", "pinv_iterations", "pinv", "conv_kernel_size"):
        assert getattr(module, key) == NYSTROM[key], key
    assert label("nystrom") == f"nystrom-{NYSTROM['num_landmarks']}"
    assert label("nystrom,pinv=exact") == f"nystrom-{NYSTROM['num_landmarks']},pinv=exact"
    assert label("softmax") == "softmax"


def test_the_lab_writes_no_default_of_the_attention_constructor():
    """No literal 64 landmarks / 6 pinv iterations / 33 conv kernel in the lab: they are read from
    NystromAttention (presets that differ on purpose, like LRA's 35, say so)."""
    pattern = re.compile(r"""(num_landmarks|pinv_iterations|conv_kernel_size)["']?\s*[:=]\s*(64|6|33)\b""")
    rows = (
        LAB / "bench" / "table1" / "case.py",
        LAB / "bench" / "table1" / "report.py",  # the paper's Table 1 rows
        LAB / "bench" / "table1" / "outside_modules.py",
    )  # TransMIL's layer, written as TransMIL's own file writes it
    found = [f"{p.relative_to(LAB)}: {m.group(0)}" for p in LAB.rglob("*.py") if p not in rows
             for m in pattern.finditer(p.read_text())]  # fmt: skip
    assert found == []


# ---------------------------------------------------------------- --init-from
def _ours(folder: Path) -> Path:
    cfg = NystromformerConfig.preset("bert-small", vocab_size=40, hidden_size=16, num_attention_heads=2,
                                     intermediate_size=32, num_hidden_layers=1, attention="softmax")  # fmt: skip
    NystromformerModel(cfg).save_pretrained(folder)
    return folder


def _bert(folder: Path, cls=transformers.BertModel, config=transformers.BertConfig) -> Path:
    small = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 max_position_embeddings=40)  # fmt: skip
    cls(config(**small)).save_pretrained(folder)
    return folder


def test_init_from_detects_each_kind_from_config_json(tmp_path):
    ours = _ours(tmp_path / "ours")
    (tmp_path / "run").mkdir()
    _ours(tmp_path / "run" / "model")  # a `nystrom pretrain`/`finetune` run folder
    bert = _bert(tmp_path / "bert")
    roberta = _bert(tmp_path / "roberta", transformers.RobertaModel, transformers.RobertaConfig)
    hf = _bert(tmp_path / "hf", transformers.NystromformerModel, transformers.NystromformerConfig)
    (tmp_path / "tiny.json").write_text((ours / "config.json").read_text())
    assert (detect(str(ours)).kind, detect(str(ours)).source) == ("nystrom", str(ours))
    assert (detect(str(tmp_path / "run")).kind, detect(str(tmp_path / "run")).source) == (
        "nystrom",
        str(tmp_path / "run" / "model"),
    )
    assert (detect(str(bert)).kind, detect(str(bert)).model_type) == ("bert", "bert")
    assert (detect(str(roberta)).kind, detect(str(roberta)).model_type) == ("bert", "roberta")
    assert detect(str(hf)).kind == "hf" and detect("minilm").kind == "bert"
    assert detect("bert-small").kind == detect(str(tmp_path / "tiny.json")).kind == "config"
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    (gpt / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="model_type 'gpt2' is not one --init-from starts from"):
        detect(str(gpt))
    (gpt / "config.json").write_text('{"format": "nystrom"}')
    with pytest.raises(ValueError, match="nystrom convert legacy"):
        detect(str(gpt))
    with pytest.raises(ValueError, match="holds no config.json"):
        detect(str(tmp_path))


def test_each_start_point_loads_with_the_attention_spec(tmp_path):
    from nystrom_lab.text.models import load_start

    ours = _ours(tmp_path / "ours")
    for folder in (ours, _bert(tmp_path / "bert"), _bert(tmp_path / "roberta", transformers.RobertaModel,
                                                          transformers.RobertaConfig),
                   _bert(tmp_path / "hf", transformers.NystromformerModel, transformers.NystromformerConfig)):  # fmt: skip
        start = load_start(str(folder), attention="nystrom-4")
        assert start.model is not None and start.config.attention == {
            "name": "nystrom",
            "conv_kernel_size": 65,
            "num_landmarks": 4,
        }
    assert load_start(str(ours)).config.attention == {"name": "softmax"}  # no spec: the folder's own
    bert = load_start(str(tmp_path / "bert")).config.attention  # a BERT folder has none of ours: nystrom
    assert bert["name"] == "nystrom" and "num_landmarks" not in bert
    fresh = load_start("bert-small", attention="softmax")
    assert fresh.model is None and fresh.preset and fresh.config.attention == {"name": "softmax"}


def test_start_point_lists_match_the_library():
    from nystrom.convert.interop_bert import BERT_FAMILY
    from nystrom.model.configuration_nystromformer import MODEL_TYPE
    from nystrom.model.presets import PRESETS
    from nystrom_lab import start_point

    assert set(start_point.CONFIG_PRESETS) == set(PRESETS) and set(start_point.BERT_TYPES) == set(BERT_FAMILY)
    assert start_point.OURS == MODEL_TYPE


# ---------------------------------------------------------------- every command alike
def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(``"pretrain figure5"``, its parser) for every command that runs something."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))
    if parser.get_default("func") is not None:
        yield " ".join(prefix), parser


COMMANDS = dict(_commands(build_parser()))
#: commands that only read and write files (data generation, conversion, plots): no --device
NOT_COMPUTING = ("data", "convert", "plot-runs", "docs")


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def test_every_computing_command_takes_device_auto_cpu_cuda():
    computing = [c for c in COMMANDS if not c.startswith(NOT_COMPUTING)]
    assert {"demo", "bench", "approx", "lra", "pretrain", "pretrain figure5", "pretrain long-context", "finetune",
            "predict"} <= set(computing)  # fmt: skip
    for command in computing:
        device = _options(COMMANDS[command]).get("--device")
        assert device is not None and device.default == "auto", command
        assert device.type("cpu") == "cpu" and device.type("auto") == "auto", command
    with pytest.raises(UsageError, match="runs on the CPU only"):
        cpu_only(argparse.Namespace(device="cuda"), "bench core")


def test_one_name_per_concept_in_every_command():
    from nystrom_lab.start_point import init_from

    for command, parser in COMMANDS.items():
        options = _options(parser)
        assert not set(options) & set(RENAMED), (command, set(options) & set(RENAMED))
        for flag in ("--attention", "--variants"):
            if flag in options and options[flag].choices is None:  # long-context's variants are named runs
                assert options[flag].type is attention_spec.attention, (command, flag)
        if "--init-from" in options and command != "convert legacy":  # an old folder is no start point
            assert options["--init-from"].type is init_from, command
    for command in ("pretrain", "finetune", "convert to-nystrom", "convert to-hf", "convert long"):
        assert "--init-from" in _options(COMMANDS[command]), command
    for command in ("lra", "pretrain", "pretrain figure5", "finetune", "convert long"):
        assert "--max-length" in _options(COMMANDS[command]), command
    assert {"pretrain figure5", "plot-runs", "convert to-nystrom"} <= set(COMMANDS)
    assert not {"pretrain compare", "pretrain-compare", "convert from-bert", "convert from-hf"} & set(
        COMMANDS
    )


def test_no_default_output_is_under_docs():
    """A quick run from the repository root must not overwrite the committed docs: only `--out docs` does."""
    from nystrom_lab.bench.approx import driver as approx
    from nystrom_lab.bench.core import driver as attention
    from nystrom_lab.bench.models import driver as models_run
    from nystrom_lab.bench.table1 import driver as table1
    from nystrom_lab.bench.training import driver as training

    parser = build_parser()
    for argv in (["bench"], ["bench", "core"], ["bench", "training"], ["bench", "models"], ["approx"]):
        out = parser.parse_args(argv).out
        assert out.parts[0] == "runs" and "docs" not in out.parts, argv
    assert parser.parse_args(["bench", "--out", "docs"]).out == Path("docs")
    for command, sub in COMMANDS.items():
        out = sub.get_default("out")
        assert out is None or "docs" not in Path(out).parts, command
    for run in (approx.run, attention.run, models_run.run, table1.run, training.run):
        for name in ("out_dir", "markdown"):
            default = inspect.signature(run).parameters.get(name)
            if default is not None and default.default is not None:
                assert "docs" not in Path(default.default).parts, (run.__module__, name)
