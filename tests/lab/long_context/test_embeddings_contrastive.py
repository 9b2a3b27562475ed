"""The contrastive continuation of the long embedder (nystrom_lab.long_context.embeddings_contrastive)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nystrom_lab.long_context import embeddings_contrastive as ec


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 5000), lo=st.integers(1, 600), extra=st.integers(0, 1200), seed=st.integers(0, 2**31))
def test_crops_are_two_disjoint_spans_of_the_asked_lengths(n, lo, extra, seed):
    hi = lo + extra
    a, b = ec.crop_pair(n, min_span=lo, max_span=hi, generator=torch.Generator().manual_seed(seed))
    first, second = sorted((a, b), key=lambda s: s.start)
    assert 0 <= first.start < first.stop <= second.start < second.stop <= n  # disjoint, inside, non-empty
    cap = max(1, min(hi, n // 2))
    for s in (a, b):
        assert min(lo, cap) <= s.stop - s.start <= cap


def test_split_keeps_the_held_out_documents_apart():
    from nystrom_lab.long_context.embeddings import split_documents

    train, held = split_documents(7)
    assert (train, held) == ([0, 2, 4, 6], [1, 3, 5])


def test_collate_builds_special_tokens_and_masks():
    items = [("halves", list(range(10, 30))), ("halves", list(range(40, 46)))]
    batch = ec.collate_pairs(items, cls=1, sep=2, pad=0, min_span=2, max_span=4)
    assert batch["a_ids"].tolist() == [[1, 10, 11, 12, 13, 2], [1, 40, 41, 42, 2, 0]]
    assert batch["b_ids"].tolist() == [[1, 20, 21, 22, 23, 2], [1, 43, 44, 45, 2, 0]]
    assert batch["b_mask"].tolist() == [[1] * 6, [1] * 5 + [0]]


def test_step_loss_is_symmetric_infonce():
    class Identity(torch.nn.Module):  # hidden state = a fixed embedding of each token id
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)

        def forward(self, input_ids, attention_mask):
            return type("Out", (), {"last_hidden_state": self.emb(input_ids)})()

    torch.manual_seed(0)
    model = Identity()
    batch = ec.collate_pairs([("halves", [5, 6, 7, 8]), ("halves", [20, 21, 30, 31]), ("halves", [40, 41, 42, 43])],
                             cls=1, sep=2, pad=0, min_span=2, max_span=2)  # fmt: skip
    loss, metrics = ec.contrastive_step(model, batch)
    ea = ec.mean_pool(model.emb(batch["a_ids"]), batch["a_mask"])
    eb = ec.mean_pool(model.emb(batch["b_ids"]), batch["b_mask"])
    s = torch.nn.functional.normalize(ea, dim=-1) @ torch.nn.functional.normalize(eb, dim=-1).T / ec.TEMPERATURE
    want = (-(s.log_softmax(-1).diag().mean()) - s.log_softmax(0).diag().mean()) / 2
    assert float(loss) == pytest.approx(float(want), rel=1e-6)
    assert metrics["accuracy"][1] == 3 and int(metrics["accuracy"][0]) == int((s.argmax(-1) == torch.arange(3)).sum())
