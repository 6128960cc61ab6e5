"""Adding a mechanism is one registered class: a toy core (exact softmax attention written by hand, 30 lines,
with a kernel of its own that computes the queries a chunk at a time, as in docs/contributing.md)
registered inside this test goes through the contract matrix, the kernel-against-reference checks and the
three encoders (export included), shows in the attention table and the export table, and gives the text
scripts' config files its settings, with no other file changed; the lab's benchmarks measure it with its
benchmark settings (benchmarks/tests/test_new_mechanism_benchmark.py). The fixture unregisters it, so the
rest of the suite (which compares the registry with the docs' tables) never sees it."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import HfArgumentParser

import hf_efficient
from hf_efficient import EfficientBertConfig
from hf_efficient.attention import (
    AttentionCapabilities,
    AttentionCore,
    AttentionOutput,
    Kernel,
    register_attention,
    unregister_attention,
)
from hf_efficient.export import export_table
from hf_efficient.training import parse_args_with_config_files

from ..models.graph import checks as graph_checks
from ..models.graph.checks import check_graph_encoder
from ..models.text import checks as text_checks
from ..models.text.checks import check_text_encoder
from ..models.vision import checks as vision_checks
from ..models.vision.checks import check_vision_encoder
from ..script_loader import CONFIGS
from ..training.helpers import script_dataclasses
from .contract import run_contract_matrix
from .test_kernels import check_kernel_equals_reference

NAME = "handwritten_softmax"


def softmax_attention(core, query, key, value, mask):
    """softmax(Q K^T / sqrt(d)) V over the real keys: (b, h, q, d) queries against (b, h, n, d) keys."""
    scores = query @ key.transpose(-1, -2) * core.scaling  # (b, h, q, n)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.nn.functional.dropout(probs, core.spec.dropout, core.training) @ value


def query_chunks(core, query, key, value, inputs, rows=16):
    """The toy's kernel: the same maths, ``rows`` queries at a time."""
    parts = [softmax_attention(core, q, key, value, inputs.attention_mask) for q in query.split(rows, dim=2)]
    return AttentionOutput(torch.cat(parts, dim=2), None)


class HandwrittenSoftmaxAttention(AttentionCore):
    """softmax(Q K^T / sqrt(d)) V over the real keys, with attention dropout in training."""

    capabilities = AttentionCapabilities(permutation_equivariant=True)
    paper = "Vaswani et al. 2017, Attention Is All You Need"
    cost = "O(n²)"
    summary = "exact softmax written out by hand (a test's toy)"
    small_config = {}
    kernels = (Kernel("query_chunks", query_chunks, chosen=lambda core, query, inputs: query.shape[2] > 64),)
    # Its facts for the scripts' config files, the benchmarks and the export table, read from here alone.
    script_configs = {
        "text": {"attention_config": {"implementation": "query_chunks"}, "training": {"seed": 7}}
    }
    benchmark_config = {"implementation": "reference"}
    export_note = "the n x n scores, as full"

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n^2 d: Q K^T and P V over all n x n pairs."""
        return 4.0 * n * n * head_dim

    def reference(self, query, key, value, inputs):
        return AttentionOutput(softmax_attention(self, query, key, value, inputs.attention_mask), None)


@contextlib.contextmanager
def registered_toy():
    """The toy in the registry while the block runs, and out of it again after."""
    register_attention(NAME)(HandwrittenSoftmaxAttention)
    try:
        yield NAME
    finally:
        unregister_attention(NAME)


@pytest.fixture
def handwritten_softmax():
    with registered_toy() as name:
        yield name


def test_a_registered_toy_passes_the_contract_and_every_encoder(handwritten_softmax, tmp_path):
    assert handwritten_softmax in hf_efficient.list_attention_types()
    for modality in ("text", "vision", "graph"):
        assert handwritten_softmax in hf_efficient.list_attention_types(modality)
    row = f"| `{NAME}` | {HandwrittenSoftmaxAttention.paper} | O(n²) | text, vision, graph |"
    assert row in hf_efficient.attention_table()
    run_contract_matrix(handwritten_softmax, tmp_path / "core")
    assert check_kernel_equals_reference(handwritten_softmax, "query_chunks")
    check_text_encoder(handwritten_softmax, tmp_path / "text")
    check_vision_encoder(handwritten_softmax, tmp_path / "vision")
    check_graph_encoder(handwritten_softmax, tmp_path / "graph")


@pytest.mark.slow
def test_a_registered_toy_exports_through_every_encoder(handwritten_softmax, tmp_path):
    """torch.export and ONNX Runtime on the toy's three encoders: about 17 of the 20 CPU-seconds the toy's
    checks take, so `make test` runs it (slow), as it runs every registered type's export
    (tests/test_export.py); the edit loop keeps the toy's contract and encoders and full's text export."""
    for checks in (text_checks, vision_checks, graph_checks):
        checks.check_exports(handwritten_softmax, tmp_path / checks.__name__)


def test_the_toys_facts_reach_the_config_files_and_the_export_table(
    handwritten_softmax, pretrain_mlm, tmp_path
):
    """What the text scripts set for the toy, and its export note, come from its class and nowhere else."""
    args = ["--config", str(CONFIGS / "text" / "base_tiny.json"), "--attention_type", NAME]
    (*_, training), model = parse_args_with_config_files(
        HfArgumentParser(script_dataclasses(pretrain_mlm)),
        EfficientBertConfig,
        None,
        [*args, "--output_dir", str(tmp_path)],
    )
    assert model["attention_type"] == NAME and model["attention_config"] == {"implementation": "query_chunks"}
    assert training.seed == 7
    assert f"| `{NAME}` | yes | yes | yes | the n x n scores, as full |" in export_table()


def test_the_toy_is_gone_after_its_registration_ends():
    """What the fixture's teardown does, checked within this test (tests run in any order, on any worker)."""
    with registered_toy():
        assert NAME in hf_efficient.list_attention_types()
    assert NAME not in hf_efficient.list_attention_types()
    with pytest.raises(ValueError, match="Unknown attention_type"):
        hf_efficient.get_attention_class(NAME)
