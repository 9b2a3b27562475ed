"""Packed documents as transformers produces them (``DataCollatorWithFlattening``): ``attn_implementation=
"nystrom"`` in BERT gives every document what it gets alone, whichever form the collator hands over
(restarting position ids, FlashAttention's ``cu_seq_lens_*``, ``seq_idx``), forward and gradients; the
forms become ``cu_seqlens`` in one function (:func:`packed_cu_seqlens`), derived once per forward; our MLM
model trains on flattened batches under ``Trainer``; the lucidrains drop-in packs too; misuse raises."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import transformers
from transformers import BertConfig, BertModel, DataCollatorWithFlattening

import nystrom.compat.hf_attention as hf_attention
from nystrom.compat.lucidrains import NystromAttention as LucidrainsAttention
from nystrom.compat.lucidrains import Nystromformer as LucidrainsNystromformer
from nystrom.model import NystromformerConfig, NystromformerForMaskedLM
from nystrom.ops.plan import packed_cu_seqlens

from oracle import rel_err

transformers.logging.set_verbosity_error()
LENGTHS = [7, 1, 30, 3, 64]  # 1 and 3 tokens: fewer than the 8 landmarks
#: relative error allowed, packed against separate: outputs, gradients
TOLERANCE = {torch.float64: (1e-12, 1e-10), torch.float32: (1e-5, 1e-4)}
COLLATORS = {
    "position_ids": {},
    "flash_attn_kwargs": {"return_flash_attn_kwargs": True},
    "seq_idx": {"return_seq_idx": True},
}


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def _documents(vocab: int = 50) -> list[torch.Tensor]:
    return [torch.randint(2, vocab, (length,)) for length in LENGTHS]


def _bert(dtype: torch.dtype) -> BertModel:
    config = BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    config.nystrom_attention = {"num_landmarks": 8}
    return BertModel._from_config(config, attn_implementation="nystrom").to(dtype).eval()


def _grads(model: torch.nn.Module) -> torch.Tensor:
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad()
    return grads


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("form", list(COLLATORS))
def test_bert_documents_packed_by_the_collator_get_what_they_get_alone(form, dtype):
    model = _bert(dtype)
    docs = _documents()
    batch = DataCollatorWithFlattening(**COLLATORS[form])([{"input_ids": d.tolist()} for d in docs])
    del batch["labels"]
    weight = torch.randn(sum(LENGTHS), 32, dtype=dtype)
    packed = model(**batch).last_hidden_state[0]  # (N, e)
    (packed * weight).sum().backward()
    packed_grads = _grads(model)
    alone = torch.cat([model(d[None]).last_hidden_state[0] for d in docs])  # (N, e)
    (alone * weight).sum().backward()
    out_tol, grad_tol = TOLERANCE[dtype]
    assert rel_err(packed, alone) <= out_tol
    assert packed_grads.norm() > 0 and rel_err(packed_grads, _grads(model)) <= grad_tol


def test_the_documents_are_derived_once_per_forward(monkeypatch):
    calls = []
    derive = hf_attention.packed_cu_seqlens
    monkeypatch.setattr(
        hf_attention, "packed_cu_seqlens", lambda *a, **kw: calls.append(1) or derive(*a, **kw)
    )
    model = _bert(torch.float64)
    docs = _documents()
    batch = DataCollatorWithFlattening()([{"input_ids": d.tolist()} for d in docs])
    del batch["labels"]
    first = model(**batch).last_hidden_state
    assert len(calls) == 1  # two layers, one derivation
    batch["position_ids"][0, LENGTHS[0]] = LENGTHS[0]  # edited in place: documents 0 and 1 now one
    merged = model(**batch).last_hidden_state
    assert len(calls) == 2
    s = sum(LENGTHS[:2])
    assert torch.equal(merged[:, s:], first[:, s:]) and rel_err(merged[:, :s], first[:, :s]) > 1e-3
    with torch.inference_mode():  # inference tensors keep no version: never remembered, derived per layer
        batch = {k: v.clone() for k, v in batch.items()}
        assert torch.equal(model(**batch).last_hidden_state, merged)
    assert len(calls) == 4


def test_packed_cu_seqlens_reads_every_form():
    cu = _offsets([3, 2, 4])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2]], dtype=torch.int32)
    for form in ({"position_ids": pos}, {"seq_idx": seq_idx}):
        got, longest = packed_cu_seqlens(1, 9, **form)
        assert got.tolist() == cu.tolist() and got.dtype == torch.int32 and longest == 4
    # the first form given decides: cu_seq_lens, then seq_idx, then position ids
    got, longest = packed_cu_seqlens(1, 9, cu_seq_lens_q=cu, cu_seq_lens_k=cu.clone(), max_length_q=4,
                                     max_length_k=4, seq_idx=torch.zeros_like(seq_idx), position_ids=pos)  # fmt: skip
    assert got is cu and longest == 4
    assert packed_cu_seqlens(1, 9, seq_idx=torch.zeros_like(seq_idx), position_ids=pos) == (None, None)
    # one document per row is not packed: a padded batch's position ids (repeated at padding) split nothing
    pos2 = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 2, 2]])
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    assert packed_cu_seqlens(2, 5, position_ids=pos2, attention_mask=mask) == (None, None)
    assert packed_cu_seqlens(2, 5, position_ids=torch.arange(5)[None]) == (None, None)  # (1, n): every row
    assert packed_cu_seqlens(2, 5) == (None, None)
    shared = torch.tensor([[0, 1, 0, 1, 2]])  # (1, n) restarting: the same documents in every row
    assert packed_cu_seqlens(2, 5, position_ids=shared)[0].tolist() == [0, 2, 5, 7, 10]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cu_seq_lens_q": _offsets([3, 6]), "cu_seq_lens_k": _offsets([4, 5])}, ValueError,
         r"cu_seq_lens_q=\[0, 3, 9\] and cu_seq_lens_k=\[0, 4, 9\] differ: this is self-attention"),
        ({"cu_seq_lens_q": _offsets([3, 6]), "cu_seq_lens_k": _offsets([9])}, ValueError, "differ"),
        ({"cu_seq_lens_q": _offsets([3, 6]), "max_length_q": 6, "max_length_k": 5}, ValueError,
         "max_length_q=6 and max_length_k=5 differ"),
        ({"max_length_q": 6}, ValueError, "give it with cu_seq_lens_q"),
        ({"cu_seq_lens_q": _offsets([9]), "max_length_q": 0}, ValueError, "max_length_q must be an int >= 1"),
        ({"position_ids": torch.arange(8)[None]}, ValueError, r"position_ids must have shape .* \(1, 9\)"),
        ({"seq_idx": torch.zeros(2, 9, dtype=torch.long)}, ValueError, r"seq_idx must have shape .* = \(1, 9\)"),
        ({"position_ids": torch.arange(9.0)[None]}, TypeError, "position_ids must be an integer tensor"),
    ],
)  # fmt: skip
def test_malformed_forms_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        packed_cu_seqlens(1, 9, **kwargs)


def test_bert_refuses_different_query_and_key_documents():
    model = _bert(torch.float64)
    ids = torch.randint(2, 50, (1, 9))
    with pytest.raises(ValueError, match="differ: this is self-attention"):
        model(
            ids,
            cu_seq_lens_q=_offsets([3, 6]),
            cu_seq_lens_k=_offsets([4, 5]),
            max_length_q=6,
            max_length_k=5,
        )


def test_trainer_trains_our_masked_lm_on_flattened_batches(tmp_path):
    config = NystromformerConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, dropout=0.0, attention={"name": "nystrom", "num_landmarks": 4},
    )  # fmt: skip
    model = NystromformerForMaskedLM(config)
    rows = [
        {"input_ids": torch.randint(3, 50, (length,)).tolist()} for length in [9, 2, 30, 5, 17, 12, 1, 20]
    ]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-3, report_to=[],
        use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
    )  # fmt: skip
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    before = copy.deepcopy(model.state_dict())
    result = trainer.train()
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lucidrains_drop_in_packed_equals_separate(dtype):
    model = LucidrainsNystromformer(dim=16, depth=2, dim_head=8, heads=2, num_landmarks=8).to(dtype)
    cu = _offsets(LENGTHS)
    x = torch.randn(1, sum(LENGTHS), 16, dtype=dtype)
    weight = torch.randn_like(x)
    packed = model(x, cu_seqlens=cu, max_seqlen=max(LENGTHS))
    (packed * weight).sum().backward()
    packed_grads = _grads(model)
    bounds = list(zip(cu[:-1].tolist(), cu[1:].tolist()))
    alone = torch.cat([model(x[:, s:e]) for s, e in bounds], 1)
    (alone * weight).sum().backward()
    out_tol, grad_tol = TOLERANCE[dtype]
    assert rel_err(packed, alone) <= out_tol and rel_err(packed_grads, _grads(model)) <= grad_tol


def test_lucidrains_drop_in_packed_rows_with_padding():
    """Two rows, each packing documents, the second right-padded: a document gets what it gets alone with
    its slice of the mask (lucidrains' landmark runs count its padding, as for any padded sample)."""
    attn = LucidrainsAttention(16, dim_head=8, heads=2, num_landmarks=4, pinv_init="per_matrix").double()
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 15:] = False
    cu = _offsets([6, 14, 9, 11])  # row 1: documents of 9 and 6 real tokens (+ 5 padding)
    packed = attn(x, mask, cu_seqlens=cu).reshape(40, 16)
    rows, flat = x.reshape(1, 40, 16), mask.reshape(1, 40)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        real = flat[0, s:e]
        alone = attn(rows[:, s:e], flat[:, s:e])[0]
        assert rel_err(packed[s:e][real], alone[real]) <= 1e-12


def test_lucidrains_drop_in_refuses_what_packing_cannot_give():
    attn = LucidrainsAttention(16, dim_head=8, heads=2, num_landmarks=4)
    x = torch.randn(1, 10, 16)
    cu = _offsets([4, 6])
    with pytest.raises(ValueError, match="return_attn/return_attn_matrices with packed documents"):
        attn(x, cu_seqlens=cu, return_attn=True)
    with pytest.raises(ValueError, match="give it with cu_seqlens"):
        attn(x, max_seqlen=6)
    with pytest.raises(ValueError, match="document 1 .* has no real token"):
        attn(x, torch.arange(10)[None] < 4, cu_seqlens=cu)
