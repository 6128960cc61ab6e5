"""``--plugin``: a mechanism registered outside the package goes through the attention benchmark like ours."""

import json
import sys

import pytest

from benchmarks.mechanisms import benchmark_types
from benchmarks.plugins import load_plugin
from hf_efficient.attention import ATTENTION_REGISTRY, unregister_attention

from .cli import run_module

TOY_NAME = "toy_mean_attention"
TOY_PLUGIN = f'''
"""A toy mechanism for the benchmark's --plugin test: every query gets the mean of the real values."""

import torch

from hf_efficient.attention import AttentionCapabilities, AttentionCore, AttentionOutput, register_attention


@register_attention("{TOY_NAME}")
class ToyMeanAttention(AttentionCore):
    paper = "none (a test)"
    cost = "O(n)"
    summary = "the mean of the values over the real keys"
    capabilities = AttentionCapabilities(permutation_equivariant=True)

    def _attend(self, query, key, value, inputs):
        mask = inputs.attention_mask  # (b, n) bool or None
        weights = value.new_ones(value.shape[:3] + (1,)) if mask is None else mask[:, None, :, None].to(value)
        mean = (value * weights).sum(2, keepdim=True) / weights.sum(2, keepdim=True)  # (b, h, 1, d)
        return AttentionOutput(mean.expand_as(value), None)
'''


@pytest.fixture
def toy_plugin(tmp_path):
    path = tmp_path / "toy_mean_plugin.py"
    path.write_text(TOY_PLUGIN)
    return path


def test_plugin_types_join_the_registry_lists(toy_plugin):
    assert TOY_NAME not in ATTENTION_REGISTRY
    module = load_plugin(str(toy_plugin))
    try:
        assert TOY_NAME in benchmark_types() and TOY_NAME in benchmark_types("text")
        assert load_plugin(str(toy_plugin)) is module  # by path twice: imported (and registered) once
    finally:
        unregister_attention(TOY_NAME)
        del sys.modules[module.__name__]
    assert TOY_NAME not in ATTENTION_REGISTRY


@pytest.mark.slow  # the CLI and its workers, each a fresh interpreter
def test_attention_benchmark_runs_a_plugin_mechanism(toy_plugin, tmp_path):
    """The attention benchmark as its docs run it, with its workers (the suite's other smoke runs are in
    process): the plugin is imported in each worker, and the allocator setting reaches the points and the
    bandwidth test. The plugin's type beside exact attention (whose row of the FLOP table the plugin's
    joins), at one length (test_benchmarks.py runs the CLI at two lengths in process)."""
    out = tmp_path / "out"
    options = ["--preset", "smoke", "--threads", "1", "--types", TOY_NAME, "full_sdpa", "--lengths", "32"]
    options += ["--allocator", "keep"]
    run_module("attention", *options, "--plugin", str(toy_plugin), "--out", str(out))
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["allocator"] == "keep"  # every point and the bandwidth test kept freed memory
    assert results["meta"]["bandwidth"]["copy_gbps"] > 0 and results["meta"]["sgemm"]["gflops"] > 0
    assert not any("in_process" in r for r in results["records"])
    toy = [r for r in results["records"] if r["type"] == TOY_NAME]
    assert len(toy) == 1 and toy[0]["status"] == "ok" and toy[0]["median_s"] > 0  # measured in a worker
    assert toy[0]["flops"] is None  # no FLOP model: null, not a failure
    assert 0 < toy[0]["rel_error"] < 2  # compared with exact attention like every approximation
    assert results["meta"]["plugins"] == [str(toy_plugin)]
    summary = (out / "summary.md").read_text()
    assert f"| {TOY_NAME} |" in summary and "none (null)" in summary
    assert TOY_NAME not in ATTENTION_REGISTRY  # registered in the benchmark's processes only
