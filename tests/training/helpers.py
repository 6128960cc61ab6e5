"""What the training tests share: a tiny labelled text dataset."""

from __future__ import annotations

from ..models.text.helpers import batch


def classification_examples(count: int = 8, n: int = 12) -> list[dict]:
    """``count`` examples of ``n`` random tokens (no padding) with alternating labels 0 / 1."""
    ids, mask = batch(b=count, n=n, lengths=(n,) * count)
    rows = enumerate(zip(ids, mask, strict=True))
    return [{"input_ids": i, "attention_mask": m, "labels": k % 2} for k, (i, m) in rows]
