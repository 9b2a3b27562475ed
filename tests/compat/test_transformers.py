"""Our models as transformers models: Auto classes, save/from_pretrained, Trainer, pipelines, the standard
keyword arguments, gradient checkpointing, resizing, dtypes and every head's loss (tiny configs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

import nystrom.model.layers as layers
from nystrom.model import (
    AUTO_CLASSES,
    NystromformerConfig,
    NystromformerForMaskedLM,
    NystromformerForMultipleChoice,
    NystromformerForQuestionAnswering,
    NystromformerForSequenceClassification,
    NystromformerForTokenClassification,
    NystromformerModel,
    save_tokenizer,
)
from nystrom_lab.data.text import train_wordpiece

transformers.logging.set_verbosity_error()
CORPUS = Path(__file__).parents[1] / "fixtures" / "text" / "corpus"
NYSTROM = {"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 3}


def tiny(**overrides) -> NystromformerConfig:
    base = dict(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                max_position_embeddings=48, attention=NYSTROM, dropout=0.0, num_labels=3)  # fmt: skip
    return NystromformerConfig.preset("bert-small", **{**base, **overrides})


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_wordpiece(sorted(CORPUS.glob("*.txt")), path, vocab_size=200)
    return path


def folder_with_tokenizer(model, tokenizer_file: Path, folder: Path) -> str:
    model.save_pretrained(folder)
    save_tokenizer(tokenizer_file, folder, model_max_length=model.config.max_position_embeddings)
    return str(folder)


@pytest.mark.parametrize("auto", list(AUTO_CLASSES), ids=lambda a: a.__name__)
def test_auto_round_trip_is_bitwise(tmp_path, auto):
    torch.manual_seed(0)
    cls = AUTO_CLASSES[auto]
    model = cls(tiny()).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert isinstance(transformers.AutoConfig.from_pretrained(tmp_path), NystromformerConfig)
    loaded = auto.from_pretrained(tmp_path).eval()
    assert type(loaded) is cls
    own, back = model.state_dict(), loaded.state_dict()
    assert own.keys() == back.keys() and all(torch.equal(own[k], back[k]) for k in own)
    ids = torch.randint(0, 60, (2, 3, 10) if cls is NystromformerForMultipleChoice else (2, 10))
    with torch.no_grad():
        for p in loaded.parameters():  # safetensors' memory map leaves tensors unaligned, and MKL's sums
            p.data = p.data.clone()  # depend on alignment (~1e-12); aligned copies compute bit for bit
        a, b = model(ids, return_dict=False), loaded(ids, return_dict=False)
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_sharded_save_and_dtype(tmp_path):
    torch.manual_seed(0)
    model = NystromformerForSequenceClassification(tiny()).eval()
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    ids = torch.randint(0, 60, (2, 12))
    loaded = NystromformerForSequenceClassification.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    bf16 = NystromformerForSequenceClassification.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    assert (bf16(ids).logits.float() - model(ids).logits).abs().max() < 0.05
    double = model.to(torch.float64)
    assert double(ids).logits.dtype == torch.float64


def test_return_dict_false_gives_transformers_tuples():
    torch.manual_seed(0)
    mlm = NystromformerForMaskedLM(tiny()).eval()
    ids = torch.randint(0, 60, (2, 10))
    loss, logits = mlm(ids, labels=ids, return_dict=False)
    out = mlm(ids, labels=ids)
    assert torch.equal(loss, out.loss) and torch.equal(logits, out.logits) and out[0] is out.loss
    clf = NystromformerForSequenceClassification(tiny()).eval()
    (logits,) = clf(ids, return_dict=False)
    logits2, states = clf(ids, output_hidden_states=True, return_dict=False)
    assert logits.shape == (2, 3) and torch.equal(logits, logits2) and len(states) == 3
    base = NystromformerModel(tiny()).eval()
    hidden, pooled = base(ids, return_dict=False)
    assert hidden.shape == (2, 10, 16) and pooled.shape == (2, 16)


@pytest.mark.parametrize(
    "attention", ["softmax", {"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": None}]
)
def test_hidden_states_and_attention_weights(attention):
    """Layer 0's weights applied to its V give exactly what the attention module computes."""
    torch.manual_seed(0)
    model = NystromformerModel(tiny(attention=attention)).eval()
    ids = torch.randint(1, 60, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        assert len(out.hidden_states) == 3 and torch.equal(out.hidden_states[-1], out.last_hidden_state)
        assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 12, 12)
        real = mask.bool()
        torch.testing.assert_close(out.attentions[0].sum(-1)[real[:, None].expand(2, 2, 12)],
                                   torch.ones(2 * 2 * 12 - 2 * 3), rtol=0, atol=1e-5)  # fmt: skip
        assert not bool(out.attentions[0][1, :, :, 9:].any())  # no weight on padding
        attn, x = model.encoder.layers[0].attention, out.hidden_states[0]
        v = attn.qkv(x).unflatten(-1, (3, 2, 8))[:, :, 2].transpose(1, 2)  # (b, h, n, d)
        mixed = (out.attentions[0] @ v).transpose(1, 2).flatten(2)  # (b, n, e)
        torch.testing.assert_close(attn.out(mixed)[real], attn(x, real)[real], rtol=1e-5, atol=1e-5)


