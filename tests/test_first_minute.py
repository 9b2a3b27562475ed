"""The first minute: the command line answers (help, usage errors) without importing torch or transformers,
``import nystrom`` loads nothing heavy, and transformers' Auto classes still find our models whichever of
the two packages is imported first."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "numpy")


def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, returned parsed."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


CLI = """
import contextlib, io, json, sys
from nystrom.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = main({argv!r})
print(json.dumps({{"code": code, "err": err.getvalue(), "out": out.getvalue()[:200],
                  "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""


@pytest.mark.parametrize(
    "argv,code,text",
    [
        (["--help"], 0, ""),
        (["pretrain", "--help"], 0, ""),
        (["convert", "long", "--help"], 0, ""),
        (["bench", "--help"], 0, ""),
        (["lra", "listops", "--attention", "bogus"], 2, "bogus"),
        (["pretrain", "--attention", "nystrom-x", "--corpus", "c", "--out", "o"], 2, "nystrom-x"),
        (["pretrain", "--model", "bert-huge", "--corpus", "c", "--out", "o"], 2, "bert-huge"),
        (["pretrain"], 2, "--corpus and --out required"),  # raised by the command, after parsing
    ],
)
def test_help_and_usage_errors_load_no_heavy_package(argv, code, text):
    res = run_python(CLI.format(argv=argv, heavy=HEAVY[:2]))
    assert res["code"] == code and text in res["err"]
    assert res["loaded"] == [], f"`nystrom {' '.join(argv)}` imported {res['loaded']}"


def test_import_nystrom_is_light_and_registers_when_transformers_loads(tmp_path):
    code = f"""
import json, sys
import nystrom
light = [m for m in {HEAVY!r} if m in sys.modules]
from transformers import AutoConfig, AutoModelForMaskedLM, AutoModel
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING
cfg = AutoConfig.for_model("nystrom-nystromformer", vocab_size=20, hidden_size=8, num_attention_heads=2,
                           intermediate_size=8, num_hidden_layers=1)
before = repr(MODEL_FOR_MASKED_LM_MAPPING[type(cfg)])
stack_loaded = "nystrom.model.modeling_heads" in sys.modules
model = AutoModelForMaskedLM.from_config(cfg)
model.save_pretrained({str(tmp_path / "m")!r})
again = AutoModel.from_pretrained({str(tmp_path / "m")!r})
print(json.dumps({{"light": light, "before": before, "stack_loaded": stack_loaded, "model": type(model).__name__,
                  "again": type(again).__name__, "after": repr(MODEL_FOR_MASKED_LM_MAPPING[type(cfg)])}}))
"""
    res = run_python(code)
    assert res["light"] == []
    assert not res["stack_loaded"] and res["before"].startswith("<lazy ")  # a stand-in until first use
    assert res["model"] == "NystromformerForMaskedLM" and res["again"] == "NystromformerModel"
    assert res["after"] == "<class 'nystrom.model.modeling_heads.NystromformerForMaskedLM'>"


def test_registration_when_transformers_is_imported_first():
    code = """
import json
import transformers
from transformers import AutoConfig
import nystrom
cfg = AutoConfig.for_model("nystrom-nystromformer", vocab_size=20, hidden_size=8, num_attention_heads=2,
                           intermediate_size=8, num_hidden_layers=1)
from transformers import AutoModelForSequenceClassification
print(json.dumps({"cls": type(AutoModelForSequenceClassification.from_config(cfg)).__name__}))
"""
    assert run_python(code)["cls"] == "NystromformerForSequenceClassification"


def test_lazy_names_resolve_and_unknown_names_raise():
    import nystrom

    assert "NystromformerModel" in dir(nystrom) and "to_long" in nystrom.__all__
    assert nystrom.NystromAttention.__module__ == "nystrom.attention.nystrom"
    assert nystrom.functional.__name__ == "nystrom.functional"
    with pytest.raises(AttributeError, match="no attribute 'bogus'"):
        _ = nystrom.bogus
