"""Adding a mechanism is one registered class: a toy core (exact softmax attention written by hand, 30 lines)
registered inside this test goes through the contract matrix and the three encoders, and shows in the
attention table, with no other file changed. The fixture unregisters it, so the rest of the suite (which
compares the registry with README.md and the config files) never sees it."""

from __future__ import annotations

import pytest
import torch

import hf_efficient
from hf_efficient.attention import (
    AttentionCapabilities,
    AttentionCore,
    AttentionOutput,
    register_attention,
    unregister_attention,
)

from ..models.graph.checks import check_graph_encoder
from ..models.text.checks import check_text_encoder
from ..models.vision.checks import check_vision_encoder
from .contract import run_contract_matrix

NAME = "handwritten_softmax"


class HandwrittenSoftmaxAttention(AttentionCore):
    """softmax(Q K^T / sqrt(d)) V over the real keys, with attention dropout in training."""

    capabilities = AttentionCapabilities(permutation_equivariant=True)
    paper = "Vaswani et al. 2017, Attention Is All You Need"
    cost = "O(n²)"
    summary = "exact softmax written out by hand (a test's toy)"
    small_config = {}

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n^2 d: Q K^T and P V over all n x n pairs."""
        return 4.0 * n * n * head_dim

    def _attend(self, query, key, value, inputs):
        scores = query @ key.transpose(-1, -2) * self.scaling  # (b, h, n, n)
        if inputs.attention_mask is not None:
            scores = scores.masked_fill(~inputs.attention_mask[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.nn.functional.dropout(probs, self.spec.dropout, self.training)
        return AttentionOutput(probs @ value, None)


@pytest.fixture
def handwritten_softmax():
    register_attention(NAME)(HandwrittenSoftmaxAttention)
    try:
        yield NAME
    finally:
        unregister_attention(NAME)


def test_a_registered_toy_passes_the_contract_and_every_encoder(handwritten_softmax, tmp_path):
    assert handwritten_softmax in hf_efficient.list_attention_types()
    for modality in ("text", "vision", "graph"):
        assert handwritten_softmax in hf_efficient.list_attention_types(modality)
    row = f"| `{NAME}` | {HandwrittenSoftmaxAttention.paper} | O(n²) | text, vision, graph |"
    assert row in hf_efficient.attention_table()
    run_contract_matrix(handwritten_softmax, tmp_path / "core")
    check_text_encoder(handwritten_softmax, tmp_path / "text")
    check_vision_encoder(handwritten_softmax, tmp_path / "vision")
    check_graph_encoder(handwritten_softmax, tmp_path / "graph")


def test_the_toy_is_gone_after_its_test():
    """Runs after the test above (file order): the fixture's teardown removed the type again."""
    assert NAME not in hf_efficient.list_attention_types()
    with pytest.raises(ValueError, match="Unknown attention_type"):
        hf_efficient.get_attention_class(NAME)