def test_attention_weights_above_the_limit_raise(monkeypatch):
    model = NystromformerModel(tiny()).eval()
    monkeypatch.setattr(layers, "MAX_ATTENTION_TOKENS", 8)
    with pytest.raises(ValueError, match=r"limited to n <= 8 tokens"):
        model(torch.randint(0, 60, (1, 9)), output_attentions=True)
    with pytest.raises(ValueError, match="'linformer'"):
        NystromformerModel(tiny(attention={"name": "linformer", "seq_len": 16}))(
            torch.randint(0, 60, (1, 8)), output_attentions=True
        )


def test_inputs_embeds_and_position_ids_match_the_ids_path():
    torch.manual_seed(0)
    model = NystromformerForTokenClassification(tiny()).eval()
    ids, types = torch.randint(0, 60, (2, 11)), torch.randint(0, 2, (2, 11))
    with torch.no_grad():
        ref = model(ids, token_type_ids=types).logits
        embeds = model.get_input_embeddings()(ids)
        assert torch.equal(model(inputs_embeds=embeds, token_type_ids=types).logits, ref)
        pos = torch.arange(11)[None]
        assert torch.equal(model(ids, token_type_ids=types, position_ids=pos).logits, ref)
        shifted = model(ids, token_type_ids=types, position_ids=pos + 3).logits
        assert not torch.allclose(shifted, ref)
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        model(ids, inputs_embeds=embeds)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = NystromformerForSequenceClassification(tiny()).train()
    ids, labels = torch.randint(0, 60, (3, 14)), torch.tensor([0, 2, 1])

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad()
        model(ids, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    # transformers ≥ 5.x renamed it (the old name warns of its removal in v6); the floor (5.0) has only the old
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    assert all(layer.gradient_checkpointing for layer in model.nystromformer.encoder.layers)
    ckpt = grads()
    assert plain.keys() == ckpt.keys() and len(plain) > 20
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)


def test_resize_token_embeddings_keeps_the_decoder_tied(tmp_path):
    torch.manual_seed(0)
    model = NystromformerForMaskedLM(tiny()).eval()
    ids = torch.randint(0, 60, (1, 8))
    before = model(ids).logits
    model.resize_token_embeddings(70)
    assert (
        model.config.vocab_size == 70 and model.lm_head.decoder.weight is model.get_input_embeddings().weight
    )
    after = model(torch.cat([ids, torch.tensor([[65]])], 1)).logits
    assert after.shape == (1, 9, 70) and model.lm_head.decoder.bias.shape == (70,)
    torch.testing.assert_close(model(ids).logits[..., :60], before)
    model.save_pretrained(tmp_path)
    assert transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).config.vocab_size == 70


