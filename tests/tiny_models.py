"""Tiny saved checkpoints the tests fine-tune or load, so each test does not build its own."""

from __future__ import annotations

from pathlib import Path

from hf_efficient import EfficientBertConfig, EfficientBertModel


def save_tiny_bert(folder: Path, tokenizer, max_positions: int = 64) -> Path:
    """A 1-layer EfficientBert (hidden 32, 2 heads, exact attention) with ``tokenizer``'s vocabulary, saved
    with the tokenizer into ``folder``: a checkpoint any text script loads in well under a second."""
    config = EfficientBertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=max_positions,
    )  # fmt: skip
    EfficientBertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
