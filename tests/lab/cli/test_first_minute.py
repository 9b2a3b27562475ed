"""The first minute: the command line answers (help, usage errors) without importing torch, transformers or
the library; ``import nystrom`` is plain (no import hooks, no lab module) and registers our models with
transformers' Auto classes and ``attn_implementation="nystrom"``, whichever of the two is imported first."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "nystrom")  # the library imports torch and transformers


def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, returned parsed."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


CLI = """
import contextlib, io, json, sys, time
t0 = time.perf_counter()
from nystrom_lab.cli import main
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
        (["pretrain", "--init-from", "bert-huge", "--corpus", "c", "--out", "o"], 2, "bert-huge"),
        (["finetune", "sst2", "--attention", "nystrom-8,pinv=svd"], 2, "pinv must be one of"),
        (["pretrain", "figure5", "--help"], 0, ""),
        (["pretrain"], 2, "--corpus and --out required"),  # raised by the command, after parsing
    ],
)
def test_help_and_usage_errors_load_no_heavy_package(argv, code, text):
    res = run_python(CLI.format(argv=argv, heavy=HEAVY))
    assert res["code"] == code and text in res["err"]
    assert res["loaded"] == [], f"`nystrom {' '.join(argv)}` imported {res['loaded']}"


def test_import_nystrom_is_plain_and_registers_with_transformers(tmp_path):
    code = f"""
import json, sys
hooks = list(sys.meta_path)
import nystrom
new_hooks = [repr(h) for h in sys.meta_path if h not in hooks and type(h).__module__.startswith("nystrom")]
lab = sorted(m for m in sys.modules if m.split(".")[0] == "nystrom_lab")
from transformers import AutoConfig, AutoModelForMaskedLM, AutoModel, AttentionInterface
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING
cfg = AutoConfig.for_model("nystrom-nystromformer", vocab_size=20, hidden_size=8, num_attention_heads=2,
                           intermediate_size=8, num_hidden_layers=1)
model = AutoModelForMaskedLM.from_config(cfg)
model.save_pretrained({str(tmp_path / "m")!r})
again = AutoModel.from_pretrained({str(tmp_path / "m")!r})
print(json.dumps({{"new_hooks": new_hooks, "lab": lab, "model": type(model).__name__,
                  "again": type(again).__name__, "mapped": repr(MODEL_FOR_MASKED_LM_MAPPING[type(cfg)]),
                  "attn": "nystrom" in AttentionInterface._global_mapping}}))
"""
    res = run_python(code)
    assert res["new_hooks"] == [] and res["lab"] == []  # (transformers installs a finder of its own)
    assert res["model"] == "NystromformerForMaskedLM" and res["again"] == "NystromformerModel"
    assert res["mapped"] == "<class 'nystrom.model.modeling_heads.NystromformerForMaskedLM'>"
    assert res["attn"] is True


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


def test_public_names_and_import_paths():
    import nystrom
    import nystrom.attention
    import nystrom.compat.lucidrains
    import nystrom.functional
    import nystrom.model

    assert set(nystrom.__all__) <= set(dir(nystrom)) and "to_long" in nystrom.__all__
    assert nystrom.NystromAttention is nystrom.attention.NystromAttention
    assert nystrom.nystrom_attention is nystrom.functional.nystrom_attention
    assert nystrom.NystromformerModel is nystrom.model.NystromformerModel
    assert nystrom.compat.lucidrains.NystromAttention.__module__ == "nystrom.compat.lucidrains"
    with pytest.raises(AttributeError, match="bogus"):
        _ = nystrom.bogus
