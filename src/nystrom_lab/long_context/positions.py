"""``nystrom pretrain long-positions``: long models as good as their 512-token source.

Legend: L source length (512), N long length (4096), m landmarks.

1. **Source.** MiniLM with a fresh MLM head, continued at L on the corpus until the head is trained
   (``source/``; the long-context experiment's ``window-512`` recipe with more steps). Every long variant
   starts from this MLM-trained source, so none spends its budget training a head.
2. **Step-0 screen** (minutes, no training): each position scheme (:data:`SCHEMES`) × attention
   (:data:`ATTENTIONS`) converted from the source and scored on the dev set at N, overall and per position
   bucket, against the source itself on L-token windows of the same tokens. ``block512`` (exact softmax
   inside 512-token blocks) with copied positions must reproduce the source: the control.
3. **Equal-budget training**: ``window-512-continued`` (the source, continued at L), ``copy-nystrom`` and
   the two best screened Nyström variants (at N), each on the same number of tokens, one after the other,
   each in its own resumable process. New parameters (the position table, a conv skip) train at
   :data:`NEW_LR_SCALE` × the body's rate. Continued runs use ``seed + 1`` for their batches and masks (no
   replay of the source's) and the source's dev masks (``--dev-seed``), so every number is on the same
   masked dev tokens.

Rows (``--packing``; :mod:`nystrom_lab.text.layout`): a long variant's name says its layout. ``SCHEME-ATTENTION``
trains on the stream (the documents concatenated with ``[SEP]`` and cut into N-token rows, a row's documents
seeing each other: every run before packing), ``SCHEME-ATTENTION-packed`` on packed documents (one Brown
document per 4096-token row, attending only to itself, positions restarting); a packed variant starts from
its stream twin's conversion and trains until it has seen the stream runs' *real* tokens
(:mod:`nystrom_lab.long_context.positions_budget`). The source and ``window-512-continued`` keep the stream.
``--packing`` (recorded in ``OUT/settings.json``; a record without it is ``stream``) picks the names of the
variants the experiment chooses itself after the screen; the screen scores on the stream.

Results: ``OUT/results.json`` (``step0``, ``variants``, ``within_document``, ``genre``), ``OUT/results.md``,
``OUT/curves.png``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nystrom_lab.long_context.run import LongRun

#: scheme name -> (to_long's positions, alpha)
SCHEMES: dict[str, tuple[str, float | None]] = {
    "copy": ("copy", None),
    "interpolate": ("interpolate", None),
    "hier0.1": ("hierarchical", 0.1),
    "hier0.4": ("hierarchical", 0.4),
}
_NYSTROM = "nystrom"  # NystromAttention's landmarks with the text commands' conv kernel (text_attention)
#: attention name -> spec text per layer group: one spec (every layer) or (spec, layers) pairs
ATTENTIONS: dict[str, str | tuple[tuple[str, int], ...]] = {
    "softmax": "softmax",
    "nystrom": _NYSTROM,
    "block512": "softmax,block_size=512",
    "local-nystrom": (("longformer-511", 3), (_NYSTROM, 3)),  # a ±255 window below: no aliased copy in view
    "softmax-logn": "softmax",  # log-length scaled logits: s = log(N)/log(L) / √d (LOG_SCALED)
    "nystrom-logn": _NYSTROM,
}
#: attentions whose logits are scaled by log(N)/log(L): as sharp over N keys as the source was over L
LOG_SCALED = ("softmax-logn", "nystrom-logn")
#: attentions whose variants count as long Nyström models (the ones trained after the screen)
NYSTROM_ATTENTIONS = ("nystrom", "local-nystrom", "nystrom-logn")
SOURCE, CONTINUED, BASELINE_LONG = "source", "window-512-continued", "copy-nystrom"
#: the suffix of a long variant trained on packed documents (``--packing documents``)
PACKED = "-packed"
#: every name ``--variants`` takes
TRAINABLE = (CONTINUED, *(f"{s}-{a}{p}" for s in SCHEMES for a in ATTENTIONS for p in ("", PACKED)))
#: learning-rate factor of the parameters a conversion adds or changes (positions, a zero-started conv skip)
NEW_LR_SCALE = 10.0
NEW_PARAMS = ("*position_embeddings*", "*attention.conv.*")


def variant_name(scheme: str, attention: str) -> str:
    return f"{scheme}-{attention}"


def split_variant(name: str) -> tuple[str, str]:
    """``"hier0.4-local-nystrom"`` (or ``"hier0.4-local-nystrom-packed"``) -> ``("hier0.4", "local-nystrom")``;
    raises for an unknown name."""
    base = unpacked(name)
    for scheme in SCHEMES:
        if base.startswith(scheme + "-") and base[len(scheme) + 1 :] in ATTENTIONS:
            return scheme, base[len(scheme) + 1 :]
    raise ValueError(
        f"unknown variant {name!r}: expected SCHEME-ATTENTION[{PACKED}] with {list(SCHEMES)} x {list(ATTENTIONS)}"
    )


def unpacked(name: str) -> str:
    """``name`` without :data:`PACKED`: its stream twin (the same start, the same recipe)."""
    return name[: -len(PACKED)] if name.endswith(PACKED) else name


def variant_layout(name: str) -> str:
    """The rows ``name`` trains on: ``documents`` for a ``*-packed`` long variant, else ``stream``."""
    return "documents" if name.endswith(PACKED) else "stream"


@dataclass(frozen=True)
class PositionsRun(LongRun):
    """Options of the experiment (:class:`~nystrom_lab.long_context.run.LongRun`'s, with the source's length
    and steps); every trained variant gets the same tokens, rate and schedule."""

    TAG: ClassVar[str] = "long-positions"

    out: Path = Path("experiments/long-context/positions")
    source_length: int = 512
    source_steps: int = 300
    train_variants: tuple[str, ...] = ()  # empty: copy-nystrom + the two best screened Nyström variants
    #: the layout of the variants chosen after the screen (a record without it: stream)
    packing: str = "documents"

    def __post_init__(self) -> None:
        if self.packing not in ("documents", "stream"):
            raise ValueError(
                f"--packing must be documents or stream for long-positions, got {self.packing!r}"
            )
        for name in self.train_variants:
            if name != CONTINUED:
                split_variant(name)
        for length in (self.source_length, self.long_length):
            if self.tokens_per_step % length:
                raise ValueError(f"tokens_per_step ({self.tokens_per_step}) must be a multiple of {length}")

    def length(self, variant: str) -> int:
        return self.source_length if variant in (SOURCE, CONTINUED) else self.long_length

    def model_dir(self, variant: str) -> Path:
        """The folder a variant starts from (the source's: MiniLM with a fresh head)."""
        if variant == CONTINUED:
            return self.out / SOURCE / "model"
        return self.out / "models" / ("source-start" if variant == SOURCE else unpacked(variant))

    def layout(self, variant: str) -> str:
        """``variant``'s rows, as its name says (:func:`variant_layout`), not ``packing``."""
        return variant_layout(variant)

    def variant_steps(self, variant: str) -> int:
        """The source's steps; a stream run's ``steps``; a packed run's: as many as its real tokens need."""
        if variant == SOURCE:
            return self.source_steps
        if self.layout(variant) == "stream":
            return self.steps
        from nystrom_lab.long_context.positions_budget import budget_steps

        return budget_steps(self, variant)

    def train_seed(self, variant: str) -> int:
        """The source draws from ``seed``, every continued run from ``seed + 1`` (no replay of the source's)."""
        return self.seed if variant == SOURCE else self.seed + 1

    def seed_args(self, variant: str) -> list[str]:
        """The source draws from ``seed``; a continued run from ``seed + 1`` with the source's dev masks, and
        a converted one trains its new parameters at :data:`NEW_LR_SCALE` × the rate."""
        if variant == SOURCE:
            return ["--seed", str(self.seed)]
        args = ["--seed", str(self.train_seed(variant)), "--dev-seed", str(self.seed)]
        if variant != CONTINUED:
            args += ["--lr-scale", *(f"{glob}={NEW_LR_SCALE:g}" for glob in self.new_params(variant))]
        return args

    def new_params(self, variant: str) -> tuple[str, ...]:
        """The globs of the parameters ``variant``'s conversion adds or changes (a conv only with Nyström)."""
        _, attention = split_variant(variant)
        return NEW_PARAMS if attention in NYSTROM_ATTENTIONS else NEW_PARAMS[:1]


def attention_spec(name: str, *, scale: float | None = None) -> dict[str, Any] | list[dict[str, Any]]:
    """The attention ``to_long`` gets for ``ATTENTIONS[name]``: one dict, or one per layer; ``scale`` (the
    logit scale of the :data:`LOG_SCALED` ones) is set when given."""
    from nystrom_lab.text.models import text_attention

    spec = ATTENTIONS[name]
    if isinstance(spec, str):
        return text_attention(spec) | ({} if scale is None else {"scale": scale})
    return [text_attention(text) for text, layers in spec for _ in range(layers)]


def build_long(run: PositionsRun, variant: str):
    """``variant`` converted from the trained source (its MLM head kept), in eval mode."""
    from nystrom.model import to_long

    scheme, attention = split_variant(variant)
    positions, alpha = SCHEMES[scheme]
    return to_long(
        run.out / SOURCE / "model", max_position_embeddings=run.long_length,
        attention=attention_spec(attention, scale=log_scale(run, attention)), positions=positions, alpha=alpha,
        seed=run.seed,
    )  # fmt: skip


def log_scale(run: PositionsRun, attention: str) -> float | None:
    """s = log(N)/log(L) / √d for the :data:`LOG_SCALED` attentions (d the source's head width), else None."""
    if attention not in LOG_SCALED:
        return None
    config = json.loads((run.out / SOURCE / "model" / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return math.log(run.long_length) / math.log(run.source_length) / math.sqrt(head_dim)


def prepare_source(run: PositionsRun) -> Path:
    """MiniLM with a fresh MLM head (drawn from ``run.seed``), as the long-context experiment's window-512."""
    from nystrom.model import minilm_path
    from nystrom_lab.long_context.experiment import minilm_mlm, save_start

    folder = run.model_dir(SOURCE)
    if (folder / "config.json").is_file():
        return folder
    return save_start(minilm_mlm(run.seed), folder, minilm_path() / "tokenizer.json")


def prepare_variant(run: PositionsRun, variant: str) -> Path:
    """``variant``'s starting folder (once): the trained source converted."""
    from nystrom_lab.long_context.experiment import save_start

    folder = run.model_dir(variant)
    if variant == CONTINUED or (folder / "config.json").is_file():
        return folder
    return save_start(build_long(run, variant), folder, run.out / SOURCE / "model" / "tokenizer.json")


def finished(run: PositionsRun, variant: str, *, weights: bool = False) -> bool:
    """``variant`` has finished training (``results.json``) and, with ``weights``, its trained model is on disk:
    results are committed, weights are not, so a fresh checkout has the first without the second."""
    folder = run.out / variant
    has_weights = (folder / "model" / "config.json").is_file()
    return (folder / "results.json").is_file() and (has_weights or not weights)


def train_variant(
    run: PositionsRun, variant: str, *, weights: bool = False, progress: bool = True, device: str = "auto"
) -> None:
    """Train (or resume) ``variant`` in a child process unless :func:`finished` (``weights``: its trained model
    is needed, so a finished run whose weights are missing is trained again from its start, with the same
    seeds). A long variant's start is converted from the trained source, which is (re)trained first if needed."""
    if finished(run, variant, weights=weights):
        return
    if variant == SOURCE:
        prepare_source(run)
    else:
        if not (run.model_dir(variant) / "config.json").is_file():
            train_variant(run, SOURCE, weights=True, progress=progress, device=device)
        prepare_variant(run, variant)
    run.train_in_child(variant, progress=progress, device=device)


def chosen_variants(run: PositionsRun, step0: dict[str, dict]) -> tuple[str, ...]:
    """What equal-budget training runs, in this order: the screened Nyström variant best at step 0 (overall
    dev MLM accuracy; ``copy-nystrom`` aside), ``window-512-continued``, the second best, ``copy-nystrom``
    (the comparison that decides the experiment first, today's recipe last), the long ones ``-packed`` under
    ``--packing documents``; ``run.train_variants`` (each name its own layout) if given."""
    if run.train_variants:
        return run.train_variants
    screened = [v for v in step0 if v in _screened() and v != BASELINE_LONG]
    best = sorted(
        (v for v in screened if split_variant(v)[1] in NYSTROM_ATTENTIONS), key=lambda v: -step0[v]["mlm_acc"]
    )
    suffix = PACKED if run.packing == "documents" else ""
    return (
        *(v + suffix for v in best[:1]),
        CONTINUED,
        *(v + suffix for v in best[1:2]),
        BASELINE_LONG + suffix,
    )


def _screened() -> tuple[str, ...]:
    return tuple(variant_name(s, a) for s in SCHEMES for a in ATTENTIONS)
