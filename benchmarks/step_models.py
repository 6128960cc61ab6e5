"""The model, batch and matrix FLOPs of one training-step point of ``benchmarks.model_step``, per encoder.

A point's ``length`` n is what grows with the input in each encoder:

==========  ==========================================================================================
text        n tokens: ``EfficientBertForMaskedLM`` on random token ids, ``MASK_PROBABILITY`` of them masked
vision      n patches (a perfect square): ``EfficientViTForImageClassification`` on one random image of
            sqrt(n) x sqrt(n) patches of ``PATCH`` pixels (n + 1 tokens with [CLS]), 10 classes
graph       n nodes: ``EfficientGraphForNodeClassification`` on one random graph with
            ``EDGES_PER_NODE`` random in-edges per node plus a self loop, a label per node
==========  ==========================================================================================

Every encoder takes the sizes of ``--model`` (layers, hidden size, heads, intermediate size; the text
model's vocabulary) and the attention type's benchmark settings. Matrix FLOPs of one forward, per
component of ``benchmarks.breakdown``: every linear map of the encoder (2 x rows x in x out), the core's
FLOP model (``benchmarks.flops``) times the layers, the input map (patch embedding; node encoder) and the
head on the positions it scores; forward + backward = ``flops.BACKWARD_FACTOR`` x forward.
"""

from __future__ import annotations

import argparse
import json
import math

from benchmarks import breakdown, flops
from benchmarks.mechanisms import build_model

ENCODERS = ("text", "vision", "graph")
PATCH = 4  # pixels per patch side: n = 16,384 patches is a 512 x 512 image
NUM_CLASSES = 10
EDGES_PER_NODE = 10
GRAPH_FEATURES = 16  # node feature width of the synthetic graphs
TEXT_ONLY_FIELDS = ("sparse_prediction",)  # config fields of the MLM head (model_step's variants)
# The text model (BERT's vocabulary, max_position_embeddings = n): 4 layers, hidden 256, 4 heads of 64.
MODEL = dict(
    num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024, vocab_size=30522
)
MASK_PROBABILITY = 0.15
MASK_TOKEN_ID = 103  # BERT's [MASK]; smaller vocabularies use id 1


def linear_flops(model, rows: int) -> dict[str, float]:
    """Forward FLOPs of the encoder's linear maps on ``rows`` tokens, per component (projections,
    feed-forward), from the modules' own shapes (shared query/key has no key projection to count)."""
    from torch import nn

    totals = {breakdown.PROJECTIONS: 0.0, breakdown.FEED_FORWARD: 0.0}
    for label, module in breakdown.component_modules(model):
        if isinstance(module, nn.Linear) and label in totals:
            totals[label] += 2.0 * rows * module.in_features * module.out_features
    return totals


def core_flops(benchmark_type: str, model, b: int, n: int, attention_config: dict, degree: float = 16):
    """Forward FLOPs of the attention core in every layer on b x n tokens (or nodes of in-degree
    ``degree``), None where the type has no FLOP model."""
    config = model.config
    per_layer = flops.forward_flops(
        benchmark_type,
        n,
        heads=config.num_attention_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        config=attention_config,
        batch=b,
        graph_degree=degree,
    )
    return None if per_layer is None else per_layer * config.num_hidden_layers


def _encoder_config_fields(point: argparse.Namespace, config_fields: dict) -> dict:
    """The sizes of --model (less the text vocabulary) and the dropout settings, for vision and graph."""
    for name in config_fields:
        if name in TEXT_ONLY_FIELDS:
            raise ValueError(
                f"model_step: {name} is a setting of the text model's MLM head; the {point.encoder} encoder "
                "has none. Use the variants default, checkpointing, core_checkpointing or compile."
            )
    sizes = {k: v for k, v in json.loads(point.model).items() if k != "vocab_size"}
    return dict(sizes, hidden_dropout_prob=point.hidden_dropout, attention_probs_dropout_prob=0.0)


def vision_model_and_batch(point: argparse.Namespace, **config_fields):
    """(model, batch of pixel_values (b, 3, s, s) / labels (b,), (type, implementation, attention_config))."""
    import torch

    from hf_efficient import EfficientViTForImageClassification

    side = math.isqrt(point.length)
    if side * side != point.length:
        raise ValueError(
            f"model_step: the vision encoder's length counts patches of a square image, got {point.length}; "
            f"give a perfect square, e.g. {side * side} or {(side + 1) ** 2}."
        )
    fields = _encoder_config_fields(point, config_fields)
    sizes = dict(fields, image_size=side * PATCH, patch_size=PATCH, num_labels=NUM_CLASSES)
    model, attention = build_model(EfficientViTForImageClassification, point.type, point.config, **sizes)
    pixels = torch.randn(point.batch, model.config.num_channels, side * PATCH, side * PATCH)
    batch = {"pixel_values": pixels, "labels": torch.randint(0, NUM_CLASSES, (point.batch,))}
    return model.train(), batch, attention


