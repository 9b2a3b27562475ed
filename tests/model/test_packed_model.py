"""Packed documents in our models: ``NystromformerModel`` and the token-level heads take transformers' forms
(``position_ids`` restarting, ``seq_idx``, ``cu_seq_lens_q``/``cu_seq_lens_k``/``max_length_*``), and every
document gets what it gets alone with nystrom and softmax attention, forward, gradients and the MLM loss;
the documents are derived and planned once per forward; what needs one sequence per row raises."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import DataCollatorWithFlattening

from nystrom.model import (
    NystromformerConfig,
    NystromformerForMaskedLM,
    NystromformerForMultipleChoice,
    NystromformerForPreTraining,
    NystromformerForQuestionAnswering,
    NystromformerForSequenceClassification,
    NystromformerForTokenClassification,
    NystromformerModel,
)
from nystrom.ops.plan import documents

from oracle import rel_err

LENGTHS = [7, 1, 30, 3, 64]  # 1 and 3 tokens: fewer than the 8 landmarks
TOLERANCE = {torch.float64: (1e-12, 1e-10), torch.float32: (1e-5, 1e-4)}  # outputs, gradients
ATTENTION = {"nystrom": {"name": "nystrom", "num_landmarks": 8, "conv_kernel_size": 5}, "softmax": "softmax"}
FORMS = {
    "position_ids": {},
    "flash_attn_kwargs": {"return_flash_attn_kwargs": True},
    "seq_idx": {"return_seq_idx": True},
}


def tiny(attention: str | dict = "nystrom", **overrides) -> NystromformerConfig:
    """A tiny config; ``attention`` a key of :data:`ATTENTION` or a spec."""
    spec = ATTENTION[attention] if isinstance(attention, str) else attention
    base = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                max_position_embeddings=128, dropout=0.0, attention=spec, num_labels=3)  # fmt: skip
    return NystromformerConfig(**{**base, **overrides})


def flattened(form: str = "position_ids") -> tuple[list[torch.Tensor], dict]:
    docs = [torch.randint(3, 50, (length,)) for length in LENGTHS]
    batch = DataCollatorWithFlattening(**FORMS[form])([{"input_ids": d.tolist()} for d in docs])
    return docs, batch


def grads(model: torch.nn.Module) -> torch.Tensor:
    out = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad()
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("attention", list(ATTENTION))
def test_every_document_gets_what_it_gets_alone(attention, form, dtype):
    model = NystromformerModel(tiny(attention)).to(dtype).eval()
    docs, batch = flattened(form)
    del batch["labels"]
    weight = torch.randn(sum(LENGTHS), 32, dtype=dtype)
    packed = model(**batch).last_hidden_state[0]  # (N, e)
    (packed * weight).sum().backward()
    packed_grads = grads(model)
    alone = torch.cat([model(d[None]).last_hidden_state[0] for d in docs])  # (N, e)
    (alone * weight).sum().backward()
    out_tol, grad_tol = TOLERANCE[dtype]
    assert rel_err(packed, alone) <= out_tol
    assert packed_grads.norm() > 0 and rel_err(packed_grads, grads(model)) <= grad_tol


@pytest.mark.parametrize("attention", list(ATTENTION))
def test_masked_lm_loss_is_the_token_weighted_loss_of_the_documents(attention):
    model = NystromformerForMaskedLM(tiny(attention, norm_position="post")).double().eval()
    docs, batch = flattened("flash_attn_kwargs")
    packed = model(**batch)
    packed.loss.backward()
    packed_grads = grads(model)
    total, count = 0.0, 0
    for d in docs:
        labels = torch.cat([torch.tensor([-100]), d[1:]])  # the collator's: no label on a first token
        alone = model(d[None], labels=labels[None])
        assert rel_err(packed.logits[0, : len(d)], alone.logits[0]) <= 1e-12
        packed.logits = packed.logits[:, len(d) :]
        if len(d) > 1:
            total, count = total + alone.loss * (len(d) - 1), count + len(d) - 1
    (total / count).backward()  # the cross-entropy runs in float32 (mlm_loss): float32's tolerances
    assert rel_err(packed.loss, total / count) <= 1e-6 and rel_err(packed_grads, grads(model)) <= 1e-5


def test_packed_rows_of_a_padded_batch():
    """Two rows, each packing documents by restarting position ids, the second right-padded (padding's
    position ids arbitrary): every document as alone, and padding never starts a document."""
    model = NystromformerForTokenClassification(tiny()).double().eval()
    ids = torch.randint(3, 50, (2, 40))
    pos = torch.cat([torch.arange(12), torch.arange(28), torch.arange(25), torch.arange(10), torch.zeros(5)])
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 35:] = 0
    packed = model(ids, attention_mask=mask, position_ids=pos.long().view(2, 40)).logits.reshape(80, -1)
    flat = ids.reshape(1, 80)
    for s, e in [(0, 12), (12, 40), (40, 65), (65, 75)]:
        assert rel_err(packed[s:e], model(flat[:, s:e]).logits[0]) <= 1e-12


def test_one_document_per_row_is_not_packed(monkeypatch):
    calls = []
    monkeypatch.setattr(documents, "document_plan", lambda *a, **kw: calls.append(1))
    model = NystromformerModel(tiny()).eval()
    ids, mask = torch.randint(3, 50, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    pos = torch.arange(12).expand(2, 12).masked_fill(mask == 0, 1)  # padding's ids repeat: no new document
    real = mask.bool()
    out = model(ids, mask, position_ids=pos).last_hidden_state[real]
    torch.testing.assert_close(out, model(ids, mask).last_hidden_state[real], rtol=0, atol=0)
    assert calls == []


def test_the_documents_are_planned_once_per_forward(monkeypatch):
    calls = []
    plan = documents.document_plan
    monkeypatch.setattr(documents, "document_plan", lambda *a, **kw: calls.append(1) or plan(*a, **kw))
    model = NystromformerModel(tiny(num_hidden_layers=3)).eval()
    _, batch = flattened()
    del batch["labels"]
    model(**batch)
    model(**batch, attention_mask=torch.ones_like(batch["input_ids"]))  # all real: the same plan shared
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("cls", "extra", "match"),
    [
        (NystromformerForSequenceClassification, {}, "NystromformerForSequenceClassification needs one sequence"),
        (NystromformerForSequenceClassification, {"labels": torch.tensor([1])}, "pools a row"),
        (NystromformerForPreTraining, {"sentence_order_label": torch.tensor([0])}, "the sentence-order loss"),
        (NystromformerForQuestionAnswering, {"start_positions": torch.tensor([3]),
                                             "end_positions": torch.tensor([5])}, "the span loss"),
        (NystromformerForMaskedLM, {"output_attentions": True}, "output_attentions=True with packed documents"),
    ],
)  # fmt: skip
def test_what_needs_one_sequence_per_row_raises(cls, extra, match):
    model = cls(tiny(pooler=True, pooling="cls")).eval()
    _, batch = flattened()
    del batch["labels"]
    with pytest.raises(ValueError, match=match):
        model(**batch, **extra)


def test_heads_without_a_per_row_summary_run_packed():
    _, batch = flattened("seq_idx")
    del batch["labels"]
    n = sum(LENGTHS)
    assert NystromformerForPreTraining(tiny(pooler=True)).eval()(**batch).prediction_logits.shape == (
        1,
        n,
        50,
    )
    qa = NystromformerForQuestionAnswering(tiny()).eval()(**batch)
    assert qa.start_logits.shape == (1, n) and qa.loss is None
    choices = {k: v[:, None] for k, v in batch.items()}  # (b, r, n): one choice packing documents
    with pytest.raises(ValueError, match="NystromformerForMultipleChoice needs one sequence"):
        NystromformerForMultipleChoice(tiny()).eval()(**choices)


def test_variants_that_cannot_pack_refuse():
    linear = NystromformerModel(tiny({"name": "linear"})).eval()
    _, batch = flattened()
    with pytest.raises(ValueError, match="cannot honour packed documents"):
        linear(batch["input_ids"], position_ids=batch["position_ids"])


def test_offsets_given_directly():
    model = NystromformerModel(tiny()).double().eval()
    docs, batch = flattened()
    cu = torch.tensor([0, *itertools.accumulate(LENGTHS)], dtype=torch.int32)
    out = model(
        batch["input_ids"], position_ids=batch["position_ids"], cu_seq_lens_k=cu
    )  # the key form alone
    assert rel_err(out.last_hidden_state[0], model(**{k: batch[k] for k in ("input_ids", "position_ids")})
                   .last_hidden_state[0]) <= 1e-15  # fmt: skip
    with pytest.raises(ValueError, match="cu_seq_lens_q=.* and cu_seq_lens_k=.* differ"):
        model(batch["input_ids"], cu_seq_lens_q=cu, cu_seq_lens_k=cu.flip(0))
