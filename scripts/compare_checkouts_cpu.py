"""CPU A/B of two checkouts: whole-model inference and training step, and the attention module, timed in
alternating child processes so that both codes see the same machine state. Usage:
    python scripts/compare_checkouts_cpu.py OUT.json --code before=/path/to/old/src --code after=src [--rounds 2]
Records the machine, the versions and every timing; prints ratios against transformers' Nystromformer
measured in the same child (the machine's drift cancels out)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time
import torch, transformers
from transformers import NystromformerConfig as HFConfig, NystromformerModel as HFModel
from nystrom.model import NystromformerConfig, NystromformerModel
from nystrom.attention import NystromAttention
torch.manual_seed(0)
n, reps = 4096, 3
size = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
ours = NystromformerModel(NystromformerConfig(vocab_size=30522, max_position_embeddings=n, dropout=0.0,
                          attention={"name": "nystrom", "num_landmarks": 64, "conv_kernel_size": 65}, **size))
hf = HFModel(HFConfig(vocab_size=30522, max_position_embeddings=n + 2, segment_means_seq_len=n, num_landmarks=64,
                      conv_kernel_size=65, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **size))
ids = torch.randint(1000, 30000, (1, n)); mask = torch.ones(1, n, dtype=torch.long)
def best(fn):
    fn(); ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts)
def infer(m):
    m.eval()
    with torch.inference_mode():
        m(ids, attention_mask=mask)
def train(m):
    m.train(); m.zero_grad(set_to_none=True)
    m(ids, attention_mask=mask).last_hidden_state.float().pow(2).mean().backward()
attn = NystromAttention(512, heads=8, dim_head=64, num_landmarks=64)
x = torch.randn(1, 16384, 512)
def module():
    with torch.inference_mode():
        attn(x)
out = {"ours_infer_s": best(lambda: infer(ours)), "hf_infer_s": best(lambda: infer(hf)),
       "ours_train_s": best(lambda: train(ours)), "hf_train_s": best(lambda: train(hf)),
       "module_16k_s": best(module), "torch": torch.__version__, "transformers": transformers.__version__}
print(json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--code", action="append", required=True, help="NAME=SRC_FOLDER (repeat)")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    codes = [c.split("=", 1) for c in args.code]
    rows = []
    for r in range(args.rounds):
        for name, src in codes:
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            done = subprocess.run(
                [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
            )
            rec = {
                "round": r + 1,
                "code": name,
                "src": src,
                **json.loads(done.stdout.strip().splitlines()[-1]),
            }
            rows.append(rec)
            print(
                f"round {r + 1} {name:>7}: infer {rec['ours_infer_s']:.3f} s (HF {rec['hf_infer_s']:.3f}, "
                f"{rec['hf_infer_s'] / rec['ours_infer_s']:.2f}x), train {rec['ours_train_s']:.3f} s (HF "
                f"{rec['hf_train_s']:.3f}, {rec['hf_train_s'] / rec['ours_train_s']:.2f}x), module 16K "
                f"{rec['module_16k_s']:.3f} s",
                flush=True,
            )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from nystrom_lab.bench.measure import machine_info

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
