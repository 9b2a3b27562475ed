"""Tokenizers in the folders we write, so ``AutoTokenizer.from_pretrained(folder)`` and ``pipeline(...,
model=folder)`` work on them.

A HF ``tokenizers`` ``tokenizer.json`` becomes a transformers fast tokenizer (``tokenizer.json`` +
``tokenizer_config.json`` naming its [CLS]/[SEP]/[MASK]/[PAD]/[UNK] tokens). A tokenizer without a
post-processor (one trained by ``nystrom pretrain --train-tokenizer``) gets BERT's template,
``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]`` with token types 0/1, which is how our data pipeline builds
its inputs.
"""

from __future__ import annotations

from pathlib import Path

#: accepted spellings of each special token, in order of preference
SPECIAL_TOKEN_NAMES: dict[str, tuple[str, ...]] = {
    "cls": ("[CLS]", "<cls>", "<s>"),
    "sep": ("[SEP]", "<sep>", "</s>"),
    "mask": ("[MASK]", "<mask>"),
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
}


def special_tokens(tok, *, source: str) -> dict[str, str]:
    """role -> token string for a ``tokenizers.Tokenizer``; ValueError naming ``source`` if one is absent."""
    found = {}
    for role, names in SPECIAL_TOKEN_NAMES.items():
        present = [n for n in names if tok.token_to_id(n) is not None]
        if not present:
            raise ValueError(f"{source}: the vocabulary has no {role} token (looked for {list(names)})")
        found[role] = present[0]
    return found


def save_tokenizer(tokenizer_file: str | Path, folder: str | Path, *, model_max_length: int) -> None:
    """Write ``tokenizer_file`` (a ``tokenizer.json``) into ``folder`` as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.no_padding()  # transformers pads per call; a fixed padding in the file would override it
    tok.no_truncation()
    roles = special_tokens(tok, source=str(tokenizer_file))
    if tok.post_processor is None:
        cls, sep = roles["cls"], roles["sep"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=model_max_length,
        **{f"{role}_token": token for role, token in roles.items()},
    )
    fast.save_pretrained(str(folder))
