"""Tokenisers of the Long Range Arena input pipelines (ListOps symbols, bytes, pixels).

Legend: N examples, n tokens (after truncation), L max_length.

* ListOps (lra_benchmarks/listops/input_pipeline.py): the Source string is split on whitespace and the
  parentheses of the pair tree are dropped, leaving the 15 symbols ``[MIN [MAX [MED [SM ] 0..9``; id 0 is
  padding. LRA builds its vocabulary from the data (ids in set order); we fix the order below so that ids
  are stable across runs. Sequences are truncated to ``max_length`` like LRA's ``inputs[:max_length]``.
* Bytes (LRA text and retrieval, ``tfds ByteTextEncoder``): id = byte + 1, so 0 stays free for padding and
  the vocabulary has 257 entries.
* Pixels (LRA image and Pathfinder): the grey level 0..255 is the token; sequences have a fixed length so
  no padding is ever needed.
"""

from __future__ import annotations

import numpy as np

PAD_ID = 0
LISTOPS_OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
LISTOPS_END = "]"
LISTOPS_DIGITS = tuple(str(i) for i in range(10))
LISTOPS_VOCAB: tuple[str, ...] = ("<pad>", *LISTOPS_OPERATORS, LISTOPS_END, *LISTOPS_DIGITS)
LISTOPS_TOKEN_TO_ID: dict[str, int] = {tok: i for i, tok in enumerate(LISTOPS_VOCAB)}
LISTOPS_VOCAB_SIZE = len(LISTOPS_VOCAB)  # 16: pad + 15 symbols
BYTE_VOCAB_SIZE = 257  # pad + 256 byte values
PIXEL_VOCAB_SIZE = 256
_PARENS = frozenset(("(", ")"))
# Fast path: each symbol becomes one character, so a whole line is one table lookup.
_OP_CHARS = tuple(zip(LISTOPS_OPERATORS, ("\x01", "\x02", "\x03", "\x04")))
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[ord(c) for c in " \t\n\r\x0b\x0c"]] = True
_PAREN = np.zeros(256, dtype=bool)
_PAREN[[ord("("), ord(")")]] = True
_LUT = np.full(256, 255, dtype=np.uint8)
for _tok, _ch in (*_OP_CHARS, *((t, t) for t in (LISTOPS_END, *LISTOPS_DIGITS))):
    _LUT[ord(_ch)] = LISTOPS_TOKEN_TO_ID[_tok]


def listops_symbols(source: str) -> list[str]:
    """The LRA token list of a ListOps Source string: whitespace split, parentheses dropped."""
    return [tok for tok in source.split() if tok not in _PARENS]


def encode_listops(source: str, *, max_length: int, where: str = "source") -> np.ndarray:
    """Encode one ListOps Source string to ids ``(n,)`` uint8 with ``n <= max_length``.

    ``where`` names the origin (e.g. ``"basic_train.tsv line 17"``) in the error for an unknown symbol
    (``""``: no prefix, for callers that wrap the error themselves).
    """
    if source.isascii() and not any(ch in source for _, ch in _OP_CHARS):
        compact = source
        for tok, ch in _OP_CHARS:
            compact = compact.replace(tok, ch)
        b = np.frombuffer(compact.encode("ascii"), dtype=np.uint8)  # (chars,)
        solid = ~_WHITESPACE[b]
        if not (solid[1:] & solid[:-1]).any():  # every symbol is one character between blanks
            fast = _LUT[b[solid & ~_PAREN[b]]]  # (n,)
            if not (fast == 255).any():
                return fast[:max_length]
    ids: list[int] = []  # slow path: also the one that names the offending symbol
    for tok in listops_symbols(source):
        tid = LISTOPS_TOKEN_TO_ID.get(tok)
        if tid is None or tid == PAD_ID:
            prefix = f"{where}: " if where else ""
            raise ValueError(
                f"{prefix}unknown ListOps symbol {tok[:20]!r}; expected one of {LISTOPS_VOCAB[1:]}"
            )
        ids.append(tid)
    return np.asarray(ids[:max_length], dtype=np.uint8)  # (n,)


def decode_listops(ids: np.ndarray) -> str:
    """Inverse of :func:`encode_listops` without the parentheses; pad ids are dropped. ``ids`` (n,)."""
    return " ".join(LISTOPS_VOCAB[int(i)] for i in ids if int(i) != PAD_ID)


def encode_bytes(data: bytes, *, max_length: int) -> np.ndarray:
    """LRA byte encoding: ``(n,)`` uint16 ids ``byte + 1`` of the first ``max_length`` bytes."""
    raw = np.frombuffer(data[:max_length], dtype=np.uint8)  # (n,)
    return raw.astype(np.uint16) + 1


def decode_bytes(ids: np.ndarray) -> bytes:
    """Inverse of :func:`encode_bytes`; pad ids are dropped. ``ids`` (n,)."""
    ids = np.asarray(ids)
    return (ids[ids != PAD_ID] - 1).astype(np.uint8).tobytes()


def pad_to(ids: np.ndarray, length: int) -> np.ndarray:
    """Right-pad ``ids`` (n,) with :data:`PAD_ID` to ``(length,)`` int64; raises if ``n > length``."""
    if ids.shape[0] > length:
        raise ValueError(f"sequence of {ids.shape[0]} tokens does not fit in length {length}")
    out = np.zeros(length, dtype=np.int64)  # (L,)
    out[: ids.shape[0]] = ids
    return out


def check_max_length(max_length: object) -> int:
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
        raise ValueError(f"max_length must be an int >= 1, got {max_length!r}")
    return max_length
