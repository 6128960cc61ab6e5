"""The whole-training-step benchmark: its FLOP count, its per-component breakdown and its report."""

import json
import types

import pytest
import torch

from benchmarks import breakdown, model_step, step_models
from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM
from hf_efficient.attention import get_attention_class

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
    point = types.SimpleNamespace(type="full_sdpa", encoder="text")
    counted = step_models.step_flops(model, batch, point, {})
    D, inner, n, layers, vocab = 32, 64, 64, 2, 512
    assert counted[breakdown.PROJECTIONS] == 3 * layers * 4 * 2 * n * D * D
    assert counted[breakdown.FEED_FORWARD] == 3 * layers * 2 * 2 * n * D * inner
    assert counted[breakdown.CORE] == 3 * layers * 4 * n * n * D  # QK^T and PV over both heads
    assert counted[breakdown.HEAD] == 3 * 2 * 5 * D * (D + vocab)  # the 5 masked positions
    config.sparse_prediction = False  # BERT's head scores every position
    assert step_models.step_flops(model, batch, point, {})[breakdown.HEAD] == 3 * 2 * n * D * (D + vocab)


def point_of(encoder: str, attention_type: str, length: int) -> types.SimpleNamespace:
    sizes = json.dumps(SIZES)
    return types.SimpleNamespace(
        encoder=encoder,
        type=attention_type,
        config=None,
        model=sizes,
        batch=1,
        length=length,
        hidden_dropout=0.0,
    )


def test_vision_step_flops_count_patch_embedding_encoder_on_cls_and_patches_and_head():
    point = point_of("vision", "full_sdpa", 16)  # a 16 x 16 image of 4 x 4 patches
    model, batch, _ = step_models.model_and_batch(point)
    assert batch["pixel_values"].shape == (1, 3, 16, 16)
    counted = step_models.step_flops(model, batch, point, {})
    D, inner, layers, tokens = 32, 64, 2, 17  # [CLS] + 16 patches
    assert counted[breakdown.EMBEDDINGS] == 3 * 2 * 16 * (3 * 4 * 4) * D
    assert counted[breakdown.PROJECTIONS] == 3 * layers * 4 * 2 * tokens * D * D
    assert counted[breakdown.FEED_FORWARD] == 3 * layers * 2 * 2 * tokens * D * inner
    assert counted[breakdown.CORE] == 3 * layers * 4 * tokens * tokens * D
    assert counted[breakdown.HEAD] == 3 * 2 * D * step_models.NUM_CLASSES
    model(**batch).loss.backward()  # the batch trains the model


def test_graph_step_flops_count_the_attended_edges():
    point = point_of("graph", "graph_sparse", 50)
    model, batch, (_, _, config) = step_models.model_and_batch(point)
    attended = batch["edge_index"].shape[1]
    assert attended >= 50 * step_models.EDGES_PER_NODE  # the random in-edges, plus self loops where missing
    counted = step_models.step_flops(model, batch, point, config)
    per_head = get_attention_class("graph_sparse").forward_flops(50, 16, None, num_edges=attended)
    assert counted[breakdown.CORE] == pytest.approx(3 * 2 * 2 * per_head)  # backward x layers x heads
    assert counted[breakdown.PROJECTIONS] == 3 * 2 * 4 * 2 * 50 * 32 * 32
    assert counted[breakdown.EMBEDDINGS] == 3 * 2 * 50 * step_models.GRAPH_FEATURES * 32
    model(**batch).loss.backward()


def test_encoder_settings_that_do_not_apply_are_refused():
    with pytest.raises(ValueError, match="perfect square, e.g. 9 or 16"):
        step_models.model_and_batch(point_of("vision", "full_sdpa", 10))
    with pytest.raises(ValueError, match="sparse_prediction is a setting of the text model's MLM head"):
        step_models.model_and_batch(point_of("graph", "graph_sparse", 20), sparse_prediction=False)


