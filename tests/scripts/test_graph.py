"""scripts/train_graph.py end to end on tiny models and real graphs (offline): node classification on the
karate club, regression and 3-class classification on a slice of the solubility set with graph-sparse,
GraphGPS (Performer, random features redrawn) and Graphormer attention; every attention override file;
clear errors.
"""

from __future__ import annotations

import json
import re

import pytest
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    HfArgumentParser,
    TrainingArguments,
)

import hf_efficient  # noqa: F401  (registers the Auto classes)
from hf_efficient import EfficientGraphConfig
from hf_efficient.data.graph_tasks import graph_model_kwargs, infer_graph_task
from hf_efficient.data.graphs import load_karate_club, load_solubility
from hf_efficient.training import ConfigArguments, parse_args_with_config_files

from ..attention.helpers import script_settings
from ..script_loader import CONFIGS, QUIET

GRAPH_CONFIGS = CONFIGS / "graph"
TINY = str(GRAPH_CONFIGS / "base_tiny.json")
COMMON = [*QUIET, "--logging_steps", "1", "--save_strategy", "no"]
SLICE = ["--dataset_name", "solubility", "--max_train_samples", "64", "--max_eval_samples", "32"]


def run_args(output_dir, *extra) -> list[str]:
    return ["--config", TINY, "--output_dir", str(output_dir), "--max_steps", "4", *COMMON, *extra]


def test_karate_node_classification(train_graph, tmp_path):
    metrics = train_graph.main(run_args(tmp_path, "--dataset_name", "karate", "--max_steps", "20"))
    # scored over the 18 held-out nodes only (34 members, 16 labelled for training): a whole number right
    assert round(metrics["eval_accuracy"] * 18, 6).is_integer()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["EfficientGraphForNodeClassification"]
    assert config["attention_type"] == "graph_sparse" and config["node_feature_dim"] == 34
    card = (tmp_path / "README.md").read_text()
    expected = ["pipeline_tag: graph-ml", "Dwivedi & Bresson 2021", "`in_degree`, `out_degree`", "karate"]
    expected += ["add_self_loops | True", "accuracy", "16 labelled training nodes", "How to load"]
    assert [text for text in expected if text not in card] == []
    model = AutoModelForTokenClassification.from_pretrained(tmp_path)
    assert type(model).__name__ == "EfficientGraphForNodeClassification"


