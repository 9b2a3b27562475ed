"""Plain-text corpora for masked-LM pre-training: tokenizers and a memory-mapped token cache.

Legend: t tokens of the whole corpus, s segments (non-empty lines), D documents, v vocabulary.

Corpus formats (``doc_mode``): ``"blank"``: documents separated by blank lines (BERT's pre-training format,
one sentence per line); ``"file"``: one document per file. Every non-empty line is a *segment*; SOP pairs
split a document at segment boundaries (:mod:`nystrom_lab.data.text_pretrain`).

The corpus is tokenised once, streaming (a bounded batch of lines at a time, never the whole corpus in
memory), into a cache folder: ``tokens.bin`` (all segments' ids concatenated in corpus order, uint16 or
uint32), ``segments.npy`` (s + 1 token offsets), ``documents.npy`` (D + 1 segment offsets) and
``meta.json`` (what was tokenised, with which tokenizer). Later runs memory-map the cache, so corpora
larger than memory work and a resumed run reads exactly the same tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nystrom_lab.data.file_checks import DataFileError, decode_text_file, utf8_lines

DOC_MODES = ("blank", "file")
CACHE_VERSION = 1
_ENCODE_CHUNK = 4096  # lines tokenised per encode_batch call: bounds memory, keeps the Rust side busy

_SPECIAL_NAMES = {
    "cls": ("[CLS]", "<cls>", "<s>"),
    "sep": ("[SEP]", "<sep>", "</s>"),
    "mask": ("[MASK]", "<mask>"),
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
}


@dataclass(frozen=True)
class TextTokenizer:
    """A HF ``tokenizers`` tokenizer (padding and truncation switched off) and its special-token ids."""

    tokenizer: object  # tokenizers.Tokenizer
    path: Path
    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int
    unk_id: int

    @property
    def special_ids(self) -> tuple[int, ...]:
        return (self.cls_id, self.sep_id, self.mask_id, self.pad_id, self.unk_id)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text without special tokens (the callers add [CLS]/[SEP] themselves)."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def load_tokenizer(path: str | os.PathLike[str]) -> TextTokenizer:
    """Load a ``tokenizer.json`` (or a folder holding one); needs [CLS], [SEP], [MASK], [PAD], [UNK]
    (or their ``<s>``/``</s>``/``<mask>``/``<pad>``/``<unk>`` spellings)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path} (expected a HF tokenizers tokenizer.json)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a bare Exception for malformed files
        raise DataFileError(path, f"not a HF tokenizers tokenizer.json ({err})") from err
    # tokenizer.json files often ship fixed padding/truncation (MiniLM: 128); both would corrupt the corpus
    tok.no_padding()
    tok.no_truncation()
    ids: dict[str, int] = {}
    for role, names in _SPECIAL_NAMES.items():
        found = [tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None]
        if not found:
            raise DataFileError(path, f"the vocabulary has no {role} token (looked for {list(names)})")
        ids[role] = found[0]
    return TextTokenizer(
        tokenizer=tok,
        path=path,
        vocab_size=tok.get_vocab_size(),
        cls_id=ids["cls"],
        sep_id=ids["sep"],
        mask_id=ids["mask"],
        pad_id=ids["pad"],
        unk_id=ids["unk"],
    )


def train_wordpiece(
    files: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, vocab_size: int = 30522
) -> TextTokenizer:
    """Train a lower-cased BERT WordPiece tokenizer on ``files`` and save it as ``out`` (tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    missing = [str(f) for f in files if not Path(f).is_file()]
    if missing:
        raise FileNotFoundError(f"cannot train a tokenizer: corpus file(s) not found: {missing}")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    tok.train([str(f) for f in files], trainer)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{out}.tmp-{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, out)  # concurrent DDP ranks never read a half-written file
    return load_tokenizer(out)


def iter_documents(path: Path, *, doc_mode: str) -> Iterator[list[str]]:
    """The documents of one UTF-8 file as lists of stripped non-empty lines (segments), streamed.

    Raises :class:`~nystrom_lab.data.DataFileError` naming the file and line of an undecodable byte.
    """
    if doc_mode not in DOC_MODES:
        raise ValueError(f"doc_mode must be one of {DOC_MODES}, got {doc_mode!r}")
    doc: list[str] = []
    for _, text in utf8_lines(Path(path)):
        for line in text.split("\r"):  # as universal newlines: a lone \r also ends a line
            line = line.strip()
            if line:
                doc.append(line)
            elif doc_mode == "blank" and doc:
                yield doc
                doc = []
    if doc:
        yield doc


def _cache_key(files: Sequence[Path], tokenizer: TextTokenizer, doc_mode: str) -> dict:
    return {
        "version": CACHE_VERSION,
        "doc_mode": doc_mode,
        "files": [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
        "tokenizer_sha256": hashlib.sha256(tokenizer.path.read_bytes()).hexdigest(),
    }


def _read_cache_meta(path: Path) -> dict:
    """A token cache's ``meta.json``; a torn or foreign one is a :class:`DataFileError` (delete the cache)."""
    try:
        meta = json.loads(decode_text_file(path.read_bytes(), path))
    except json.JSONDecodeError as err:
        raise DataFileError(path, f"not JSON ({err.msg}); delete the cache folder", line=err.lineno) from None
    ok = (
        isinstance(meta, dict)
        and meta.get("dtype") in ("uint16", "uint32")
        and type(meta.get("num_tokens")) is int
        and meta["num_tokens"] >= 0
    )
    if not ok:
        raise DataFileError(path, "not a token-cache meta.json (dtype, num_tokens); delete the cache folder")
    return meta