def test_sequence_classification_problem_types():
    torch.manual_seed(0)
    ids = torch.randint(0, 60, (4, 9))
    reg = NystromformerForSequenceClassification(tiny(num_labels=1)).eval()
    y = torch.randn(4)
    out = reg(ids, labels=y)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), y))
    assert reg.config.problem_type == "regression"
    multi = NystromformerForSequenceClassification(tiny()).eval()
    y = torch.tensor([[1.0, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    out = multi(ids, labels=y)
    torch.testing.assert_close(out.loss, torch.nn.functional.binary_cross_entropy_with_logits(out.logits, y))
    assert multi.config.problem_type == "multi_label_classification"
    single = NystromformerForSequenceClassification(tiny()).eval()
    y = torch.tensor([0, 2, 1, 2])
    out = single(ids, token_type_ids=torch.randint(0, 2, (4, 9)), labels=y)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, y))
    with pytest.raises(ValueError, match=r"labels for single_label_classification must have shape \(4,\)"):
        single(ids, labels=y[:, None])


def test_token_qa_and_multiple_choice_heads():
    torch.manual_seed(0)
    ids = torch.randint(0, 60, (2, 9))
    tok = NystromformerForTokenClassification(tiny()).eval()
    labels = torch.full((2, 9), -100)
    labels[:, 2] = torch.tensor([1, 2])
    out = tok(ids, labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[:, 2], labels[:, 2]))
    qa = NystromformerForQuestionAnswering(tiny()).eval()
    start, end = torch.tensor([1, 3]), torch.tensor([4, 20])  # 20 is outside the input: ignored
    out = qa(ids, start_positions=start, end_positions=end)
    ce = torch.nn.functional.cross_entropy
    expected = (ce(out.start_logits, start) + ce(out.end_logits[:1], end[:1])) / 2
    assert out.start_logits.shape == (2, 9) and torch.allclose(out.loss, expected)
    mc = NystromformerForMultipleChoice(tiny()).eval()
    choices = torch.randint(0, 60, (2, 4, 9))
    out = mc(choices, attention_mask=torch.ones_like(choices), labels=torch.tensor([3, 0]))
    assert out.logits.shape == (2, 4)
    with torch.no_grad():
        alone = mc(choices[:, 2:3]).logits  # each choice is scored on its own
    torch.testing.assert_close(alone[:, 0], out.logits[:, 2], rtol=1e-5, atol=1e-6)


def _text_rows(n: int) -> list[str]:
    lines = [ln for f in sorted(CORPUS.glob("*.txt")) for ln in f.read_text().splitlines() if ln.strip()]
    return lines[:n]


def _trainer(model, tmp_path, train, evaluation, collator) -> transformers.Trainer:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), max_steps=4, per_device_train_batch_size=4,
        per_device_eval_batch_size=4, learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no",
        logging_steps=1, disable_tqdm=True,
    )  # fmt: skip
    return transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                                data_collator=collator)  # fmt: skip


def test_trainer_masked_lm(tmp_path, tokenizer_file):
    torch.manual_seed(0)
    tok_dir = folder_with_tokenizer(
        NystromformerForMaskedLM(tiny(vocab_size=200)), tokenizer_file, tmp_path / "m"
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir)
    model = transformers.AutoModelForMaskedLM.from_pretrained(tok_dir)
    rows = [tokenizer(t, truncation=True, max_length=32) for t in _text_rows(24)]
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
    trainer = _trainer(model, tmp_path, rows[:16], rows[16:], collator)
    result = trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses))) and result.global_step == 4
    metrics = trainer.evaluate()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))


