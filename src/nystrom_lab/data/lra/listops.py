"""ListOps generator faithful to the published LRA generator, with seeded parallel chunks.

Legend: N examples; "length" is the LRA length of a tree (operators + digits + closing brackets).

Rules, each from google-research/long-range-arena ``lra_benchmarks/data/listops.py`` (task ``basic``):

* Operators ``[MIN [MAX [MED [SM`` (FIRST/LAST exist there but are commented out of OPERATORS).
  MED is ``int(np.median(args))``: the mean of the middle two for an even count, truncated (arguments are
  non-negative, so it floors). SM is the sum mod 10.
* ``generate_tree(depth=1, max_depth=10, max_args=10)``: below ``max_depth`` draw ``r = random()``; at
  ``max_depth`` ``r = 1``. ``r > VALUE_P = 0.25`` gives a leaf digit ``random.choice(range(10))``, else an
  operator ``random.choice(OPERATORS)`` with ``random.randint(2, max_args)`` arguments, each a subtree one
  level deeper. The operator is drawn after its arguments there; the order of independent draws does not
  change the distribution, so we draw it first to emit the string in one pass.
* Length: a leaf counts 1, an operator node counts 2 (the operator and its ``]``) plus its arguments.
  A tree is kept iff ``min_length < length < max_length`` (500 < length < 2000), and kept trees are
  deduplicated (LRA adds them to a ``set``). Trees are abandoned as soon as they reach ``max_length``:
  they would be rejected anyway, so the accepted distribution is unchanged and the tail is not paid for.
* Source string: ``to_string`` of the left-nested pair tree ``((((op, a1), a2), ...), ])``, i.e.
  ``'( ' + left + ' ' + right + ' )'`` per pair, e.g. ``( ( ( [MAX 2 ) 9 ) ] )`` for ``[MAX 2 9]``.
* Files: ``{task}_train.tsv``, ``{task}_val.tsv``, ``{task}_test.tsv`` written by ``csv.writer`` with a tab
  delimiter: header ``Source\\tTarget`` and csv's default ``\\r\\n`` line ends. Default sizes 96000/2000/2000.
  LRA splits a Python ``set`` (arbitrary order); our examples are i.i.d. in generation order, so train,
  dev and test are consecutive runs of the deduplicated stream, disjoint by construction.

Determinism: the stream is cut into chunks of ``chunk_size`` accepted trees; chunk ``c`` uses its own
``random.Random`` seeded from ``SeedSequence([seed, c])`` and chunks are consumed in index order, so the
files depend on (seed, chunk_size, sizes, config) only, never on the number of workers.
"""

from __future__ import annotations

import csv
import hashlib
import multiprocessing
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from nystrom_lab.data.file_checks import DataFileError, utf8_lines

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25
SPLIT_FILES = {"train": "train", "dev": "val", "test": "test"}
_DIGITS = tuple(str(i) for i in range(10))


@dataclass(frozen=True)
class ListOpsConfig:
    """Generator settings; the defaults are the LRA flags of the ``basic`` task."""

    max_depth: int = 10
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2000

    def __post_init__(self) -> None:
        if self.max_depth < 1 or self.max_args < 2 or not 0 <= self.min_length < self.max_length:
            raise ValueError(f"invalid ListOpsConfig {self}: need max_depth>=1, max_args>=2, 0<=min<max")


class _TooLongError(Exception):
    pass


def apply_operator(op: str, args: list[int]) -> int:
    """Value of ``op`` on the digits ``args`` as LRA's ``to_value`` computes it."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        s = sorted(args)
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}; expected one of {OPERATORS}")


def _node(rand: Callable[[], float], depth: int, cfg: ListOpsConfig, out: list[str], count: list[int]) -> int:
    """Append one subtree's Source fragments to ``out``, add its length to ``count[0]``, return its value."""
    if depth < cfg.max_depth and rand() <= VALUE_P:
        k = 2 + int(rand() * (cfg.max_args - 1))  # randint(2, max_args)
        op = OPERATORS[int(rand() * len(OPERATORS))]
        count[0] += 2
        if count[0] >= cfg.max_length:
            raise _TooLongError
        out.append("( " * (k + 1) + op)
        values = []
        for j in range(k):
            out.append(" " if j == 0 else " ) ")
            values.append(_node(rand, depth + 1, cfg, out, count))
        out.append(" ) ] )")
        return apply_operator(op, values)
    count[0] += 1
    if count[0] >= cfg.max_length:
        raise _TooLongError
    digit = int(rand() * 10)
    out.append(_DIGITS[digit])
    return digit


def sample_tree(rng: random.Random, cfg: ListOpsConfig) -> tuple[str, int, int] | None:
    """One draw of ``generate_tree(1, ...)``: ``(source, value, length)``, or None once it hits max_length."""
    out: list[str] = []
    count = [0]
    try:
        value = _node(rng.random, 1, cfg, out, count)
    except _TooLongError:
        return None
    return "".join(out), value, count[0]