class TokenizedCorpus:
    """A tokenised corpus cache, memory-mapped: ``tokens`` (t,), ``segments`` (s+1,), ``documents`` (D+1,)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{self.folder} is not a token cache (no meta.json)")
        self.meta = _read_cache_meta(meta_path)
        dtype = np.dtype(self.meta["dtype"])
        n_tokens = self.meta["num_tokens"]
        if (self.folder / "tokens.bin").stat().st_size != n_tokens * dtype.itemsize:
            raise DataFileError(
                self.folder / "tokens.bin", f"expected {n_tokens} {dtype} tokens; delete the cache"
            )
        self.tokens = (
            np.memmap(self.folder / "tokens.bin", dtype=dtype, mode="r", shape=(n_tokens,))
            if n_tokens
            else np.zeros(0, dtype=dtype)
        )  # (t,)
        self.segments = np.load(self.folder / "segments.npy", mmap_mode="r")  # (s+1,)
        self.documents = np.load(self.folder / "documents.npy", mmap_mode="r")  # (D+1,)

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1

    def document_segments(self, d: int) -> np.ndarray:
        """Token offsets of document ``d``'s segment boundaries: (k+1,) for k segments."""
        return np.asarray(self.segments[self.documents[d] : self.documents[d + 1] + 1])


def build_token_cache(
    files: Sequence[str | os.PathLike[str]],
    tokenizer: TextTokenizer,
    cache: str | os.PathLike[str],
    *,
    doc_mode: str = "blank",
) -> TokenizedCorpus:
    """Tokenise ``files`` into ``cache`` (reused when files, tokenizer and mode are unchanged).

    Written under a temporary name and renamed, so concurrent processes (DDP ranks) and killed runs
    never leave a torn cache; a cache built from other inputs is an error, not overwritten.
    """
    paths = [Path(f) for f in files]
    if not paths:
        raise ValueError("corpus: no files given")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"corpus file(s) not found: {missing}")
    key = _cache_key(paths, tokenizer, doc_mode)
    cache = Path(cache)
    if (cache / "meta.json").is_file():
        have = _read_cache_meta(cache / "meta.json")
        if have.get("key") != key:
            raise ValueError(
                f"{cache} holds a token cache of other files/tokenizer/doc_mode; delete it or use another folder"
            )
        return TokenizedCorpus(cache)
    tmp = cache.with_name(cache.name + f".tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    seg_ends, doc_ends = array("q", [0]), array("q", [0])
    n_tokens = 0
    with open(tmp / "tokens.bin", "wb") as out:
        lines: list[str] = []
        doc_sizes: list[int] = []  # lines of each pending document

        def flush() -> None:
            nonlocal n_tokens
            encoded = iter(tokenizer.encode(lines))
            for size in doc_sizes:
                for _ in range(size):
                    ids = next(encoded)
                    if ids:  # a line of only characters the normaliser drops holds no tokens
                        np.asarray(ids, dtype=dtype).tofile(out)
                        n_tokens += len(ids)
                        seg_ends.append(n_tokens)
                if len(seg_ends) - 1 > doc_ends[-1]:  # documents without tokens are dropped
                    doc_ends.append(len(seg_ends) - 1)
            lines.clear()
            doc_sizes.clear()

        for path in paths:
            for doc in iter_documents(path, doc_mode=doc_mode):
                lines.extend(doc)
                doc_sizes.append(len(doc))
                if len(lines) >= _ENCODE_CHUNK:
                    flush()
        flush()
    np.save(tmp / "segments.npy", np.frombuffer(seg_ends, dtype=np.int64))
    np.save(tmp / "documents.npy", np.frombuffer(doc_ends, dtype=np.int64))
    meta = {"key": key, "dtype": np.dtype(dtype).name, "num_tokens": n_tokens}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    try:
        os.replace(tmp, cache)
    except OSError:  # another process finished first: its cache is identical
        shutil.rmtree(tmp)
    return TokenizedCorpus(cache)
