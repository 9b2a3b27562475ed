"""Collate LRA items into model batches.

Legend: b batch, L padded length (per document for retrieval), L' ≤ L the trimmed length.
"""

from __future__ import annotations

import torch

from nystrom_lab.data.lra.tokenize import PAD_ID


def collate_single(
    items: list[tuple[torch.Tensor, torch.Tensor]], *, padded: bool, trim: bool = False
) -> dict[str, torch.Tensor]:
    """Items ``(ids (L,), label ())`` -> ``input_ids`` (b, L'), ``attention_mask`` (b, L') or none, ``labels`` (b,).

    ``trim`` cuts the columns after the batch's longest real sequence (L' ≤ L). The model's outputs are
    unchanged by it (padding is masked out of attention, landmarks, conv and pooling exactly), so it is
    only a speed-up; it must stay off when pooling averages over padding (``--pool-padding``).
    """
    ids = torch.stack([i[0] for i in items])  # (b, L)
    batch = {"input_ids": ids, "labels": torch.stack([i[1] for i in items])}
    if padded:
        mask = ids != PAD_ID  # (b, L) True = real token
        if trim:
            keep = int(mask.any(0).nonzero().max()) + 1 if bool(mask.any()) else 1
            ids, mask = ids[:, :keep], mask[:, :keep]
            batch["input_ids"] = ids
        batch["attention_mask"] = mask
    return batch


def collate_pair(items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Items ``(a (L,), b (L,), label ())`` -> both documents' ids and masks (b, L) and ``labels`` (b,)."""
    a = torch.stack([i[0] for i in items])  # (b, L)
    b = torch.stack([i[1] for i in items])  # (b, L)
    labels = torch.stack([i[2] for i in items])  # (b,)
    return {
        "input_ids_1": a,
        "input_ids_2": b,
        "attention_mask_1": a != PAD_ID,
        "attention_mask_2": b != PAD_ID,
        "labels": labels,
    }
