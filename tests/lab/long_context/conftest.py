"""Shared fixtures of the long-context tests: a tiny MLM-trained "source" in an experiment folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nystrom.model import NystromformerConfig, NystromformerForMaskedLM, save_tokenizer
from nystrom_lab.data.text import train_wordpiece
from nystrom_lab.long_context.positions import PositionsRun

FIX = Path(__file__).parents[2] / "fixtures" / "text" / "corpus"


@pytest.fixture
def tiny_source(tmp_path):
    """OUT/source/model: a 6-layer, 16-wide masked LM with 512 positions and a WordPiece; a 40-document corpus."""
    text = "\n\n".join(p.read_text() for p in sorted(FIX.glob("*.txt")))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join([text] * 20))
    tok = train_wordpiece([corpus], tmp_path / "tokenizer.json", vocab_size=200)
    config = NystromformerConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=6, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=512, attention="softmax", dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    out = tmp_path / "exp"
    folder = out / "source" / "model"
    NystromformerForMaskedLM(config).save_pretrained(folder)
    save_tokenizer(tmp_path / "tokenizer.json", folder, model_max_length=512)
    (out / "source" / "results.json").write_text("{}")
    return PositionsRun(corpus=(str(corpus),), out=out, long_length=1024, tokens_per_step=2048, dev_fraction=0.1,
                        precision="fp32")  # fmt: skip
