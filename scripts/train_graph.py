"""Train an EfficientGraph model (graph or node classification / regression) over ``Trainer``.

The task comes from the data: a label per node -> ``EfficientGraphForNodeClassification``, else graph-level;
float labels -> regression (MAE / RMSE), integer labels -> classification (accuracy); input widths
(``node_feature_dim``, categorical ``node_vocab_size``, ``edge_dim``) too. The structural inputs the config
reads (shortest paths, degrees, Laplacian / random-walk PE, WL colours) are added with ``datasets.map``
(cached). Runs with ``python`` or ``accelerate launch``. Offline example, solubility regression with GraphGPS
(graph-sparse local + Performer global attention):

    python scripts/train_graph.py --config configs/graph/base_molecules.json --attention_type performer \
        --config_overrides graph_layer_type=gps --dataset_name solubility --output_dir runs/solubility-gps

Data (``--dataset_name``): ``solubility`` (``--label_column_name sol_class``: 3 classes), ``freesolv``,
``mouse_connectomes`` (strain of 32 mouse brains, with ``configs/graph/base_connectomes.json``), ``karate`` or
``polblogs`` (node classification), your own JSON lines / Parquet graph records (a file or a folder of them;
or ``--train_file`` / ``--validation_file``), a save_to_disk folder, or a hub dataset (online, e.g.
OGB/ogbg-molhiv).
Writes ``eval_results.json``, the model and a model card.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from transformers import HfArgumentParser

from hf_efficient import (
    EfficientGraphConfig,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    GraphCollator,
)
from hf_efficient.cli import run_script
from hf_efficient.data.graph_tasks import (
    add_structural_features,
    describe_graphs,
    graph_model_kwargs,
    infer_graph_task,
    say_graph_task,
    select_label,
)
from hf_efficient.data.graphs import OFFLINE_GRAPH_DATASETS, check_graph_dataset, load_graph_splits
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    efficiency_metrics,
    evaluate_and_save,
    finish_run,
    random_state_callbacks,
    releases_output_dirs,
    setup_run,
    train_and_save,
)
from hf_efficient.training import (
    PaddingFreeModelArguments as SharedModelArguments,
)

ATTENTION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "graph" / "attention"
MODELS = {"graph": EfficientGraphForGraphClassification, "node": EfficientGraphForNodeClassification}
logger = logging.getLogger(__name__)


@dataclass
class GraphDataArguments:
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": f"{', '.join(OFFLINE_GRAPH_DATASETS)} (offline), JSON lines / Parquet graph records (a "
            "file or a folder of them), a save_to_disk folder or a hub set; none: --train_file, else "
            "solubility."
        },
    )
    train_file: str | None = field(
        default=None,
        metadata={"help": "Graph records to train on: a .jsonl / .json / .parquet file or a folder of them."},
    )
    validation_file: str | None = field(
        default=None, metadata={"help": "Graph records to evaluate on (as --train_file)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The hub dataset's config."})
    label_column_name: str = field(
        default="y", metadata={"help": "Label column (solubility: y or sol_class), named as in run_glue.py."}
    )
    task: str | None = field(
        default=None, metadata={"help": "graph or node; none: inferred from the labels."}
    )
    add_self_loops: bool = field(
        default=False, metadata={"help": "Add a self loop to every node (graphs without edges then work)."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Only the first N training graphs."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Only the first N evaluation graphs."}
    )


@dataclass
class ModelArguments(SharedModelArguments):
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "An EfficientGraph checkpoint; none: from scratch (--config)."}
    )


def _first(dataset, n: int | None):
    return dataset if dataset is None or n is None else dataset.select(range(min(n, len(dataset))))


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser(
        (ModelArguments, GraphDataArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(parser, EfficientGraphConfig, ATTENTION_CONFIGS, args)
    model_args, data_args, _, training_args = parsed

    with training_args.main_process_first(desc="loading graphs"):  # rank 0 fetches / converts first
        splits = load_graph_splits(
            data_args.dataset_name,
            data_args.dataset_config_name,
            model_args.cache_dir,
            data_args.train_file,
            data_args.validation_file,
        )
    task = infer_graph_task(splits.train, data_args.label_column_name, data_args.task)
    say_graph_task(task, splits.source, data_args.label_column_name)
    model_class = MODELS[task.level]
    # A checkpoint knows its input widths; a new model takes them (and edge_dim) from the data.
    if model_args.model_name_or_path:
        config_kwargs = {**task.label_config(), **model_kwargs}
    else:
        config_kwargs = graph_model_kwargs(model_kwargs, task)
    model = model_args.load_model(model_class, config_kwargs)
    config = model.config
    collator = GraphCollator.for_config(
        config, label_level=task.level, add_self_loops=data_args.add_self_loops
    )
    data = {}
    for split, dataset in (("train", splits.train), ("eval", splits.eval)):
        dataset = _first(dataset, getattr(data_args, f"max_{split}_samples"))
        if dataset is None:
            continue
        check_graph_dataset(dataset, config.needs_edges() and not data_args.add_self_loops, f"{split} split")
        with training_args.main_process_first(desc="structural features"):
            dataset = add_structural_features(dataset, config, desc=split)
        data[split] = select_label(dataset, data_args.label_column_name)  # Trainer keeps `labels` (forward's)

    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data.get("eval"),
        data_collator=collator,
        compute_metrics=task.compute_metrics,
        # The cores say whether they have random state to redraw (Performer, RFA); no branching on names.
        callbacks=random_state_callbacks(model, model_args, training_args.seed),
    )
    logger.info(
        "%s: %d training graphs, %s-level %s, %s attention (%s layers), %s parameters", splits.source,
        len(data["train"]), task.level, "regression" if task.is_regression else f"{task.num_labels} classes",
        config.attention_type, config.graph_layer_type, f"{model.num_parameters():,}",
    )  # fmt: skip
    train_result = train_and_save(trainer)
    eval_metrics = evaluate_and_save(trainer) if "eval" in data else {}
    nodes = float(np.mean([len(x) for x in data["train"]["node_feat"]]))
    start = f"`{model_args.model_name_or_path}`" if model_args.model_name_or_path else "scratch"
    finish_run(
        trainer,
        eval_metrics,
        headline=splits.source,
        shown=("loss", *task.metrics),
        summary=f"{task.level.capitalize()}-level "
        f"{'regression' if task.is_regression else 'classification'} on {splits.source} by "
        f"`scripts/train_graph.py`, from {start}.",
        data_description=describe_graphs(
            replace(splits, train=data["train"], eval=data.get("eval")), task, data_args.label_column_name
        ),
        datasets=[splits.hub_id] if splits.hub_id else None,
        base_model=model_args.model_name_or_path,
        training_args=training_args,
        extra_hyperparameters={
            "label_column_name": data_args.label_column_name,
            "add_self_loops": data_args.add_self_loops,
            "structural inputs": ", ".join(config.structural_inputs()) or "none",
        },
        eval_description=f"On {len(data.get('eval') or []):,} graph(s) ({splits.eval_split}).",
        eval_dataset=splits.hub_id or splits.source,
        efficiency=efficiency_metrics(train_result.metrics, nodes),
    )
    return eval_metrics


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
