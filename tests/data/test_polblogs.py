"""graph-tool's .gt format on hand-built files; polblogs from the Debian package (slow: a 45 MB .deb)."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from hf_efficient.data import debian
from hf_efficient.data.graph_tasks import infer_graph_task
from hf_efficient.data.graph_tool_format import MAGIC, read_gt
from hf_efficient.data.graphs import load_graph_splits, load_polblogs, polblogs_file


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _gt_file() -> bytes:
    """3 vertices, edges 0->1, 0->2, 2->0 (uint8 ids), a graph string, vertex int32 + vector<double>, edge
    double property; written as the format describes."""
    out = MAGIC + bytes([1, 0]) + _string(b"a comment") + bytes([1]) + struct.pack("<Q", 3)
    out += struct.pack("<Q", 2) + bytes([1, 2]) + struct.pack("<Q", 0) + struct.pack("<Q", 1) + bytes([0])
    out += struct.pack("<Q", 4)
    out += bytes([0]) + _string(b"readme") + bytes([6]) + _string(b"hello")
    out += bytes([1]) + _string(b"value") + bytes([2]) + struct.pack("<3i", 7, -1, 0)
    out += bytes([1]) + _string(b"pos") + bytes([11])
    out += b"".join(struct.pack("<Q2d", 2, i, -i) for i in range(3))
    out += bytes([2]) + _string(b"weight") + bytes([4]) + struct.pack("<3d", 0.5, 1.5, 2.5)
    return out


def test_read_gt_by_hand(tmp_path):
    path = tmp_path / "tiny.gt.gz"
    path.write_bytes(gzip.compress(_gt_file()))
    graph = read_gt(path)
    assert (graph["num_nodes"], graph["directed"], graph["comment"]) == (3, True, "a comment")
    assert graph["edge_index"].tolist() == [[0, 0, 2], [1, 2, 0]]
    assert graph["graph"] == {"readme": "hello"}
    assert graph["vertex"]["value"].tolist() == [7, -1, 0]
    assert [p.tolist() for p in graph["vertex"]["pos"]] == [[0, 0], [1, -1], [2, -2]]
    assert graph["edge"]["weight"].tolist() == [0.5, 1.5, 2.5]
    with pytest.raises(ValueError, match="Not a graph-tool .gt file"):
        read_gt(b"PK\x03\x04 not gt")
    with pytest.raises(ValueError, match="unread bytes"):
        read_gt(_gt_file() + b"\0")


def test_polblogs_file_placed_by_hand_needs_no_apt(tmp_path, monkeypatch):
    (tmp_path / "polblogs.gt.gz").write_bytes(b"placed")
    monkeypatch.setattr(debian.shutil, "which", lambda name: None)  # apt-get would fail if asked
    assert polblogs_file(tmp_path).read_bytes() == b"placed"
    with pytest.raises(RuntimeError, match=r"apt-get download python3-graph-tool && dpkg -x.*polblogs.gt.gz"):
        polblogs_file(tmp_path / "empty")


@pytest.mark.slow  # apt-get download of the 45 MB python3-graph-tool .deb (only polblogs.gt.gz is kept)
def test_polblogs_from_the_debian_package(tmp_path):
    data = load_polblogs(tmp_path)
    kept = sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock")  # the cache's build lock stays
    assert kept == ["polblogs-v1", "polblogs.gt.gz"]  # .deb removed
    train, test = data["train"][0], data["test"][0]
    assert train["num_nodes"] == 1490 and len(train["edge_index"][0]) == 2 * 16715  # undirected, both ways
    train_y, test_y = np.array(train["y"]), np.array(test["y"])
    assert ((train_y == -100) != (test_y == -100)).all()
    labels = np.where(train_y >= 0, train_y, test_y)
    assert np.bincount(labels).tolist() == [758, 732]  # liberal, conservative (Adamic & Glance 2005)
    assert np.bincount(train_y[train_y >= 0]).tolist() == [379, 366]
    splits = load_graph_splits("polblogs", cache_dir=tmp_path)  # cached Arrow now
    assert (splits.eval_split, splits.hub_id) == ("test", None)
    task = infer_graph_task(splits.train)
    assert (task.level, task.num_labels, task.node_feature_dim) == ("node", 2, 1490)
