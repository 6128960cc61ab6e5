"""The whole-training-step benchmark: its FLOP count, its per-component breakdown and its report."""

import json

import pytest
import torch

from benchmarks import breakdown, model_step
from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM

from .cli import run_module

SIZES = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=512)


def test_components_of_a_text_model():
    """Every module that opens a scope gets the component its name and class say; a core's own modules
    (Linformer's projections) stay inside the core."""
    model = EfficientBertForMaskedLM(EfficientBertConfig(**SIZES, attention_type="linformer"))
    labels = {}
    for label, module in breakdown.component_modules(model):
        name = next(n for n, m in model.named_modules() if m is module)
        labels[name] = label
    layer = "bert.encoder.layer.0."
    assert labels[""] == breakdown.HEAD and labels["bert"] == breakdown.OTHER
    assert labels["bert.embeddings"] == breakdown.EMBEDDINGS
    assert labels[layer + "attention.self"] == labels[layer + "attention.self.query"] == breakdown.PROJECTIONS
    assert labels[layer + "attention.output.dense"] == breakdown.PROJECTIONS
    assert labels[layer + "attention.self.core"] == breakdown.CORE
    assert labels[layer + "intermediate.dense"] == labels[layer + "output.dense"] == breakdown.FEED_FORWARD
    assert labels[layer + "output.LayerNorm"] == labels[layer + "output.dropout"] == breakdown.ELEMENTWISE
    assert not any(name.startswith(layer + "attention.self.core.") for name in labels)
    assert "cls.predictions.decoder" not in labels  # the head's modules: the model's own scope


def test_profiled_step_attributes_forward_and_backward():
    """Each component's forward and backward land in it: the core's time grows when the core does more
    work, the optimizer's scope is counted, and the components add up to the profiled step."""
    torch.manual_seed(0)
    model = EfficientBertForMaskedLM(EfficientBertConfig(**SIZES, max_position_embeddings=256)).train()
    ids = torch.randint(5, 512, (1, 256))
    optimizer = torch.optim.AdamW(model.parameters())

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        with breakdown.scope(breakdown.OPTIMIZER):
            optimizer.step()
            optimizer.zero_grad()

    ms, wall_ms = breakdown.profile_step(model, step)
    assert set(ms) == set(breakdown.COMPONENTS)
    for component in (breakdown.PROJECTIONS, breakdown.CORE, breakdown.FEED_FORWARD, breakdown.HEAD):
        assert ms[component] > 0, component
    assert ms[breakdown.OPTIMIZER] > 0
    assert sum(ms.values()) == pytest.approx(wall_ms, rel=0.1)


def test_step_flops_count_every_linear_map_the_core_and_the_scored_head():
    config = EfficientBertConfig(**SIZES, max_position_embeddings=64, attention_type="full")
    model = EfficientBertForMaskedLM(config)
    labels = torch.full((1, 64), -100)
    labels[0, :5] = 7
    batch = {"input_ids": torch.ones(1, 64, dtype=torch.long), "labels": labels}
    point = type("Point", (), {"type": "full_sdpa"})()
    counted = model_step.mlm_step_flops(model, batch, point, {})
    D, inner, n, layers, vocab = 32, 64, 64, 2, 512
    assert counted[breakdown.PROJECTIONS] == 3 * layers * 4 * 2 * n * D * D
    assert counted[breakdown.FEED_FORWARD] == 3 * layers * 2 * 2 * n * D * inner
    assert counted[breakdown.CORE] == 3 * layers * 4 * n * n * D  # QK^T and PV over both heads
    assert counted[breakdown.HEAD] == 3 * 2 * 5 * D * (D + vocab)  # the 5 masked positions
    config.sparse_prediction = False  # BERT's head scores every position
    assert model_step.mlm_step_flops(model, batch, point, {})[breakdown.HEAD] == 3 * 2 * n * D * (D + vocab)


@pytest.mark.slow  # a subprocess per point and the sgemm peak (about 40 s)
def test_model_step_benchmark_smoke(tmp_path):
    options = [
        "--preset",
        "smoke",
        "--threads",
        "1",
        "--lengths",
        "48",
        "--variants",
        "default",
        "dense_head",
    ]
    run_module("model_step", *options, "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    records = results["records"]
    assert {r["status"] for r in records} == {"ok"}, records
    assert sorted((r["type"], r["variant"]) for r in records) == [
        ("full_sdpa", "default"),
        ("full_sdpa", "dense_head"),
        ("linear", "default"),
        ("linear", "dense_head"),
    ]
    assert results["meta"]["sgemm"]["gflops"] > 0
    for r in records:
        assert 0 < r["mfu"] <= 1 and r["tokens_per_s"] == pytest.approx(48 / r["median_s"])
        assert r["model_flops"] == pytest.approx(sum(r["flops_by_component"].values()))
        assert sum(r["breakdown_ms"].values()) == pytest.approx(r["profiled_wall_ms"], rel=0.1)
        assert r["breakdown_ms"][breakdown.OPTIMIZER] > 0 and r["loss"] > 0
    heads = {r["variant"]: r["flops_by_component"][breakdown.HEAD] for r in records if r["type"] == "linear"}
    assert heads["dense_head"] > 2 * heads["default"]  # the default head scores the masked 15% only
    summary = (tmp_path / "summary.md").read_text()
    assert "| full_sdpa | default |" in summary and "(x1.00)" in summary and "optimizer step" in summary
    for name in ("throughput.png", "mfu.png", "memory.png", "breakdown.png"):
        assert (tmp_path / name).stat().st_size > 1000
