"""The cases of ``nystrom bench launches``: ours vs transformers' Nyströmformer, one attention module and
the whole MiniLM-size encoder, on the meta device (see :mod:`nystrom_lab.bench.launches.count`).

Legend: b batch, n tokens, e hidden size, h heads, d head dim, m landmarks.

Both sides get the same sizes, eval mode (no dropout ops on either side; gradients still flow) and, where
a mask is given, a padding mask of ones: the launches a padded batch costs, on the path a GPU takes
(a mask's values cannot be read there without a sync, so no code may take a shortcut for "all ones").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nystrom_lab.bench.launches.count import count_call

#: the MiniLM-size encoder of ``nystrom bench models`` with the paper's Nyström settings
MODEL = {"layers": 6, "hidden": 384, "heads": 12, "ffn": 1536, "vocab": 30522, "m": 64, "kernel": 65}
#: the attention module case: the paper's Table 1 sizes, h = 8, d = 64, m = 64
MODULE = {"heads": 8, "dim_head": 64, "m": 64, "kernel": 65}
N = 4096
CASES = ("module", "module-mask", "model-mask")
SIDES = ("ours", "hf")


def _hf_config(*, hidden: int, heads: int, layers: int, ffn: int, vocab: int, n: int, m: int, kernel: int):
    import transformers

    return transformers.NystromformerConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        max_position_embeddings=n + 2, num_landmarks=m, segment_means_seq_len=n, conv_kernel_size=kernel,
    )  # fmt: skip


def _module_call(side: str, *, n: int, masked: bool) -> Callable[[], torch.Tensor]:
    h, d, m, kernel = MODULE["heads"], MODULE["dim_head"], MODULE["m"], MODULE["kernel"]
    e = h * d
    x = torch.randn(1, n, e, requires_grad=True)  # (b, n, e)
    if side == "ours":
        from nystrom.attention import NystromAttention

        attn = NystromAttention(e, heads=h, dim_head=d, num_landmarks=m, conv_kernel_size=kernel).eval()
        mask = torch.ones(1, n, dtype=torch.bool) if masked else None  # (b, n)
        return lambda: attn(x, mask=mask)
    from nystrom_lab.bench.comparisons import hf_nystrom_self_attention

    attn = hf_nystrom_self_attention(e, heads=h, landmarks=m, n=n, conv_kernel=kernel).eval()
    bias = torch.zeros(1, 1, 1, n) if masked else None  # (b, 1, 1, n): HF's additive mask of "all real"
    return lambda: attn(x, attention_mask=bias)[0]


def ours_model(*, n: int):
    """Our MiniLM-size :class:`~nystrom.model.NystromformerModel` (eval mode, on the current default device)."""
    from nystrom.model import NystromformerConfig, NystromformerModel

    s = MODEL
    cfg = NystromformerConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], intermediate_size=s["ffn"], max_position_embeddings=n,
        dropout=0.0, hidden_act="gelu",
        attention={"name": "nystrom", "num_landmarks": s["m"], "conv_kernel_size": s["kernel"]},
    )  # fmt: skip
    return NystromformerModel(cfg).eval()


def _model_call(side: str, *, n: int) -> Callable[[], torch.Tensor]:
    s = MODEL
    ids = torch.zeros(1, n, dtype=torch.long)  # (b, n)
    mask = torch.ones(1, n, dtype=torch.long)  # (b, n): transformers' 0/1 attention_mask, no padding
    if side == "ours":
        model = ours_model(n=n)
    else:
        import transformers

        cfg = _hf_config(hidden=s["hidden"], heads=s["heads"], layers=s["layers"], ffn=s["ffn"],
                         vocab=s["vocab"], n=n, m=s["m"], kernel=s["kernel"])  # fmt: skip
        model = transformers.NystromformerModel(cfg).eval()
    return lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state


def build(case: str, side: str, *, n: int = N, device: str = "meta") -> Callable[[], torch.Tensor]:
    """One case's forward as a call on ``device`` (random weights, seeded)."""
    if case not in CASES or side not in SIDES:
        raise ValueError(f"case must be one of {CASES} and side one of {SIDES}, got {case!r}, {side!r}")
    torch.manual_seed(0)
    with torch.device(device):
        if case == "model-mask":
            return _model_call(side, n=n)
        return _module_call(side, n=n, masked=case == "module-mask")


def measure(case: str, side: str, *, n: int = N, device: str = "meta") -> dict:
    """Op counts of one case and side: forward and forward + backward (see ``count_call``)."""
    return count_call(build(case, side, n=n, device=device), backward=True)


def measure_all(*, n: int = N, device: str = "meta") -> dict:
    """Every case, both sides: {case: {side: counts}}."""
    return {case: {side: measure(case, side, n=n, device=device) for side in SIDES} for case in CASES}


def _commit() -> str:
    """The short commit hash of the code measured, ``+dirty`` with uncommitted changes to the library."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "src/nystrom"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run(*, n: int, out_dir) -> dict:
    """Measure every case, write ``launches.json`` and ``launches.md`` under ``out_dir``; returns the run."""
    import json
    from pathlib import Path

    from nystrom_lab.bench.launches.report import render
    from nystrom_lab.bench.measure import machine_info

    info = machine_info()
    report = {
        "n": n,
        "commit": _commit(),
        "machine": {k: info[k] for k in ("torch", "transformers", "python")},
        "cases": measure_all(n=n),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "launches.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / "launches.md").write_text(render(report), encoding="utf-8")
    return report