def test_trainer_sequence_classification(tmp_path, tokenizer_file):
    torch.manual_seed(0)
    folder = folder_with_tokenizer(
        NystromformerForSequenceClassification(tiny(vocab_size=200, num_labels=2)),
        tokenizer_file,
        tmp_path / "c",
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
    rows = [
        {**tokenizer(t, truncation=True, max_length=32), "labels": i % 2}
        for i, t in enumerate(_text_rows(24))
    ]
    trainer = _trainer(model, tmp_path, rows[:16], rows[16:], transformers.DataCollatorWithPadding(tokenizer))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert any(n.startswith("classifier.") for n in moved) and any(".qkv." in n for n in moved)
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert torch.isfinite(torch.tensor(trainer.evaluate()["eval_loss"]))


def test_pipelines_on_saved_folders(tmp_path, tokenizer_file):
    torch.manual_seed(0)
    text = "the model reads the text"
    fill = transformers.pipeline(
        "fill-mask",
        model=folder_with_tokenizer(
            NystromformerForMaskedLM(tiny(vocab_size=200)), tokenizer_file, tmp_path / "a"
        ),
    )
    preds = fill(f"the {fill.tokenizer.mask_token} reads the text")
    assert len(preds) == 5 and all(p["token_str"] for p in preds)
    cfg = tiny(vocab_size=200).replace(id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    clf = transformers.pipeline(
        "text-classification",
        model=folder_with_tokenizer(
            NystromformerForSequenceClassification(cfg), tokenizer_file, tmp_path / "b"
        ),
    )
    assert clf(text)[0]["label"] in ("neg", "pos")
    ner = transformers.pipeline(
        "token-classification",
        model=folder_with_tokenizer(NystromformerForTokenClassification(cfg), tokenizer_file, tmp_path / "c"),
    )
    assert all(e["entity"] in ("neg", "pos") for e in ner(text))
    feats = transformers.pipeline(
        "feature-extraction",
        model=folder_with_tokenizer(NystromformerModel(tiny(vocab_size=200)), tokenizer_file, tmp_path / "d"),
    )
    n = len(feats.tokenizer(text)["input_ids"])
    assert torch.tensor(feats(text)).shape == (1, n, 16)


def test_the_fine_tuning_script_in_the_docs_runs(tmp_path, tokenizer_file, monkeypatch):
    """docs/models.md's Trainer script, on a pre-training folder (fewer steps), writes a pipeline-ready folder."""
    from nystrom.model import NystromformerForPreTraining

    doc = (Path(__file__).parents[2] / "docs" / "models.md").read_text()
    script = next(b.split("```")[0] for b in doc.split("```python\n") if "Trainer(model" in b)
    assert len(script.strip().splitlines()) <= 30
    folder = folder_with_tokenizer(
        NystromformerForPreTraining(tiny(vocab_size=200)), tokenizer_file, tmp_path / "pre"
    )
    for old, new in (('"runs/pre/model"', repr(folder)), ("max_steps=20", "max_steps=2")):
        assert old in script
        script = script.replace(old, new)
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "docs/models.md", "exec"), {})
    clf = transformers.pipeline("text-classification", model=str(tmp_path / "runs" / "clf" / "model"))
    assert clf("a gripping film")[0]["label"] in ("neg", "pos")


def test_model_code_adds_no_graph_breaks_under_torch_compile():
    """Value checks of ids and masks run on CPU outside torch.compile only (they would sync an accelerator
    and break the graph); no graph break may come from nystrom/model/ (the attention's own are its own)."""
    import torch._dynamo

    model = NystromformerForSequenceClassification(tiny(num_hidden_layers=1)).eval()
    ids, mask = torch.randint(0, 60, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    explained = torch._dynamo.explain(model)(ids, attention_mask=mask)
    frames = [[f.filename for f in b.user_stack if "nystrom" in f.filename] for b in explained.break_reasons]
    assert not [f[-1] for f in frames if f and "nystrom/model/" in f[-1]]
    torch._dynamo.reset()
