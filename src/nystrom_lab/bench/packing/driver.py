"""Packed vs padded pre-training rows on a corpus's real length mix, on this CPU: padding share and tokens/s.

Legend: L row length (``--max-length``), b rows per step, e width, f FFN width.

Run: ``python -m nystrom_lab.bench.packing --corpus data/brown/brown.txt`` (``nystrom data brown data/brown
--fetch`` first). For every L, the corpus's training documents (the ``nystrom pretrain`` split: 5 % held
out) become the same masked-LM examples, ``[CLS] piece [SEP]`` with a document longer than L cut into
pieces (:class:`~nystrom_lab.data.text_mlm_documents.DocumentMLMDataset`), laid out as

- ``padded``: one example per row, padded to L (``nystrom pretrain --packing off``);
- ``packed``: packed into rows (:mod:`nystrom_lab.data.packing`; ``--packing documents``, the default);
- ``stream`` (with ``--layouts``): the documents' concatenation cut into rows (``--packing stream``),
  with cross-talk: the layout the long-context experiment had before packing.

**Padding share**: padded tokens / all tokens over the whole epoch, exact (from the lengths). **Tokens/s**:
training steps (forward, backward, AdamW) of the pre-training path (``collate`` ->
:class:`~nystrom_lab.text.mlm.MaskedLMObjective`) on a fresh masked LM (MiniLM's shape by default: 6
layers, e = 384, 12 heads, f = 1536, Nyström attention with the text commands' conv kernel), b = tokens
per step / L rows per step for every layout. Interleaved rounds: each round runs one step of every layout
in a rotated order (each layout its own copy of the model and optimiser), so a slow spell of the machine
hits all alike; a step's rate is its real tokens (attention mask) over its seconds, collate included;
the table gives the median over rounds, and "vs padded" the median of the per-round ratios.
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from nystrom_lab.data.packed_batches import PackedRows, collate_packed
from nystrom_lab.data.packing import padding_share
from nystrom_lab.data.text_mlm import PackedMLMDataset, collate_mlm, position_buckets
from nystrom_lab.data.text_mlm_documents import DocumentMLMDataset

LAYOUTS = ("padded", "packed", "stream")


def layout_data(corpus, tok, layout: str, length: int, *, seed: int = 0):
    """The training rows of ``layout`` at L = ``length`` and their real tokens per row (R,)."""
    kw = dict(split="train", seq_len=length, seed=seed)
    if layout == "stream":
        data = PackedMLMDataset(corpus, tok, **kw)
        full = np.full(data.pieces, length, dtype=np.int64)
        full[-1] = len(data.stream) - (data.pieces - 1) * data.content + 2
        return data, full
    docs = DocumentMLMDataset(corpus, tok, **kw)
    if layout == "padded":
        return docs, docs.example_lengths
    rows = PackedRows(docs, docs.example_lengths, max_length=length, seed=seed)
    return rows, rows.row_lengths


def build_model(tok, *, length: int, attention: str, hidden: int, layers: int, heads: int, ffn: int):
    """A fresh masked LM of the given shape, with the text commands' reading of ``attention``."""
    from nystrom.model import NystromformerConfig, NystromformerForMaskedLM
    from nystrom_lab.text.models import text_attention

    cfg = NystromformerConfig.preset(
        "bert-small", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
        max_position_embeddings=length, attention=text_attention(attention, max_length=length), dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return NystromformerForMaskedLM(cfg)


def _stepper(objective, data, pad_id: int, length: int, rows: int, seed: int):
    """A function running the next training step of ``data``'s rows: returns (real tokens, seconds)."""
    from nystrom_lab.training.loop import global_batch

    opt = torch.optim.AdamW(objective.parameters(), lr=1e-4)
    state = {"step": 0}

    def step() -> tuple[int, float]:
        t0 = time.perf_counter()
        items = [data[i] for i in global_batch(len(data), state["step"], rows, seed)]
        if "document_lengths" in items[0]:
            batch = collate_packed(items, pad_id=pad_id, pad_to=length)
        else:
            batch = collate_mlm(items, pad_id=pad_id, pad_to=length)
        loss = objective(**batch)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        return int(batch["attention_mask"].sum()), time.perf_counter() - t0

    return step


def measure_length(
    corpus, tok, length: int, *, layouts: tuple[str, ...], tokens_per_step: int, rounds: int, warmup: int,
    model_kw: dict, seed: int = 0, progress: bool = True,
) -> list[dict]:  # fmt: skip
    """One L: every layout's padding share, then interleaved timed steps. Rows of the report."""
    from nystrom_lab.text.layout import packing_blocker
    from nystrom_lab.text.mlm import MaskedLMObjective

    rows_per_step = max(1, tokens_per_step // length)
    model = build_model(tok, length=length, **model_kw)
    blocker = packing_blocker(model)
    edges = position_buckets(length)
    out, steps = [], {}
    for layout in layouts:
        data, row_lengths = layout_data(corpus, tok, layout, length, seed=seed)
        rec = {"max_length": length, "layout": layout, "rows": len(row_lengths), "tokens": int(row_lengths.sum()),
               "padding_share": padding_share(row_lengths, length), "rows_per_step": rows_per_step}  # fmt: skip
        if layout == "packed" and blocker is not None:
            rec["error"] = blocker
        else:
            objective = MaskedLMObjective(copy.deepcopy(model), edges=edges).train()
            steps[layout] = _stepper(objective, data, tok.pad_id, length, rows_per_step, seed)
        out.append(rec)
    times: dict[str, list[tuple[int, float]]] = {k: [] for k in steps}
    names = list(steps)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=(warmup + rounds) * len(names), desc=f"L={length}", unit="step", dynamic_ncols=True)
    for r in range(warmup + rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            res = steps[name]()
            if r >= warmup:
                times[name].append(res)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    rate = {k: [tok_ / s for tok_, s in v] for k, v in times.items()}
    for rec in out:
        name = rec["layout"]
        if name not in times:
            continue
        rec["step_ms"] = 1e3 * statistics.median(s for _, s in times[name])
        rec["step_tokens"] = statistics.median(t for t, _ in times[name])
        rec["tokens_per_s"] = statistics.median(rate[name])
        if "padded" in rate and name != "padded":
            rec["speedup"] = statistics.median(a / p for a, p in zip(rate[name], rate["padded"]))
    return out


def run(
    corpus_files: list[Path], *, lengths: tuple[int, ...], layouts: tuple[str, ...] = ("padded", "packed"),
    tokenizer: Path | None = None, cache: Path, tokens_per_step: int = 8192, rounds: int = 5, warmup: int = 1,
    model_kw: dict, seed: int = 0, command: str = "", progress: bool = True,
) -> dict:  # fmt: skip
    """Every L of ``lengths``: :func:`measure_length`; the results with machine, versions and settings."""
    from nystrom.model import minilm_path
    from nystrom_lab.bench.measure import machine_info
    from nystrom_lab.data.text import build_token_cache, load_tokenizer

    tok = load_tokenizer(tokenizer or minilm_path() / "tokenizer.json")
    corpus = build_token_cache(list(corpus_files), tok, Path(cache), doc_mode="blank")
    rows: list[dict] = []
    for length in lengths:
        rows += measure_length(corpus, tok, length, layouts=layouts, tokens_per_step=tokens_per_step, rounds=rounds,
                               warmup=warmup, model_kw=model_kw, seed=seed, progress=progress)  # fmt: skip
    mk = model_kw
    model = f"{mk['layers']} layers, e={mk['hidden']}, {mk['heads']} heads, f={mk['ffn']}, {mk['attention']} attention"
    settings = {"corpus": ", ".join(str(f) for f in corpus_files), "corpus_documents": corpus.num_documents,
                "tokenizer": str(tok.path.name), "lengths": list(lengths), "layouts": list(layouts),
                "tokens_per_step": tokens_per_step, "rounds": rounds, "warmup": warmup, "seed": seed, "model": model}  # fmt: skip
    return {"command": command, "machine": machine_info(), "settings": settings, "rows": rows}
