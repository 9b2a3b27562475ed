"""``nystrom bench models``: whole long-document encoders side by side.

Legend: b batch, n tokens, e hidden size, v vocabulary.

Every model has the same encoder size (``minilm``: 6 layers, e = 384, 12 heads, FFN 1536, v = 30522;
``base``: 12 × 768) and random weights. Ours: :class:`NystromformerModel` with Nyström m = 64 (conv skip,
kernel 65, as in the paper), the same with ``recompute=True`` (q/k/v recomputed in the backward: leaner
training) and with exact softmax (SDPA). transformers': ``NystromformerModel`` (same
m, ``segment_means_seq_len`` = n), ``LongformerModel`` (window 512), ``BigBirdModel`` (block sparse, block
64, 3 random blocks) and ``BertModel`` (SDPA). Two modes: inference (``torch.inference_mode``, the bare
encoder) and one training step (MLM loss on 15 % of the positions, backward, AdamW step; each model's
MLM class as users would train it: ours computes the vocabulary logits at the masked positions only,
transformers' at every position).

Each (model, mode, n, b) runs in a fresh process (its peak memory is its own), in rounds that visit the
models in turn, so a drifting machine slows all alike; a case that fails (out of memory, a length rule)
is reported with its error, never dropped.
"""

from __future__ import annotations

import statistics
import time

from nystrom_lab.attention_spec import constructor_default

MODELS = (
    "ours-nystrom",
    "ours-nystrom-recompute",
    "ours-softmax",
    "hf-nystromformer",
    "hf-longformer",
    "hf-bigbird",
    "hf-bert",
)
SIZES = {
    "minilm": {"layers": 6, "hidden": 384, "heads": 12, "ffn": 1536, "vocab": 30522},
    "base": {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 30522},
    "tiny": {"layers": 1, "hidden": 32, "heads": 2, "ffn": 64, "vocab": 100},  # for the smoke test
}
MODES = ("inference", "train")
#: ours-nystrom with its launches replayed: its inference forward as one CUDA graph per length
#: (``nystrom.model.graphs.GraphedForward``), and ``torch.compile(mode="reduce-overhead")`` (inductor + CUDA
#: graphs; a training step compiles the encoder, the MLM head and AdamW stay eager). CUDA only.
GRAPHED = ("ours-nystrom-graphed", "ours-nystrom-compiled")
#: for the GPU run: ours with the fused Triton kernels off (on the CPU it is ours-nystrom itself), and
#: transformers' BERT with attn_implementation="nystrom"
COMPARED = ("ours-nystrom-pytorch", "hf-bert-nystrom")
ALL_MODELS = MODELS + GRAPHED + COMPARED


def refusal(model: str, mode: str, device: str) -> str | None:
    """Why a (model, mode) case cannot run on ``device`` at all (reported as skipped, never started), or None."""
    if model in GRAPHED and device != "cuda":
        return f"{model} replays CUDA graphs: needs a CUDA device, not {device}"
    if model == "ours-nystrom-graphed" and mode == "train":
        return "GraphedForward replays inference only (no training step)"
    return None


