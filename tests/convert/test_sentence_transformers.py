"""Long-document embeddings in sentence-transformers (``nystrom convert long --sentence-transformers``,
:func:`nystrom.convert.sentence_transformers.write_sentence_transformers`).

The source is a tiny BERT (2 layers, 32 wide, 512 positions) with a WordPiece tokenizer, made a
sentence-transformers folder by hand the way all-MiniLM-L6-v2's is (modules.json with the 2.x type names,
mean pooling, Normalize, max_seq_length 128), converted to 1024 positions."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch
import transformers

from nystrom.convert.sentence_transformers import MODULE_TYPES, write_sentence_transformers
from nystrom.model import CheckpointError, NystromformerModel, save_tokenizer, to_long
from nystrom_lab.cli import run_command

st = pytest.importorskip("sentence_transformers")
transformers.logging.set_verbosity_error()
SMALL = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=512)  # fmt: skip
LONG = 1024
TOL = 1e-5  # fp32, the same operations: sentence-transformers' mean pooling against ours
WORDS = "the cat sat on a mat while dogs ran in parks and birds sang over green hills".split()


def text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny BERT folder with tokenizer.json, laid out as a sentence-transformers model."""
    from nystrom_lab.data.text import train_wordpiece

    folder = tmp_path_factory.mktemp("st") / "tiny-bert"
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**SMALL)).eval().save_pretrained(folder)
    corpus = folder.parent / "corpus.txt"
    corpus.write_text("\n\n".join(text(40, s) for s in range(20)) + "\n")
    train_wordpiece([corpus], folder / "tokenizer.json", vocab_size=60)
    save_tokenizer(folder / "tokenizer.json", folder, model_max_length=512)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))  # fmt: skip
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
         "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))  # fmt: skip
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 128, "do_lower_case": False})
    )
    return folder


@pytest.fixture(scope="module")
def long_folder(source):
    out = source.parent / "long-st"
    assert run_command(["convert", "long", "--init-from", str(source), "--max-length", str(LONG), "--out",
                        str(out), "--sentence-transformers"]) == 0  # fmt: skip
    return out


