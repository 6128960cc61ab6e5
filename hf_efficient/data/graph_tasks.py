"""The task a graph dataset defines, read from its records: graph or node level, regression, classes or
multi-label, the input widths the model needs (:class:`GraphTask`), and the per-task helpers of
``scripts/train_graph.py`` (label column, model kwargs, structural columns, the model card's data line).
Loading the records is :mod:`hf_efficient.data.graphs`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow.compute as pc
from datasets import ClassLabel, Dataset, Sequence
from transformers import EvalPrediction

from ..attention.registry import get_attention_class
from ..errors import InputError
from ..models.graph.configuration_efficient_graph import STRUCTURAL_INPUTS, EfficientGraphConfig
from ..training.metrics import combine_metrics
from . import graph_transforms
from .graphs import GraphSplits, check_graph_dataset
from .inputs import label_values, say_label_task
from .molecules import ATOM_VOCAB_SIZE


@dataclass
class GraphTask:
    """What the data says about the model to build: level, regression or classes, input widths."""

    level: str  # "graph" or "node"
    is_regression: bool
    num_labels: int
    label_names: list[str] | None
    node_feature_dim: int
    node_vocab_size: int | None
    edge_dim: int | None
    multi_label: bool = False

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("mae", "rmse") if self.is_regression else ("accuracy",)

    def label_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"num_labels": self.num_labels}
        if self.is_regression:
            config["problem_type"] = "regression"
        elif self.multi_label:
            config["problem_type"] = "multi_label_classification"
        if self.label_names:
            config["id2label"] = dict(enumerate(self.label_names))
            config["label2id"] = {name: i for i, name in enumerate(self.label_names)}
        return config

    def compute_metrics(self, prediction: EvalPrediction) -> dict[str, float]:
        """MAE / RMSE (regression) or accuracy over labelled entries (node labels -100 are skipped)."""
        logits = prediction.predictions
        logits = np.asarray(logits[0] if isinstance(logits, (tuple, list)) else logits)
        labels = np.asarray(prediction.label_ids)
        if self.is_regression:
            predicted = logits.reshape(labels.shape) if logits.size == labels.size else logits
            keep = np.isfinite(labels)
            if self.level == "node":  # padded nodes (Trainer pads batches with -100) and unlabelled ones
                keep &= labels != -100
            return combine_metrics(self.metrics).compute(predictions=predicted[keep], references=labels[keep])
        predicted = (logits > 0).astype(np.int64) if self.multi_label else logits.argmax(-1)
        keep = (labels != -100) & (labels >= 0)  # multi-label: NaN (missing) targets are read as < 0
        return combine_metrics(self.metrics).compute(
            predictions=predicted[keep].reshape(-1), references=labels[keep].astype(np.int64).reshape(-1)
        )


def _is_integer(values: np.ndarray) -> bool:
    return np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.bool_)


def infer_graph_task(dataset: Dataset, label_column: str = "y", level: str | None = None) -> GraphTask:
    """Read the task from the data: graph or node labels (a label per node: ``len(y) == num_nodes`` in every
    record), regression (float labels) or classification (int labels; classes from a ``ClassLabel`` or the
    largest id), multi-label (several int targets per graph, or several float ones that are all 0, 1 or
    NaN = missing, as OGB's molpcba), and the widths of ``node_feat`` / ``edge_attr``."""
    if label_column not in dataset.column_names:
        raise InputError(
            f"The dataset has no label column {label_column!r}; its columns: {dataset.column_names}. "
            "Pass --label_column_name."
        )
    check_graph_dataset(dataset, require_edges=False)
    head = dataset.select(range(min(len(dataset), 64)))
    labels = [np.asarray(y) for y in head[label_column]]
    sizes = [len(x) for x in head["node_feat"]]  # rows of node_feat = nodes (check_graph_record)
    per_node = all(y.ndim >= 1 and y.shape[0] == n for y, n in zip(labels, sizes, strict=True))
    per_node &= any(n > 1 for n in sizes)
    level = level or ("node" if per_node else "graph")
    if level not in ("graph", "node"):
        raise InputError(f"task must be 'graph' or 'node', got {level!r}.")
    if level == "node" and not per_node:
        raise InputError(f"task='node' needs a label per node: {label_column!r} has other lengths.")
    values = np.concatenate([y.reshape(-1) for y in labels])
    width = 1 if level == "node" else max(int(y.size) for y in labels)
    feature = dataset.features[label_column]
    names = feature.names if isinstance(feature, ClassLabel) else None
    if names is None and isinstance(feature, Sequence) and isinstance(feature.feature, ClassLabel):
        names = feature.feature.names
    node_feat = np.asarray(head[0]["node_feat"])
    node_vocab = None  # integer features other than 0/1 are categories (OGB atoms), embedded per column
    if _is_integer(node_feat) and not set(np.unique(node_feat).tolist()) <= {0, 1}:
        largest = pc.max(pc.list_flatten(pc.list_flatten(dataset.data.column("node_feat")))).as_py()
        node_vocab = max(ATOM_VOCAB_SIZE, int(largest) + 1)  # the largest category in the whole split
    edge_dim = None
    if "edge_attr" in dataset.column_names:
        rows = next((np.asarray(e) for e in head["edge_attr"] if e is not None and len(e)), None)
        edge_dim = int(rows.reshape(len(rows), -1).shape[1]) if rows is not None else None
    common = dict(node_feature_dim=int(node_feat.shape[1]), node_vocab_size=node_vocab, edge_dim=edge_dim)
    if not _is_integer(values):
        finite = values[np.isfinite(values)]
        if width > 1 and finite.size and np.isin(finite, (0.0, 1.0)).all():  # 0/1 floats, NaN = missing
            return GraphTask(level, False, width, names, multi_label=True, **common)  # OGB molpcba style
        return GraphTask(level, True, width, None, **common)
    if width > 1:  # several 0/1 targets per graph (OGB molpcba style)
        return GraphTask(level, False, width, names, multi_label=True, **common)
    if names:
        num_labels = len(names)
    else:  # the largest class id in the whole split (node labels: -100 = unlabelled)
        num_labels = int(max(np.asarray(y).max() for y in dataset[label_column])) + 1
    return GraphTask(level, False, num_labels, names, **common)


def say_graph_task(task: GraphTask, where: str, column: str) -> None:
    """Say in one line what the label ``column`` holds and the task inferred from it
    (:func:`~hf_efficient.data.inputs.say_label_task`): float labels are a regression."""
    if task.is_regression:
        holds, trains = "floats", f"a {task.level}-level regression ({task.num_labels} target(s); MAE, RMSE)"
    elif task.multi_label:
        holds, trains = (
            f"{task.num_labels} 0/1 targets per {task.level}",
            f"{task.num_labels} binary classifiers",
        )
    else:
        holds = (
            label_values((), task.label_names) if task.label_names else f"class ids 0..{task.num_labels - 1}"
        )
        trains = f"a {task.num_labels}-class {task.level} classifier"
    say_label_task(where, column, holds, trains)


def select_label(data: Dataset, label_column: str) -> Dataset:
    """Rename the label column to ``labels`` (the name ``forward`` takes, so ``Trainer`` keeps it) and drop
    a ``y`` that is not the label (the collator would read it first)."""
    drop = [c for c in ("y", "labels") if c in data.column_names and c != label_column]
    data = data.remove_columns(drop)
    return data.rename_column(label_column, "labels") if label_column != "labels" else data


def graph_model_kwargs(model_kwargs: dict[str, Any], task: GraphTask) -> dict[str, Any]:
    """Model config kwargs completed from the data: input widths, labels, and ``edge_dim`` (model and every
    attention config that has the field) when some part of the model reads edge features."""
    kwargs = {
        "node_feature_dim": task.node_feature_dim,
        "node_vocab_size": task.node_vocab_size,
        **model_kwargs,
        **task.label_config(),
    }
    if task.edge_dim is None or "edge_dim" in model_kwargs:
        return kwargs
    probe = EfficientGraphConfig(**{**kwargs, "edge_dim": None})
    if not probe.needs_edges() and probe.graph_bias is None:
        return kwargs  # nothing would read edge features: they are not collated
    kwargs["edge_dim"] = task.edge_dim
    cores = {"attention_config": probe.attention_type, "local_attention_config": probe.local_attention_type}
    for config_key, name in cores.items():
        if "edge_dim" in {f.name for f in fields(get_attention_class(name).config_class)}:
            kwargs[config_key] = {"edge_dim": task.edge_dim, **(kwargs.get(config_key) or {})}
    return kwargs


def add_structural_features(dataset: Dataset, config: EfficientGraphConfig, desc: str = "") -> Dataset:
    """Add the structural columns ``config`` reads (shortest paths, degrees, PEs, WL colours) with
    ``datasets.map`` (cached for Arrow-backed datasets, with a progress bar)."""
    widths = {
        "laplacian_pe": {"k": config.lap_pe_dim},
        "random_walk_pe": {"k": config.rw_pe_dim},
        "random_node_features": {"k": config.rnf_dim},
        "distance_encoding": {"max_distance": (config.de_dim or 2) - 2},
    }
    transforms = dict.fromkeys(STRUCTURAL_INPUTS[name][1] for name in config.structural_inputs())
    for transform in transforms:
        kwargs = widths.get(transform, {})
        dataset = dataset.map(
            getattr(graph_transforms, transform), fn_kwargs=kwargs, desc=f"{transform} {desc}".strip()
        )
    return dataset


def describe_graphs(splits: GraphSplits, task: GraphTask, label_column: str) -> str:
    """One paragraph for the model card: source, sizes, features, labels (the splits as trained on)."""
    nodes = [len(x) for x in splits.train["node_feat"]]
    if task.level == "node":
        column = "labels" if "labels" in splits.train.column_names else label_column
        count = sum(int((np.asarray(y) != -100).sum()) for y in splits.train[column])
        nodes_note = f" ({count:,} labelled training nodes)"
    else:
        nodes_note = ""
    edges = [len(e[0]) if e else 0 for e in splits.train["edge_index"]]
    target = "regression" if task.is_regression else f"{task.num_labels} classes"
    if task.label_names:
        target += f" ({', '.join(task.label_names)})"
    evaluated = (
        f"; evaluated on {len(splits.eval):,} ({splits.eval_split})" if splits.eval is not None else ""
    )
    return (
        f"`{splits.source}`: {len(splits.train):,} training graph(s){nodes_note}{evaluated}; "
        f"{np.mean(nodes):.1f} nodes and {np.mean(edges):.1f} directed edges per graph on average. "
        f"{task.level.capitalize()}-level {target} of `{label_column}`; node features of width "
        f"{task.node_feature_dim}"
        + (f" (categories < {task.node_vocab_size})" if task.node_vocab_size else "")
        + (f", edge features of width {task.edge_dim}" if task.edge_dim else "")
        + "."
    )