def chunk_rng(seed: int, chunk: int) -> random.Random:
    state = np.random.SeedSequence([seed, chunk]).generate_state(2, dtype=np.uint64)
    return random.Random(int(state[0]) << 64 | int(state[1]))


def generate_chunk(task: tuple[int, int, int, ListOpsConfig]) -> list[tuple[str, int]]:
    """``chunk_size`` accepted examples ``(source, label)`` of chunk ``chunk``; a picklable worker job."""
    seed, chunk, chunk_size, cfg = task
    rng = chunk_rng(seed, chunk)
    kept: list[tuple[str, int]] = []
    while len(kept) < chunk_size:
        tree = sample_tree(rng, cfg)
        if tree is not None and cfg.min_length < tree[2] < cfg.max_length:
            kept.append((tree[0], tree[1]))
    return kept


def iter_listops(
    total: int,
    *,
    seed: int,
    workers: int = 1,
    chunk_size: int = 500,
    config: ListOpsConfig | None = None,
) -> Iterator[tuple[str, int]]:
    """Yield ``total`` distinct examples ``(source, label)`` in a deterministic order (see module doc)."""
    cfg = config or ListOpsConfig()
    for name, v in (("total", total), ("workers", workers), ("chunk_size", chunk_size)):
        if not isinstance(v, int) or v < (0 if name == "total" else 1):
            raise ValueError(
                f"{name} must be a {'non-negative' if name == 'total' else 'positive'} int, got {v!r}"
            )
    seen: set[bytes] = set()
    next_chunk = 0
    pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None
    try:
        while len(seen) < total:
            n_chunks = -(-(total - len(seen)) // chunk_size)
            tasks = [(seed, c, chunk_size, cfg) for c in range(next_chunk, next_chunk + n_chunks)]
            next_chunk += n_chunks
            results = pool.imap(generate_chunk, tasks) if pool is not None else map(generate_chunk, tasks)
            for examples in results:
                for source, label in examples:
                    if len(seen) >= total:
                        break
                    key = hashlib.blake2b(source.encode("ascii"), digest_size=16).digest()
                    if key not in seen:  # LRA deduplicates through a set of trees
                        seen.add(key)
                        yield source, label
    finally:
        if pool is not None:
            pool.terminate()


def write_listops_tsv(path: str | os.PathLike[str], examples: list[tuple[str, int]]) -> None:
    """Write ``examples`` as LRA does: ``csv.writer`` with tab delimiter and a ``Source\\tTarget`` header."""
    with open(path, "w", encoding="ascii", newline="") as f:
        _tsv_writer(f).writerows(examples)


def _tsv_writer(f: TextIO) -> Any:
    writer = csv.writer(f, delimiter="\t")  # csv's default "\r\n" line end, as LRA's writer
    writer.writerow(["Source", "Target"])
    return writer


def generate_listops(
    out_dir: str | os.PathLike[str],
    *,
    train: int = 96_000,
    dev: int = 2_000,
    test: int = 2_000,
    seed: int = 0,
    workers: int = 1,
    chunk_size: int = 500,
    task: str = "basic",
    config: ListOpsConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Path]:
    """Generate the three splits into ``out_dir`` as ``{task}_{train,val,test}.tsv``; return split -> path.

    ``progress(k)`` is called after every ``k`` newly written examples (for a progress bar).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sizes = {"train": train, "dev": dev, "test": test}
    paths = {split: out / f"{task}_{SPLIT_FILES[split]}.tsv" for split in sizes}
    stream = iter_listops(
        sum(sizes.values()), seed=seed, workers=workers, chunk_size=chunk_size, config=config
    )
    for split, size in sizes.items():
        with open(paths[split], "w", encoding="ascii", newline="") as f:
            writer = _tsv_writer(f)
            for _ in range(size):  # streamed: the full train split is ~0.7 GB of text
                writer.writerow(next(stream))
                if progress is not None:
                    progress(1)
    return paths


def read_listops_tsv(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """Read an LRA ListOps TSV (``Source\\tTarget`` header; ``\\n`` or ``\\r\\n`` line ends), streamed.

    Raises ``FileNotFoundError`` for a missing file and :class:`~nystrom_lab.data.DataFileError` naming the file
    and the 1-based line for an empty file, a wrong header, a wrong field count, undecodable bytes or a
    Target that is not a digit 0..9.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"ListOps TSV not found: {p}")
    rows: list[tuple[str, int]] = []
    header_seen = False
    for lineno, line in utf8_lines(p):
        fields = line.split("\t")
        if lineno == 1:
            if fields != ["Source", "Target"]:
                raise DataFileError(p, f"expected the header 'Source\\tTarget', got {line[:60]!r}", line=1)
            header_seen = True
            continue
        if len(fields) != 2:
            raise DataFileError(p, f"expected 2 tab-separated fields, got {len(fields)}", line=lineno)
        target = fields[1].strip()
        if target not in _DIGITS:
            raise DataFileError(p, f"Target must be a digit 0..9, got {target[:20]!r}", line=lineno)
        rows.append((fields[0], int(target)))
    if not header_seen:
        raise DataFileError(p, "empty file, expected the header 'Source\\tTarget'", line=1)
    return rows
