"""``nystrom pretrain long-context``: the long-context experiment, from real pretrained weights.

Legend: N long length (4096), W window length (512), m landmarks.

MiniLM (the bundled all-MiniLM-L6-v2, a 6-layer BERT with e = 384) is continued on masked-LM over the
Brown corpus as three variants, each with the same fresh MLM head (decoder tied to the word embeddings),
tokens per step, steps, learning rate, masks and seed:

- ``window-512``: MiniLM as it is (softmax, 512 positions), trained on 512-token pieces; scored on the
  held-out documents cut into consecutive 512-token windows (what a 512-token user gets today);
- ``nystrom-4096``: converted to 4096 positions (rows copied), Nyström m = 64 with a zero-initialised
  conv skip, trained on 4096-token pieces;
- ``softmax-4096``: converted to 4096 positions, exact softmax (SDPA): the quality ceiling.

Every variant is scored on the same dev tokens with the same masks, overall and per position bucket of
the 4096-token layout ([0, 512), [512, 1024), [1024, 2048), [2048, 4096)).

Rows (``--packing``, the same for every variant; :mod:`nystrom_lab.text.layout`): ``documents`` (the
default) packs whole documents, each attending only to itself, a document longer than a row cut into
pieces of their own; ``stream`` reproduces the layout before packing (the documents' concatenation cut
into rows: no padding, but a row's documents see each other); ``off`` pads one document piece per row.
On Brown every document is 2,261-3,299 tokens, so at 4096 ``documents`` holds one document per row
(37 % padding) where ``stream`` fills the rows; at 512 it pads 0.7 %. Each variant trains in its own
process (``nystrom pretrain --init-from``: resumable, peak memory its own), one after the other; finished
variants are skipped when the command is run again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from nystrom_lab.long_context.run import LongRun
from nystrom_lab.text.layout import check_layout

#: variant -> (attention spec of the converted model, training length); Nyström: NystromAttention's default
#: landmarks with the text commands' conv kernel (nystrom_lab.text.presets), as `nystrom convert long` gives
VARIANTS: dict[str, tuple[str | None, int]] = {
    "softmax-4096": ("softmax", 4096),
    "nystrom-4096": ("nystrom", 4096),
    "window-512": (None, 512),  # MiniLM's own softmax attention and 512 positions
}
ORDER = ("softmax-4096", "nystrom-4096", "window-512")  # the slowest first


@dataclass(frozen=True)
class LongContextRun(LongRun):
    """Options of the experiment (:class:`~nystrom_lab.long_context.run.LongRun`'s) and its variants."""

    variants: tuple[str, ...] = ORDER
    packing: str = "documents"  # LongRun's field, another default: this experiment packs documents

    def __post_init__(self) -> None:
        check_layout(self.packing, "mlm")
        unknown = sorted(set(self.variants) - set(VARIANTS))
        if unknown:
            raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
        for name in self.variants:
            length = self.length(name)
            if self.tokens_per_step % length:
                raise ValueError(
                    f"tokens_per_step ({self.tokens_per_step}) must be a multiple of {name}'s {length}"
                )

    def length(self, variant: str) -> int:
        return self.long_length if VARIANTS[variant][1] != 512 else 512


def experiment_packing(requested: str | None, out: Path) -> str:
    """The experiment's layout: ``requested`` (``--packing``), else the one ``out/settings.json`` records (a
    record without it: ``stream``, the layout before packing), else ``documents``. A layout other than the
    recorded one is refused: the variants trained so far would not compare."""
    path = Path(out) / "settings.json"
    recorded = json.loads(path.read_text()).get("packing", "stream") if path.is_file() else None
    if requested is not None and recorded is not None and requested != recorded:
        raise ValueError(
            f"{out} holds a --packing {recorded} experiment; give --packing {recorded} (or none) to continue it,"
            f" or another --out for --packing {requested}"
        )
    return requested or recorded or "documents"


def minilm_mlm(seed: int):
    """MiniLM as it is (softmax, 512 positions) with an MLM head drawn from ``seed`` alone."""
    from nystrom.convert.long import fresh_mlm_head
    from nystrom.convert.transfer import transfer
    from nystrom.model import NystromformerForMaskedLM, from_bert, minilm_path

    bert = from_bert(minilm_path(), attention="softmax")
    model = transfer(bert, NystromformerForMaskedLM, bert.config)
    fresh_mlm_head(model, seed=seed)
    return model


def save_start(model, folder: Path, tokenizer: Path) -> Path:
    """Write a starting folder atomically: the model, and the tokenizer with its ``model_max_length``."""
    from nystrom.model import save_tokenizer

    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    model.save_pretrained(tmp)
    save_tokenizer(tokenizer, tmp, model_max_length=model.config.max_position_embeddings)
    os.replace(tmp, folder)
    return folder


def prepare_model(run: LongContextRun, variant: str) -> Path:
    """Write ``variant``'s starting folder (once): MiniLM converted, or as it is for the window variant,
    with the MLM head drawn from ``run.seed`` alone so that every variant starts with the same head."""
    folder = run.model_dir(variant)
    if (folder / "config.json").is_file():
        return folder
    from nystrom.model import minilm_path, to_long
    from nystrom_lab.text.models import text_attention

    spec, _ = VARIANTS[variant]
    source = minilm_path()
    if spec is None:
        model = minilm_mlm(run.seed)
    else:
        attention = text_attention(spec)
        model = to_long(source, max_position_embeddings=run.long_length, attention=attention, seed=run.seed)
    return save_start(model, folder, source / "tokenizer.json")


def train_variant(run: LongContextRun, variant: str, *, progress: bool = True, device: str = "auto") -> None:
    """Train (or resume) one variant in a child process on ``device``; a finished one (results.json) is
    skipped."""
    if (run.out / variant / "results.json").is_file():
        return
    prepare_model(run, variant)
    run.train_in_child(variant, progress=progress, device=device)
