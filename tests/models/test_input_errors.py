"""Bad input to every model and head stops at the model's entry with a ValueError that names the argument
and the value found (never an IndexError inside an embedding, a batch-size mismatch inside a loss or a NaN),
and the degenerate inputs real data produces (a row with no real token, a batch without any target, MAE's
mask ratio at its limits, a graph with no real node) give finite, correctly shaped results for every type.

The per-type checks of padded rows run for every registered type from the encoders' checks.py; here each
error case runs once, through the public API.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hf_efficient
from hf_efficient import (
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertModel,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    EfficientViTForImageClassification,
    EfficientViTMAEForPreTraining,
    GraphCollator,
)
from hf_efficient.modeling.checks import check_float_input, check_ids

from .graph import checks as graph_checks
from .graph.helpers import attention_type_config, base_records
from .graph.helpers import tiny_config as graph_config
from .text import checks as text_checks
from .text.helpers import MAX_POS, VOCAB, batch
from .text.helpers import tiny_config as text_config
from .vision.helpers import images, mae_noise
from .vision.helpers import tiny_config as vision_config

IDS, MASK = batch()  # (3, 20) ids in [5, 99), rows of 20, 13 and 7 real tokens

# ---------------------------------------------------------------------------------------------------------
# Text: ids, token types, positions, embeddings, shapes, labels of every head
# ---------------------------------------------------------------------------------------------------------

TEXT_INPUT_CASES = {
    "ids past the vocabulary": (
        dict(input_ids=IDS + VOCAB),
        r"input_ids holds ids in \[104, 197\].*vocab_size=99",
    ),
    "negative ids": (dict(input_ids=IDS - 50), r"input_ids holds ids in \[-45, 48\].*rows \[0, 99\)"),
    "float ids": (dict(input_ids=IDS.float()), r"input_ids must hold integer ids .*got dtype torch.float32"),
    "one sequence without a batch dim": (
        dict(input_ids=IDS[0]),
        r"input_ids must have shape \(batch, seq\), got \(20,\)",
    ),
    "empty batch": (dict(input_ids=IDS[:0], attention_mask=MASK[:0]), r"input_ids has shape \(0, 20\)"),
    "zero-length sequences": (
        dict(input_ids=IDS[:, :0], attention_mask=MASK[:, :0]),
        r"input_ids has shape \(3, 0\)",
    ),
    "token type past type_vocab_size": (
        dict(token_type_ids=torch.full_like(IDS, 2)),
        r"token_type_ids holds ids in \[2, 2\].*type_vocab_size=2",
    ),
    "token types of another shape": (
        dict(token_type_ids=torch.zeros(3, 5, dtype=torch.long)),
        r"token_type_ids must have shape .* = \(3, 20\), got \(3, 5\)",
    ),
    "positions past max_position_embeddings": (
        dict(position_ids=torch.arange(20)[None] + 60),
        rf"position_ids holds ids in \[60, 79\].*max_position_embeddings={MAX_POS}.*resize_position_emb",
    ),
    "mask of another shape": (
        dict(attention_mask=MASK[:, :5]),
        r"attention_mask must be a \(batch, seq\) = \(3, 20\)",
    ),
    "additive mask": (
        dict(attention_mask=(1.0 - MASK.float()) * -1e4),
        r"attention_mask must hold only 0/1.*additive mask",
    ),
    "NaN embeddings": (
        dict(input_ids=None, inputs_embeds=torch.full((1, 4, 32), float("nan"))),
        r"inputs_embeds holds 128 NaN or infinite value",
    ),
    "embeddings of another width": (
        dict(input_ids=None, inputs_embeds=torch.randn(1, 4, 16)),
        r"inputs_embeds must have hidden_size=32 features per token, got shape \(1, 4, 16\)",
    ),
    "longer than max_position_embeddings": (
        dict(input_ids=torch.randint(5, VOCAB, (1, MAX_POS + 1)), attention_mask=None),
        rf"{MAX_POS + 1} tokens but max_position_embeddings={MAX_POS}.*resize_position_embeddings",
    ),
}


@pytest.mark.parametrize("case", list(TEXT_INPUT_CASES))
def test_text_inputs(case):
    changes, message = TEXT_INPUT_CASES[case]
    model = EfficientBertModel(text_config()).eval()
    with pytest.raises(ValueError, match=message):
        model(**{"input_ids": IDS, "attention_mask": MASK, **changes})


MLM_LABEL_CASES = {
    "flattened labels": (
        IDS.reshape(-1),
        r"labels must have shape \(batch, seq\) of the inputs = \(3, 20\), got \(60,\)",
    ),
    "labels of another length": (IDS[:, :10], r"labels must have shape .* = \(3, 20\), got \(3, 10\)"),
    "token ids past the vocabulary": (IDS + VOCAB, r"labels hold ids in \[104, 197\] but vocab_size=99"),
    "float labels": (IDS.float(), r"labels must be integer class ids .*torch.float32"),
}


@pytest.mark.parametrize("sparse_prediction", [False, True])
@pytest.mark.parametrize("case", list(MLM_LABEL_CASES))
def test_masked_lm_labels(case, sparse_prediction):
    labels, message = MLM_LABEL_CASES[case]
    model = EfficientBertForMaskedLM(text_config(sparse_prediction=sparse_prediction)).eval()
    with pytest.raises(ValueError, match=message):
        model(IDS, attention_mask=MASK, labels=labels)


SEQUENCE_LABEL_CASES = {
    "a label per token": (3, None, IDS % 3, r"labels must have shape \(batch,\) = \(3,\), got \(3, 20\)"),
    "one label too many": (3, None, torch.tensor([0, 1, 2, 1]), r"shape \(batch,\) = \(3,\), got \(4,\)"),
    "class id past num_labels": (3, None, torch.tensor([0, 1, 5]), r"ids in \[0, 5\] but num_labels=3"),
    "negative class id": (3, None, torch.tensor([0, 1, -1]), r"ids in \[-1, 1\] but num_labels=3"),
    "regression targets of another count": (
        1,
        None,
        torch.ones(4),
        r"shape .* = \(3,\) or \(3, 1\), got \(4,\)",
    ),
    "NaN regression target": (1, None, torch.tensor([1.0, float("nan"), 2.0]), r"1 NaN or infinite target"),
    "multi-label of another width": (
        3,
        "multi_label_classification",
        torch.ones(3, 2),
        r"labels must have shape \(batch, num_labels\) = \(3, 3\), got \(3, 2\)",
    ),
    "float class ids": (
        3,
        "single_label_classification",
        torch.zeros(3),
        r"integer class ids .*torch.float32",
    ),
}


@pytest.mark.parametrize("case", list(SEQUENCE_LABEL_CASES))
def test_sequence_classification_labels(case):
    num_labels, problem_type, labels, message = SEQUENCE_LABEL_CASES[case]
    config = text_config(num_labels=num_labels, problem_type=problem_type)
    model = EfficientBertForSequenceClassification(config).eval()
    with pytest.raises(ValueError, match=message):
        model(IDS, attention_mask=MASK, labels=labels)
    assert model.config.problem_type == problem_type  # a refused batch does not fix the problem type


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (torch.zeros(3, dtype=torch.long), r"labels must have shape \(batch, seq\) = \(3, 20\), got \(3,\)"),
        (torch.full_like(IDS, 7), r"labels hold ids in \[7, 7\] but num_labels=3"),
        (torch.zeros(3, 20), r"labels must be integer class ids .*torch.float32"),
    ],
)
def test_token_classification_labels(labels, message):
    model = EfficientBertForTokenClassification(text_config(num_labels=3)).eval()
    with pytest.raises(ValueError, match=message):
        model(IDS, attention_mask=MASK, labels=labels)


def test_losses_without_any_target_are_zero_with_zero_gradients():
    """Every label -100 (an MLM batch in which nothing was masked; a batch of padding): loss 0, not NaN, and
    a backward pass leaves finite (zero) gradients, so the optimizer state is not poisoned."""
    for model, labels in [
        (EfficientBertForMaskedLM(text_config()), torch.full_like(IDS, -100)),
        (EfficientBertForMaskedLM(text_config(sparse_prediction=True)), torch.full_like(IDS, -100)),
        (EfficientBertForSequenceClassification(text_config(num_labels=3)), torch.full((3,), -100)),
        (EfficientBertForTokenClassification(text_config(num_labels=3)), torch.full_like(IDS, -100)),
    ]:
        loss = model(IDS, attention_mask=MASK, labels=labels).loss
        loss.backward()
        assert loss.item() == 0.0
        assert all(
            torch.isfinite(p.grad).all() and not p.grad.any()
            for p in model.parameters()
            if p.grad is not None
        )


def test_all_padded_batch_gives_finite_outputs():
    """Every row without a real token: finite hidden states and pooled outputs, for every text type."""
    for attention_type in hf_efficient.list_attention_types("text"):
        out = EfficientBertModel(text_config(attention_type)).eval()(
            IDS, attention_mask=torch.zeros_like(MASK)
        )
        assert torch.isfinite(out.last_hidden_state).all() and torch.isfinite(out.pooler_output).all(), (
            attention_type
        )


@pytest.mark.parametrize("attention_type", ["full", "longformer", "performer"])
def test_fully_padded_row_in_every_text_head(attention_type):
    # every type: tests/models/text/test_modeling.py through checks.check_text_encoder
    text_checks.check_fully_padded_row(attention_type)


# ---------------------------------------------------------------------------------------------------------
# Vision: pixels, MAE's masking
# ---------------------------------------------------------------------------------------------------------

PIXELS = images()  # (2, 3, 16, 16)
VISION_CASES = {
    "raw 0-255 bytes": (
        (PIXELS * 50 + 128).clamp(0, 255).to(torch.uint8),
        r"pixel_values must be a floating tensor, got dtype torch.uint8.*image processor",
    ),
    "NaN pixels": (torch.full_like(PIXELS, float("nan")), r"pixel_values holds 1536 NaN or infinite value"),
    "an empty batch": (PIXELS[:0], r"pixel_values has shape \(0, 3, 16, 16\)"),
    "images of no pixels": (torch.randn(2, 3, 0, 0), r"pixel_values has shape \(2, 3, 0, 0\)"),
    "one image without a batch dim": (
        PIXELS[0],
        r"pixel_values must have shape \(batch, num_channels=3, height, width\), got \(3, 16, 16\)",
    ),
    "grey images for an RGB model": (images(channels=1), r"num_channels=3.*got \(2, 1, 16, 16\)"),
    "another image size": (
        images(size=20),
        r"image size \(20, 20\) does not match the model's 16x16.*interpolate_pos_encoding",
    ),
    "a size that is no multiple of the patch": (
        images(size=18),
        r"image size 18x18 is not a multiple of patch_size=4",
    ),
}


@pytest.mark.parametrize("model_class", [EfficientViTForImageClassification, EfficientViTMAEForPreTraining])
@pytest.mark.parametrize("case", list(VISION_CASES))
def test_vision_inputs(case, model_class):
    pixels, message = VISION_CASES[case]
    model = model_class(vision_config(num_labels=3)).eval()
    with pytest.raises(ValueError, match=message):
        model(pixels)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (torch.zeros(2, 5, dtype=torch.long), r"labels must have shape \(batch,\) = \(2,\), got \(2, 5\)"),
        (torch.tensor([0, 7]), r"labels hold ids in \[0, 7\] but num_labels=3"),
    ],
)
def test_image_classification_labels(labels, message):
    model = EfficientViTForImageClassification(vision_config(num_labels=3)).eval()
    with pytest.raises(ValueError, match=message):
        model(PIXELS, labels=labels)


def test_labels_for_a_model_without_classifier():
    model = EfficientViTForImageClassification(vision_config(num_labels=0)).eval()
    assert model(PIXELS).logits.shape == (2, 32)  # the [CLS] features
    with pytest.raises(ValueError, match=r"num_labels=0 builds no classifier .*labels cannot be scored"):
        model(PIXELS, labels=torch.tensor([0, 1]))


def test_mae_mask_ratio_limits():
    """16 patches: 0.9375 = 1 - 1/16 keeps one patch, any higher ratio keeps none and is refused when the
    model is built; 0 masks nothing and the loss is 0 (nothing to reconstruct), never NaN."""
    for ratio, kept in [(0.0, 16), (0.5, 8), (0.9, 1), (0.9375, 1)]:
        model = EfficientViTMAEForPreTraining(vision_config(mask_ratio=ratio)).eval()
        out = model(PIXELS, noise=mae_noise())
        assert int((out.mask == 0).sum(-1)[0]) == kept and torch.isfinite(out.loss)
        assert (out.loss == 0) == (ratio == 0.0)
    for ratio in (0.95, 0.99):
        with pytest.raises(
            ValueError, match=rf"mask_ratio={ratio} keeps int\(16 \* \(1 - {ratio}\)\) = 0 of 16.*<= 1 - 1/16"
        ):
            EfficientViTMAEForPreTraining(vision_config(mask_ratio=ratio))
    model = EfficientViTMAEForPreTraining(vision_config(mask_ratio=0.9)).eval()
    with pytest.raises(ValueError, match=r"keeps int\(4 \* \(1 - 0.9\)\) = 0 of 4 patches"):
        model(images(size=8), interpolate_pos_encoding=True)  # a 2x2 grid: no patch left at this ratio
    with pytest.raises(ValueError, match=r"noise holds NaN or infinite values"):
        model(PIXELS, noise=torch.full((2, 16), float("nan")))


# ---------------------------------------------------------------------------------------------------------
# Graphs: edges in every path (edge attention, Graphormer's bias, dense), features, heads
# ---------------------------------------------------------------------------------------------------------

GRAPH_PATHS = {
    "edge attention": dict(attention_type="graph_sparse", attention_config={"edge_dim": 2}, edge_dim=2),
    "graphormer bias": dict(attention_type="full", graph_bias="graphormer", edge_dim=2),
    "gps": dict(attention_type="performer", graph_layer_type="gps", attention_config={"num_features": 8}),
    "dense": dict(attention_type="linear", max_degree=8),
}


def _graph_batch(config) -> dict:
    batch = GraphCollator.for_config(config)(base_records())
    batch.pop("labels")
    return batch


def _with_edge(batch: dict, source: int, target: int) -> dict:
    """The batch with one more edge (and a feature row for it when the batch has edge features)."""
    changed = {**batch, "edge_index": torch.cat([batch["edge_index"], torch.tensor([[source], [target]])], 1)}
    if "edge_attr" in batch:
        changed["edge_attr"] = torch.cat([batch["edge_attr"], torch.zeros(1, batch["edge_attr"].shape[1])])
    return changed


GRAPH_EDGE_CASES = {
    # a negative position would silently wrap around to the last node in any indexing path
    "a negative node position": (
        lambda b: _with_edge(b, -1, 0),
        r"edge_index holds node positions in \[-1, \d+\] but the padded batch has only batch \* seq = 21",
    ),
    "a position past the batch": (
        lambda b: _with_edge(b, 0, 21),
        r"node positions in \[0, 21\].* = 21 positions",
    ),
    "an edge between two graphs": (
        lambda b: _with_edge(b, 0, 8),
        r"some edges join nodes of different graphs",
    ),
    "an edge to a padded node": (lambda b: _with_edge(b, 14, 20), r"some edges touch padded node positions"),
    "float edge ids": (
        lambda b: {**b, "edge_index": b["edge_index"].float()},
        r"edge_index must be an integer tensor of shape \(2, E\)",
    ),
}


@pytest.mark.parametrize("path", list(GRAPH_PATHS))
@pytest.mark.parametrize("case", list(GRAPH_EDGE_CASES))
def test_graph_edges_are_validated_in_every_path(case, path):
    config = graph_config(**GRAPH_PATHS[path])
    edit, message = GRAPH_EDGE_CASES[case]
    model = EfficientGraphForGraphClassification(config).eval()
    with pytest.raises(ValueError, match=message):
        model(**edit(_graph_batch(config)))


@pytest.mark.parametrize("path", ["edge attention", "graphormer bias"])
@pytest.mark.parametrize("extra_rows", [-3, 3])
def test_graph_edge_features_must_match_the_edges(path, extra_rows):
    config = graph_config(**GRAPH_PATHS[path])
    batch = _graph_batch(config)
    attr = batch["edge_attr"]
    attr = attr[:extra_rows] if extra_rows < 0 else torch.cat([attr, torch.zeros(extra_rows, 2)])
    model = EfficientGraphForGraphClassification(config).eval()
    message = (
        rf"edge_attr must have shape \(E, F\) with one row per edge, E = 36, got \({36 + extra_rows}, 2\)"
    )
    with pytest.raises(ValueError, match=message):
        model(**{**batch, "edge_attr": attr})


GRAPH_FEATURE_CASES = {
    "NaN node features": (
        dict(),
        lambda b: {**b, "node_feat": torch.full_like(b["node_feat"], float("nan"))},
        r"node_feat holds 63 NaN",
    ),
    "no node at all": (
        dict(),
        lambda b: {"node_feat": torch.zeros(3, 0, 3), "edge_index": torch.zeros(2, 0, dtype=torch.long)},
        r"node_feat has shape \(3, 0, 3\)",
    ),
    "a node mask of another shape": (
        dict(),
        lambda b: {**b, "node_mask": b["node_mask"][:, :4]},
        r"node_mask must have shape .* = \(3, 7\), got \(3, 4\)",
    ),
    "categories past node_vocab_size": (
        dict(node_vocab_size=5),
        lambda b: {**b, "node_feat": torch.full(b["node_feat"].shape, 7)},
        r"node_feat holds ids in \[7, 7\] but the node_vocab_size=5",
    ),
    "degrees of another shape": (
        dict(max_degree=8),
        lambda b: {**b, "in_degree": b["in_degree"][:, :3]},
        r"in_degree must have shape .* = \(3, 7\), got \(3, 3\)",
    ),
    "float shortest paths": (
        dict(attention_type="full", graph_bias="graphormer"),
        lambda b: {**b, "spatial_pos": b["spatial_pos"].float()},
        r"spatial_pos must hold integers .*torch.float32",
    ),
    "positional encodings of another width": (
        dict(rw_pe_dim=4),
        lambda b: {**b, "rw_pe": b["rw_pe"][..., :2]},
        r"rw_pe must have shape .* = \(3, 7, 4\), got \(3, 7, 2\)",
    ),
    "NaN positional encodings": (
        dict(lap_pe_dim=3),
        lambda b: {**b, "lap_pe": torch.full_like(b["lap_pe"], float("inf"))},
        r"lap_pe holds 63 NaN or infinite",
    ),
}


@pytest.mark.parametrize("case", list(GRAPH_FEATURE_CASES))
def test_graph_features(case):
    overrides, edit, message = GRAPH_FEATURE_CASES[case]
    config = graph_config(**{"attention_type": "graph_sparse", **overrides})
    model = EfficientGraphForGraphClassification(config).eval()
    with pytest.raises(ValueError, match=message):
        model(**edit(_graph_batch(config)))


@pytest.mark.parametrize(
    ("model_class", "labels", "message"),
    [
        (
            EfficientGraphForGraphClassification,
            torch.zeros(3, 4, dtype=torch.long),
            r"labels must have shape \(batch,\) = \(3,\), got \(3, 4\)",
        ),
        (
            EfficientGraphForGraphClassification,
            torch.tensor([0, 1, 2]),
            r"labels hold ids in \[0, 2\] but num_labels=2",
        ),
        (
            EfficientGraphForNodeClassification,
            torch.zeros(3, dtype=torch.long),
            r"labels must have shape \(batch, nodes\) = \(3, 7\).*got \(3,\)",
        ),
        (
            EfficientGraphForNodeClassification,
            torch.full((3, 7), 5),
            r"labels hold ids in \[5, 5\] but num_labels=2",
        ),
    ],
)
def test_graph_head_labels(model_class, labels, message):
    config = graph_config(attention_type="graph_sparse")
    model = model_class(config).eval()
    with pytest.raises(ValueError, match=message):
        model(**_graph_batch(config), labels=labels)


@pytest.mark.parametrize("graph_layer_type", ["transformer", "gps"])
@pytest.mark.parametrize("attention_type", ["graph_sparse", "full", "performer"])
def test_graph_without_real_nodes(attention_type, graph_layer_type):
    # every type: tests/models/graph/test_modeling.py through checks.check_graph_encoder
    graph_checks.check_graph_without_real_nodes(attention_type_config(attention_type, graph_layer_type))


# ---------------------------------------------------------------------------------------------------------
# The checks that read values are skipped while torch.export / torch.compile trace
# ---------------------------------------------------------------------------------------------------------


class _Checked(nn.Module):
    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        check_ids("model", "ids", ids, 10, "table", "fix")
        check_float_input("model", "x", x, "fix")
        return x * 2


def test_value_checks_run_in_eager_mode_and_trace_away_in_export():
    with pytest.raises(ValueError, match=r"ids holds ids in \[11, 11\]"):
        _Checked()(torch.tensor([11]), torch.ones(2))
    program = torch.export.export(
        _Checked(), (torch.tensor([1, 2]), torch.ones(2))
    )  # no data-dependent guard
    torch.testing.assert_close(program.module()(torch.tensor([11, 12]), torch.ones(2)), torch.full((2,), 2.0))