def test_solubility_regression_with_gps_performer(train_graph, tmp_path):
    args = run_args(tmp_path, *SLICE, "--attention_type", "performer", "--random_state_redraw_steps", "1")
    metrics = train_graph.main([*args, "--attention_config", '{"num_features": 16}'])
    assert metrics["eval_mae"] > 0 and metrics["eval_rmse"] >= metrics["eval_mae"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["graph_layer_type"] == "gps" and config["attention_config"] == {"num_features": 16}
    assert config["problem_type"] == "regression" and config["local_attention_config"]["edge_dim"] == 6
    assert (config["node_vocab_size"], config["edge_dim"]) == (119, 6)
    card = (tmp_path / "README.md").read_text()
    assert "Choromanski et al. 2021" in card and "random features redrawn" in card and "rmse" in card
    assert "Rampasek et al. 2022" in card


def test_solubility_classes_with_graphormer(train_graph, tmp_path):
    args = run_args(tmp_path, *SLICE, "--attention_type", "full", "--label_column_name", "sol_class")
    metrics = train_graph.main(args)
    assert round(metrics["eval_accuracy"] * 32, 6).is_integer()  # over exactly the 32 capped test molecules
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    config = model.config
    assert type(model).__name__ == "EfficientGraphForGraphClassification"
    assert config.graph_bias == "graphormer" and config.add_virtual_token and config.edge_dim == 6
    assert config.id2label == {0: "low", 1: "medium", 2: "high"}
    card = (tmp_path / "README.md").read_text()
    assert "`spatial_pos`" in card and "Ying et al. 2021" in card and "pipeline_tag: graph-ml" in card


@pytest.fixture(scope="module")
def solubility_task():
    return infer_graph_task(load_solubility()["train"], "y")


@pytest.mark.parametrize("name", sorted(script_settings("graph", "graph")))
@pytest.mark.parametrize("base", ["base_tiny.json", "base_molecules.json"])
def test_graph_settings_of_the_cores_build_models(train_graph, solubility_task, name, base):
    script_args = (train_graph.GraphDataArguments, train_graph.ModelArguments, TrainingArguments)
    parser = HfArgumentParser((ConfigArguments, *script_args))
    _, model_kwargs = parse_args_with_config_files(
        parser, EfficientGraphConfig, None, ["--config", str(GRAPH_CONFIGS / base), "--attention_type", name]
    )
    config = EfficientGraphConfig(**graph_model_kwargs(model_kwargs, solubility_task))
    assert config.attention_type == name
    assert config.needs_edges() or config.graph_bias is not None or name in ("performer", "linear")


@pytest.mark.slow
@pytest.mark.parametrize("attention_type", ["multi_hop", "linear"])
def test_other_attention_types_train(train_graph, attention_type, tmp_path):
    """Slow (make test): a second layer over the fast loop's config of every type from the script's options
    (the test above) and every graph type's model training (tests/models/graph/)."""
    metrics = train_graph.main(run_args(tmp_path, *SLICE, "--attention_type", attention_type))
    assert metrics["eval_rmse"] > 0


def test_script_errors_are_clear(train_graph, tmp_path):
    with pytest.raises(ValueError, match=r"Unknown dataset_name 'karat': did you mean 'karate'\?"):
        train_graph.main(run_args(tmp_path, "--dataset_name", "karat"))
    with pytest.raises(ValueError, match=r"no label column 'logS'; its columns: \['edge_index'"):
        train_graph.main(run_args(tmp_path, *SLICE, "--label_column_name", "logS"))
    with pytest.raises(ValueError, match=r"no label column 'logS'"):  # the old name: an abbreviation of it
        train_graph.main(run_args(tmp_path, *SLICE, "--label_column", "logS"))
    no_loops = ["--dataset_name", "freesolv", "--add_self_loops", "false"]
    with pytest.raises(ValueError, match=r"have no edges .*Pass --add_self_loops"):
        train_graph.main(run_args(tmp_path, *no_loops))
    with pytest.raises(ValueError, match=r"unknown model key 'hidden_sise'"):
        train_graph.main(
            run_args(tmp_path, "--dataset_name", "karate", "--config_overrides", "hidden_sise=8")
        )


def write_graph_records(folder, fmt: str) -> None:
    """train (12 rings of 3-6 nodes, float features) and validation (6) records, label = ring size parity."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 12), ("validation", 6)):
        records = []
        for i in range(count):
            n = 3 + i % 4
            source, target = list(range(n)), [(j + 1) % n for j in range(n)]
            edges = [source + target, target + source]
            features = [[float(j) / n, 1.0] for j in range(n)]
            records.append({"num_nodes": n, "edge_index": edges, "node_feat": features, "y": n % 2})
        table = pd.DataFrame(records)
        if fmt == "jsonl":
            table.to_json(folder / f"{split}.jsonl", orient="records", lines=True)
        else:
            table.to_parquet(folder / f"{split}.parquet")


def test_own_graph_records_from_json_lines_and_parquet(train_graph, tmp_path):
    write_graph_records(tmp_path / "jsonl", "jsonl")
    write_graph_records(tmp_path / "parquet", "parquet")
    runs = {
        "files": ["--train_file", str(tmp_path / "jsonl" / "train.jsonl"), "--validation_file"],
        "parquet": ["--train_file", str(tmp_path / "parquet"), "--validation_file"],  # a folder of files
        "folder": ["--dataset_name", str(tmp_path / "jsonl")],  # splits from the file names
    }
    runs["files"].append(str(tmp_path / "jsonl" / "validation.jsonl"))
    runs["parquet"].append(str(tmp_path / "parquet" / "validation.parquet"))
    for name, data in runs.items():
        out = tmp_path / f"run-{name}"
        args = ["--config", TINY, "--output_dir", str(out), "--max_steps", "2", *COMMON, *data]
        metrics = train_graph.main(args)
        assert round(metrics["eval_accuracy"] * 6, 6).is_integer(), name  # scored on the 6 validation graphs
        config = json.loads((out / "config.json").read_text())
        assert config["node_feature_dim"] == 2, name
        assert config["problem_type"] == "single_label_classification", name
        metadata = (out / "README.md").read_text().split("---")[1]
        assert str(tmp_path) not in metadata, name  # file names, never local paths
    with pytest.raises(ValueError, match=r"--train_file .*model\.bin: graph records are read from \.json"):
        (tmp_path / "model.bin").write_bytes(b"x")
        train_graph.main(run_args(tmp_path / "x", "--train_file", str(tmp_path / "model.bin")))
    with pytest.raises(ValueError, match=r"--dataset_name karate and --train_file / --validation_file both"):
        train_graph.main(run_args(tmp_path / "x", "--dataset_name", "karate", *runs["files"]))


def test_card_names_a_local_dataset_by_name_and_loads_from_the_saved_folder(train_graph, tmp_path):
    folder = tmp_path / "my_karate"
    load_karate_club().save_to_disk(str(folder))
    out = tmp_path / "run"
    metrics = train_graph.main(run_args(out, "--dataset_name", str(folder)))
    card = (out / "README.md").read_text()
    metadata = card.split("---")[1]  # the YAML front matter the hub reads
    assert "eval_accuracy" in metrics and "my_karate" in metadata and str(tmp_path) not in metadata
    loads = re.findall(r'from_pretrained\("([^"]+)"\)', card.split("## How to load")[1])
    assert loads == [str(out)]  # the folder the run saved, not a placeholder
    assert "once it is pushed to the hub, its repository id" in card
    model = AutoModelForTokenClassification.from_pretrained(loads[0])
    assert type(model).__name__ == "EfficientGraphForNodeClassification"
