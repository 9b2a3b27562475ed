"""A tiny text model set-up for the fine-tuning tests: a WordPiece trained on the fixture corpus and a
1-layer, 32-wide config, written to a folder."""

from __future__ import annotations

from pathlib import Path

from nystrom.model import NystromformerConfig
from nystrom_lab.data.text import train_wordpiece

FIX = Path(__file__).parents[2] / "fixtures" / "text"


def tiny_text_setup(root: Path, *, max_positions: int = 128) -> Path:
    """``root/tokenizer.json`` (300 ids) and ``root/tiny.json`` (bert-small shrunk); returns ``root``."""
    tok = train_wordpiece(sorted((FIX / "corpus").glob("*.txt")), root / "tokenizer.json", vocab_size=300)
    NystromformerConfig.preset(
        "bert-small", vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=max_positions, classifier_hidden=32,
    ).to_json_file(root / "tiny.json")  # fmt: skip
    return root
