"""Adding a mechanism is one registered class: a toy core (exact softmax attention written by hand, 30 lines,
with a kernel of its own that computes the queries a chunk at a time, as in docs/contributing.md)
registered inside this test goes through the contract matrix, the kernel-against-reference checks and the
three encoders (export included),
shows in the attention table, and runs through the attention benchmark's smoke preset (in process; a
``--plugin`` through the benchmark's workers is tests/benchmarks/test_plugins.py's), with no other file
changed. The fixture unregisters
it, so the rest of the suite (which compares the registry with the docs' attention table and the config
files) never sees it."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

import hf_efficient
from benchmarks import attention as attention_benchmark
from hf_efficient.attention import (
    AttentionCapabilities,
    AttentionCore,
    AttentionOutput,
    Kernel,
    register_attention,
    unregister_attention,
)

from ..models.graph import checks as graph_checks
from ..models.graph.checks import check_graph_encoder
from ..models.text import checks as text_checks
from ..models.text.checks import check_text_encoder
from ..models.vision import checks as vision_checks
from ..models.vision.checks import check_vision_encoder
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


def test_the_toy_is_gone_after_its_registration_ends():
    """What the fixture's teardown does, checked within this test (tests run in any order, on any worker)."""
    with registered_toy():
        assert NAME in hf_efficient.list_attention_types()
    assert NAME not in hf_efficient.list_attention_types()
    with pytest.raises(ValueError, match="Unknown attention_type"):
        hf_efficient.get_attention_class(NAME)


def test_the_toy_runs_through_the_attention_benchmark(tmp_path):
    """The same class is measured by the attention benchmark's command line, in process (``--in_process``)
    and without the machine's limits (no roofline): its FLOP model and its error against exact attention."""
    out = tmp_path / "bench"
    options = ["--preset", "smoke", "--threads", "1", "--types", NAME, "--lengths", "32", "64"]
    options += ["--in_process", "--sgemm_size", "0", "--bandwidth_gib", "0", "--out", str(out)]
    with registered_toy():
        attention_benchmark.main(options)
    records = [r for r in json.loads((out / "results.json").read_text())["records"] if r["type"] == NAME]
    assert len(records) == 2 and all(r["status"] == "ok" and r["median_s"] > 0 for r in records)
    assert all(r["flops"] == 3 * 4.0 * r["length"] ** 2 * 16 * 2 for r in records)  # its FLOP model, fwd+bwd
    assert all(r["rel_error"] < 1e-5 for r in records)  # it is exact attention
    assert f"| {NAME} |" in (out / "summary.md").read_text()