def direct(folder, docs: list[str], *, max_length: int | None = None) -> torch.Tensor:
    """Our model's mean-pooled last hidden state (over real tokens, [CLS]/[SEP] included), L2-normalised,
    one document at a time (no padding); ``max_length`` cuts as the tokenizer does."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    assert type(model) is NystromformerModel
    out = []
    for doc in docs:
        enc = tok(doc, return_tensors="pt", truncation=max_length is not None, max_length=max_length)
        with torch.no_grad():
            h = model(**enc).last_hidden_state[0]  # (n, e)
        out.append(torch.nn.functional.normalize(h.mean(0), dim=0))
    return torch.stack(out)


def test_the_folder_loads_as_it_is_with_the_long_length(long_folder, source):
    files = json.loads((long_folder / "modules.json").read_text())
    assert [m["type"] for m in files] == list(MODULE_TYPES.values())
    assert json.loads((long_folder / "sentence_bert_config.json").read_text())["max_seq_length"] == LONG
    assert json.loads((long_folder / "tokenizer_config.json").read_text())["model_max_length"] == LONG
    assert json.loads((long_folder / "1_Pooling" / "config.json").read_text()) == json.loads(
        (source / "1_Pooling" / "config.json").read_text()
    )  # the source's pooling, copied
    model = st.SentenceTransformer(str(long_folder), device="cpu")
    assert model.max_seq_length == LONG
    assert type(model[0].auto_model) is NystromformerModel
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Normalize"]
    assert st.SentenceTransformer(str(source), device="cpu").max_seq_length == 128  # the source's own


def test_encode_beyond_512_tokens_is_our_mean_pooled_state_and_longer_documents_are_cut(long_folder):
    model = st.SentenceTransformer(str(long_folder), device="cpu")
    tok = model.tokenizer
    docs = [text(380, 1), text(300, 2)]  # both above 512 tokens, below LONG: one batch, padded
    assert all(512 < len(tok(d).input_ids) < LONG for d in docs)
    got = torch.from_numpy(model.encode(docs, batch_size=2, show_progress_bar=True))
    assert (got - direct(long_folder, docs)).abs().max() <= TOL
    # longer than max_seq_length: sentence-transformers keeps the first LONG tokens ([CLS] + LONG - 2 + [SEP])
    too_long = text(700, 3)
    assert len(tok(too_long).input_ids) > LONG
    cut = torch.from_numpy(model.encode([too_long]))
    assert (cut - direct(long_folder, [too_long], max_length=LONG)).abs().max() <= TOL


def test_loading_without_import_nystrom_fails_loudly(long_folder):
    code = f"from sentence_transformers import SentenceTransformer; SentenceTransformer({str(long_folder)!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "nystrom-nystromformer" in done.stderr  # no fallback to another model


def test_defaults_and_errors_of_the_writer(tmp_path, source):
    model = to_long(source, max_position_embeddings=600, attention="softmax")
    folder = tmp_path / "plain"
    model.save_pretrained(folder)
    with pytest.raises(CheckpointError, match="no tokenizer"):
        write_sentence_transformers(folder)
    save_tokenizer(source / "tokenizer.json", folder, model_max_length=600)
    layout = write_sentence_transformers(folder)  # no source: mean pooling, no Normalize, all positions
    assert (layout.max_seq_length, layout.pooling_mode, layout.normalize) == (600, "mean", False)
    assert [m["path"] for m in json.loads((folder / "modules.json").read_text())] == ["", "1_Pooling"]
    assert write_sentence_transformers(folder, source=source, max_seq_length=300).normalize
    with pytest.raises(ValueError, match=r"in \[1, 600\]"):
        write_sentence_transformers(folder, max_seq_length=601)
    with pytest.raises(CheckpointError, match="is not ours"):
        write_sentence_transformers(source)
    dense = tmp_path / "dense"
    dense.mkdir()
    modules = json.loads((source / "modules.json").read_text())
    modules.insert(
        2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    )
    (dense / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="only a Transformer"):
        write_sentence_transformers(folder, source=dense)


def test_contrastive_continuation_trains_and_writes_a_loadable_folder(long_folder, tmp_path):
    """nystrom_lab.long_context.embeddings_contrastive on the tiny long folder: the loop trains, the best dev
    weights are written back as a sentence-transformers folder that loads as it is."""
    from safetensors.torch import load_file

    from nystrom_lab.long_context import embeddings_contrastive as ec
    from nystrom_lab.training.config import TrainConfig
    from nystrom_lab.training.loop import train

    task = ec.make_task(long_folder, [text(150, s) for s in range(30)], min_span=8, max_span=60)
    assert (len(task.train), len(task.dev)) == (27, 3)
    cfg = TrainConfig(steps=3, batch_size=4, lr=1e-3, eval_every=3, eval_at_start=True, device="cpu",
                      metric="loss", metric_mode="min")  # fmt: skip
    res = train(task, cfg, tmp_path / "run", progress=False)
    assert res["step"] == 3 and res["best_step"] in (0, 3)
    folder = ec.write_model(task, long_folder, tmp_path / "run")
    best = load_file(str(tmp_path / "run" / "best.safetensors"))
    written = load_file(str(folder / "model.safetensors"))
    assert best.keys() == written.keys() and all(torch.equal(best[k], written[k]) for k in best)
    model = st.SentenceTransformer(str(folder), device="cpu")
    assert model.max_seq_length == LONG and model.encode([text(300, 99)]).shape == (1, 32)
    with pytest.raises(ValueError, match="exceeds the model's"):
        ec.make_task(long_folder, [text(150, s) for s in range(30)], min_span=8, max_span=LONG)