def mlm_model_and_batch(point: argparse.Namespace, **config_fields):
    """The point's ``EfficientBertForMaskedLM`` in training mode and one MLM batch.

    ``point`` has ``type``, ``config`` (JSON or None), ``model`` (JSON sizes), ``batch``, ``length`` and
    ``hidden_dropout``; ``config_fields`` go to the config as well (``sparse_prediction``).

    Returns:
        (model, batch: dict of input_ids / attention_mask / labels (b, n), (attention_type,
        attn_implementation, attention_config)).
    """
    import torch

    from hf_efficient import EfficientBertForMaskedLM

    b, n = point.batch, point.length
    sizes = dict(json.loads(point.model), max_position_embeddings=n, **config_fields)
    dropout = {"hidden_dropout_prob": point.hidden_dropout, "attention_probs_dropout_prob": 0.0}
    model, attention = build_model(EfficientBertForMaskedLM, point.type, point.config, **sizes, **dropout)
    vocab = model.config.vocab_size
    input_ids = torch.randint(5, vocab, (b, n))  # (b, n), clear of the special ids 0..4
    masked = torch.rand(b, n) < MASK_PROBABILITY
    labels = torch.where(masked, input_ids, -100)  # (b, n), the MLM collator's convention
    input_ids = input_ids.masked_fill(masked, MASK_TOKEN_ID if vocab > MASK_TOKEN_ID else 1)
    attention_mask = torch.ones(b, n, dtype=torch.long)  # what a tokenizer hands over
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return model.train(), batch, attention


def synthetic_graph(num_nodes: int, num_edges: int, feature_dim: int, num_labels: int, seed: int) -> dict:
    """An OGB-style record: uniformly random directed edges, Gaussian node features, random node labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {
        "edge_index": rng.integers(0, num_nodes, size=(2, num_edges), dtype=np.int64),  # (2, E)
        "node_feat": rng.standard_normal((num_nodes, feature_dim), dtype=np.float32),  # (N, F)
        "num_nodes": num_nodes,
        "y": rng.integers(0, num_labels, size=num_nodes, dtype=np.int64),  # (N,)
    }


def graph_model_and_batch(point: argparse.Namespace, **config_fields):
    """(model, collated batch of one graph of n nodes, (type, implementation, attention_config))."""
    from hf_efficient.models.graph import EfficientGraphForNodeClassification, GraphCollator

    if point.batch != 1:
        raise ValueError(
            f"model_step: the graph encoder trains on one graph per step, got --batch {point.batch}."
        )
    fields = dict(_encoder_config_fields(point, config_fields), node_feature_dim=GRAPH_FEATURES)
    model, attention = build_model(
        EfficientGraphForNodeClassification, point.type, point.config, **fields, num_labels=NUM_CLASSES
    )
    config, n = model.config, point.length
    record = synthetic_graph(n, n * EDGES_PER_NODE, GRAPH_FEATURES, NUM_CLASSES, seed=0)
    collator = GraphCollator.for_config(config, label_level="node", add_self_loops=config.needs_edges())
    batch = collator([record])
    if not config.needs_edges():
        batch.pop("edge_index")  # dense attention: the structure is not read
    return model.train(), batch, attention


def text_step_flops(model, batch: dict, point: argparse.Namespace, attention_config: dict) -> dict:
    """Forward FLOPs of the MLM step: encoder, core, and the head on the positions it scores (the masked
    ones unless the head is dense)."""
    config = model.config
    b, n = batch["input_ids"].shape
    dense_head = config.sparse_prediction is False
    scored = b * n if dense_head else int((batch["labels"] != -100).sum())
    return {
        **linear_flops(model, b * n),
        breakdown.CORE: core_flops(point.type, model, b, n, attention_config),
        breakdown.HEAD: 2.0 * scored * config.hidden_size * (config.hidden_size + config.vocab_size),
    }


def vision_step_flops(model, batch: dict, point: argparse.Namespace, attention_config: dict) -> dict:
    """Forward FLOPs of the classification step: patch embedding, encoder on n + 1 tokens, head on [CLS]."""
    config = model.config
    b, n = batch["pixel_values"].shape[0], point.length
    patch_inputs = config.num_channels * config.patch_size**2
    return {
        breakdown.EMBEDDINGS: 2.0 * b * n * patch_inputs * config.hidden_size,
        **linear_flops(model, b * (n + 1)),
        breakdown.CORE: core_flops(point.type, model, b, n + 1, attention_config),
        breakdown.HEAD: 2.0 * b * config.hidden_size * config.num_labels,
    }


def graph_step_flops(model, batch: dict, point: argparse.Namespace, attention_config: dict) -> dict:
    """Forward FLOPs of the node-classification step: node encoder, encoder, core over the attended edges
    (self loops included), head on every node."""
    config = model.config
    n = point.length
    attended = batch["edge_index"].shape[1] if "edge_index" in batch else EDGES_PER_NODE * n
    return {
        breakdown.EMBEDDINGS: 2.0 * n * GRAPH_FEATURES * config.hidden_size,
        **linear_flops(model, n),
        breakdown.CORE: core_flops(point.type, model, 1, n, attention_config, degree=attended / n),
        breakdown.HEAD: 2.0 * n * config.hidden_size * config.num_labels,
    }


def model_and_batch(point: argparse.Namespace, **config_fields):
    """The point's encoder model in training mode, its batch, and (type, implementation, attention_config)."""
    build = {"text": mlm_model_and_batch, "vision": vision_model_and_batch, "graph": graph_model_and_batch}
    return build[point.encoder](point, **config_fields)


def step_flops(model, batch: dict, point: argparse.Namespace, attention_config: dict) -> dict:
    """Forward + backward matrix FLOPs of the point's step per component (None where unknown)."""
    count = {"text": text_step_flops, "vision": vision_step_flops, "graph": graph_step_flops}[point.encoder]
    forward = count(model, batch, point, attention_config)
    return {k: None if v is None else flops.BACKWARD_FACTOR * v for k, v in forward.items()}