def build(model: str, *, size: dict, n: int, mode: str):
    """The model (random weights, eval mode for inference, train mode with dropout 0 for training)."""
    import torch
    import transformers

    common = dict(vocab_size=size["vocab"], hidden_size=size["hidden"], num_hidden_layers=size["layers"],
                  num_attention_heads=size["heads"], intermediate_size=size["ffn"], hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    train = mode == "train"
    landmarks = constructor_default("nystrom", "num_landmarks")  # ours and HF's Nyströmformer alike
    if model.startswith("ours"):
        from nystrom.model import NystromformerConfig, NystromformerForMaskedLM, NystromformerModel

        attention = {"name": "softmax"}
        # -recompute: q/k/v recomputed in the backward (leaner training); -pytorch: the fused kernels off
        if model.startswith("ours-nystrom"):
            attention = {"name": "nystrom", "num_landmarks": landmarks, "conv_kernel_size": 65,
                         "recompute": model.endswith("-recompute")}  # fmt: skip
        cfg = NystromformerConfig(
            vocab_size=size["vocab"], hidden_size=size["hidden"], num_hidden_layers=size["layers"],
            num_attention_heads=size["heads"], intermediate_size=size["ffn"], max_position_embeddings=n,
            dropout=0.0, attention=attention, hidden_act="gelu",
        )  # fmt: skip
        return (NystromformerForMaskedLM if train else NystromformerModel)(cfg)
    if model == "hf-nystromformer":
        cfg = transformers.NystromformerConfig(**common, max_position_embeddings=n + 2, num_landmarks=landmarks,
                                               segment_means_seq_len=n, conv_kernel_size=65)  # fmt: skip
        cls = transformers.NystromformerForMaskedLM if train else transformers.NystromformerModel
    elif model == "hf-longformer":
        cfg = transformers.LongformerConfig(**common, max_position_embeddings=n + 2, attention_window=512)
        cls = transformers.LongformerForMaskedLM if train else transformers.LongformerModel
    elif model == "hf-bigbird":
        cfg = transformers.BigBirdConfig(**common, max_position_embeddings=n, attention_type="block_sparse",
                                         block_size=64, num_random_blocks=3)  # fmt: skip
        cls = transformers.BigBirdForMaskedLM if train else transformers.BigBirdModel
    elif model in ("hf-bert", "hf-bert-nystrom"):
        import nystrom  # noqa: F401  (registers attn_implementation="nystrom")

        cfg = transformers.BertConfig(**common, max_position_embeddings=n)
        cfg._attn_implementation = "sdpa" if model == "hf-bert" else "nystrom"
        cls = transformers.BertForMaskedLM if train else transformers.BertModel
    else:
        raise ValueError(
            f"unknown model {model!r}; choose from {ALL_MODELS}"
        )  # the name first: errors are cut at 200
    return cls(cfg)


def make_call(model: str, net, *, n: int, batch: int, mode: str, vocab: int, device=None):
    """A no-argument function running one inference forward or one training step of ``net``
    (``ours-nystrom-pytorch``: with the fused Triton kernels off)."""
    call = _make_call(model, net, n=n, batch=batch, mode=mode, vocab=vocab, device=device)
    if model != "ours-nystrom-pytorch":
        return call
    from nystrom.ops.nystrom.fused import fused_kernels

    def on_the_pytorch_path():
        with fused_kernels(False):
            return call()

    return on_the_pytorch_path


def _make_call(model: str, net, *, n: int, batch: int, mode: str, vocab: int, device=None):
    import torch

    from nystrom_lab.text.mlm import masked_token_loss

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (batch, n), generator=g).to(device)  # (b, n)
    mask = torch.ones(batch, n, dtype=torch.long, device=device)
    if mode == "inference":
        net.eval()
        forward = net
        if model == "ours-nystrom-graphed":
            from nystrom.utils.graphs import GraphedForward

            forward = GraphedForward(
                net, lambda i, m: net(input_ids=i, attention_mask=m).last_hidden_state, buckets=(n,)
            )
            return _inference_mode(lambda: forward(ids, mask))
        if model == "ours-nystrom-compiled":
            forward = torch.compile(net, mode="reduce-overhead")
        return _inference_mode(lambda: _step_begin(model) or forward(input_ids=ids, attention_mask=mask)[0])
    net.train()
    if model == "ours-nystrom-compiled":
        encoder = torch.compile(net.nystromformer, mode="reduce-overhead")
    elif model.startswith("ours"):
        encoder = net.nystromformer
    labels = torch.where(torch.rand(batch, n, generator=g).to(device) < 0.15, ids, -100)  # (b, n)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-5)

    def step():
        _step_begin(model)
        if model.startswith("ours"):  # the MLM head on masked positions only (nystrom pretrain's objective)
            hidden = encoder(ids, mask).last_hidden_state  # (b, n, e)
            loss = masked_token_loss(net.lm_head, hidden, labels)[0]
        else:
            loss = net(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _inference_mode(fn):
    """``fn`` run under ``torch.inference_mode()``."""
    import torch

    def infer():
        with torch.inference_mode():
            return fn()

    return infer


def _step_begin(model: str) -> None:
    """A new iteration for reduce-overhead's CUDA graph trees (the last call's outputs may be overwritten)."""
    if model == "ours-nystrom-compiled":
        import torch

        torch.compiler.cudagraph_mark_step_begin()


def measure(case: dict) -> dict:
    """One case in this fresh process: ``{"s": [seconds per call], "peak_mb", "first_call_s"}`` or
    ``{"error"}``.

    ``device`` ``"cuda"`` runs on the GPU (peak = CUDA allocations above the weights and inputs, calls
    synchronised); ``dtype`` ``"bf16"``/``"fp16"`` runs under autocast (fp16 only on a GPU)."""
    import torch

    from nystrom_lab.bench.measure import call_times_s, peak_memory_mb

    if case.get("threads"):
        torch.set_num_threads(case["threads"])
    size = SIZES[case["size"]]
    device = torch.device(case.get("device", "cpu"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(case.get("dtype", "fp32"))
    try:
        net = build(case["model"], size=size, n=case["n"], mode=case["mode"]).to(device)
        call = make_call(case["model"], net, n=case["n"], batch=case["batch"], mode=case["mode"], vocab=size["vocab"],
                         device=device)  # fmt: skip
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            first = time.perf_counter()
            # the first call (warm-up) measures the memory (graphed: with the capture, compiled: the compile)
            peak = peak_memory_mb(call, device=device.type)
            first = time.perf_counter() - first
            # more warm-up before the timed calls: reduce-overhead records its graphs on the 2nd/3rd call
            sync = torch.cuda.synchronize if device.type == "cuda" else None
            warmup = 2 if case["model"] in GRAPHED else 0
            times = call_times_s(call, repeats=case["repeats"], warmup=warmup, sync=sync)
    except Exception as err:  # reported in the table (an OOM, a length rule), never dropped
        return {
            "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
        }
    return {"s": times, "peak_mb": peak, "first_call_s": first}


def summarise(samples: list[dict]) -> dict:
    """Median and spread (max/min over rounds) of one case's rounds."""
    errors = [s["error"] for s in samples if "error" in s]
    if errors:
        return {"error": errors[0]}
    skipped = [s["skipped"] for s in samples if "skipped" in s]
    if skipped:
        return {"skipped": skipped[0]}
    per_round = [statistics.median(s["s"]) for s in samples]
    return {"median_s": statistics.median(per_round), "spread": max(per_round) / min(per_round),
            "peak_mb": max(s["peak_mb"] for s in samples), "rounds": len(samples),
            "first_call_s": max(s.get("first_call_s", 0.0) for s in samples)}  # fmt: skip
