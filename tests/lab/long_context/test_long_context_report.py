"""The long-context report's probe (plain and recompute=True) on a tiny saved model, and its table."""

from __future__ import annotations

import pytest
import torch

from nystrom.model import NystromformerConfig, NystromformerForMaskedLM
from nystrom_lab.long_context.experiment import LongContextRun
from nystrom_lab.long_context.probe import probe, probe_in_child
from nystrom_lab.long_context.report import table


def test_probe_runs_both_ways_and_table_lists_the_lean_row(tmp_path):
    run = LongContextRun(corpus=("unused",), out=tmp_path, variants=("nystrom-4096",), long_length=64,
                         tokens_per_step=128, precision="fp32")  # fmt: skip
    torch.manual_seed(0)
    cfg = NystromformerConfig(vocab_size=1200, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=64,
                              attention={"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 3})  # fmt: skip
    NystromformerForMaskedLM(cfg).save_pretrained(run.model_dir("nystrom-4096"))
    plain = probe(run, "nystrom-4096", steps=2)
    lean = probe(run, "nystrom-4096", steps=2, recompute=True)
    assert (plain["batch_size"], plain["length"], plain["recompute"], lean["recompute"]) == (2, 64, False, True)
    assert len(lean["step_s"]) == 2 and lean["peak_mem_mb"] > 0
    v = {"steps": 2, "target_steps": 2, "initial_mlm_acc": 0.0, "final_mlm_acc": 0.1, "mlm_acc_by_bucket": {"0-64": 0.1},
         "final_mlm_loss": 5.0, "median_step_s": 1.0, "probe": plain, "probe_recompute": lean}  # fmt: skip
    md = table({"variants": {"nystrom-4096": v}})
    head, _, row, lean_row = md.strip().splitlines()
    assert row.startswith("| nystrom-4096 | 2/2 |") and lean_row.startswith("| nystrom-4096, recompute=True |")
    assert head.count("|") == row.count("|") == lean_row.count("|")
    assert lean_row.endswith(f"| {lean['median_step_s']:.1f} | {lean['peak_mem_mb']:.0f} |")


def test_probe_takes_a_per_layer_attention_list_and_a_failing_child_shows_its_error(tmp_path):
    # regression: the probe merged recompute into config.attention as one dict, and a per-layer list (the
    # #37 local-nystrom variants) raised TypeError inside a child whose stderr was swallowed
    run = LongContextRun(corpus=("unused",), out=tmp_path, variants=("nystrom-4096",), long_length=64,
                         tokens_per_step=128, precision="fp32")  # fmt: skip
    nystrom = {"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 3}
    layers = [{"name": "longformer", "window_size": 15}, nystrom]
    cfg = NystromformerConfig(vocab_size=1200, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=64, attention=layers)  # fmt: skip
    NystromformerForMaskedLM(cfg).save_pretrained(run.model_dir("nystrom-4096"))
    lean = probe(run, "nystrom-4096", steps=1, recompute=True, device="cpu")
    assert (lean["batch_size"], lean["length"], lean["recompute"]) == (2, 64, True)
    assert (lean["device"], lean["memory"]) == ("cpu", "resident set")
    with pytest.raises(RuntimeError, match=r"(?s)the probe of window-512 failed:.*Traceback"):
        probe_in_child(run, "window-512")  # no model saved there