def test_head_variants_for_other_encoders_are_refused_before_any_point_runs(tmp_path, capsys):
    arguments = ["--encoder", "vision", "--variants", "default", "dense_head", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        model_step.main(arguments)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--variants dense_head set the text model's MLM head" in error
    assert "--encoder text" in error and not list(tmp_path.iterdir())


def test_speedup_bound_puts_the_core_at_the_sgemm_peak_and_keeps_the_rest():
    shares = dict.fromkeys(breakdown.COMPONENTS, 0.0) | {breakdown.CORE: 250.0, breakdown.FEED_FORWARD: 750.0}
    record = {"median_s": 2.0, "breakdown_ms": shares, "flops_by_component": {breakdown.CORE: 100e9}}
    baseline, sgemm = {"status": "ok", "median_s": 8.0}, {"gflops": 100.0}
    # The rest: 75% of 2 s; the core's 100 GFLOP at 100 GFLOP/s: 1 s; 8 s / 2.5 s.
    assert model_step.speedup_bound(record, baseline, sgemm) == pytest.approx(3.2)
    assert model_step.speedup_bound(record, None, sgemm) is None
    assert model_step.speedup_bound(record, baseline, None) is None
    no_core_model = dict(record, flops_by_component={breakdown.CORE: None})
    assert model_step.speedup_bound(no_core_model, baseline, sgemm) is None


def test_model_step_benchmark_smoke(tmp_path):
    """The CLI in process (``--in_process``: the allocator variant's setting is then not applied; the
    attention benchmark's worker path, which model_step shares, is test_plugins.py's)."""
    options = ["--preset", "smoke", "--threads", "1", "--lengths", "48", "--in_process"]
    model_step.main(
        [*options, "--variants", "default", "dense_head", "lean_allocator", "--out", str(tmp_path)]
    )
    results = json.loads((tmp_path / "results.json").read_text())
    records = results["records"]
    assert {r["status"] for r in records} == {"ok"}, records
    variants = ["default", "dense_head", "lean_allocator"]
    # A type's variants run next to each other, so a drifting machine moves them together.
    assert [(r["type"], r["variant"]) for r in records] == [
        (t, v) for t in ("full_sdpa", "linear") for v in variants
    ]
    assert results["meta"]["sgemm"]["gflops"] > 0 and results["meta"]["bandwidth"]["copy_gbps"] > 0
    for r in records:
        assert 0 < r["mfu"] <= 1 and r["tokens_per_s"] == pytest.approx(48 / r["median_s"])
        # The counted aten ops' matrix FLOPs agree with the step's FLOP model (torch counts sdpa's backward
        # as 5 products where the model's 3 x forward counts 4: a little more, never less).
        assert 0.99 < r["roofline"]["flops"] / r["model_flops"] < 1.3, (r["type"], r["variant"])
        assert r["roofline_mfu"] == pytest.approx(r["mfu"] / r["roofline_fraction"])
        assert r["model_flops"] == pytest.approx(sum(r["flops_by_component"].values()))
        assert sum(r["breakdown_ms"].values()) == pytest.approx(r["profiled_wall_ms"], rel=0.1)
        assert r["breakdown_ms"][breakdown.OPTIMIZER] > 0 and r["loss"] > 0
    heads = {r["variant"]: r["flops_by_component"][breakdown.HEAD] for r in records if r["type"] == "linear"}
    assert heads["dense_head"] > 2 * heads["default"]  # the default head scores the masked 15% only
    summary = (tmp_path / "summary.md").read_text()
    assert "| full_sdpa | default |" in summary and "(x1.00)" in summary and "optimizer step" in summary
    assert "roofline of the step's aten ops" in summary and "x at most" in summary
    for name in ("throughput.png", "mfu.png", "memory.png", "breakdown.png", "roofline.png"):
        assert (tmp_path / name).stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize("encoder", ["vision", "graph"])
def test_model_step_benchmark_smoke_for_vision_and_graph(tmp_path, encoder):
    """The CLI's --encoder vision / graph end to end: slow (make test; about 5 CPU-seconds quiet), a second
    layer over the fast loop's text smoke (the same main(), sweep, report and plots) and its vision and graph
    step builders, which test_vision_step_flops_* and test_graph_step_flops_* build, count and train."""
    options = ["--encoder", encoder, "--preset", "smoke", "--threads", "1", "--sgemm_size", "0"]
    model_step.main([*options, "--in_process", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    records = results["records"]
    assert {r["status"] for r in records} == {"ok"}, records
    assert results["meta"]["encoder"] == encoder and {r["encoder"] for r in records} == {encoder}
    assert {r["type"] for r in records} == set(model_step.PRESETS["smoke"]["points"][encoder][0])
    for r in records:
        assert r["length"] == 64 and r["tokens_per_s"] == pytest.approx(64 / r["median_s"])
        assert r["breakdown_ms"][breakdown.CORE] > 0 and r["breakdown_ms"][breakdown.OPTIMIZER] > 0
        assert r["flops_by_component"][breakdown.EMBEDDINGS] > 0  # the patch embedding / node encoder
    unit = {"vision": "patches", "graph": "nodes"}[encoder]
    assert f"{unit}/s" in (tmp_path / "summary.md").read_text()
