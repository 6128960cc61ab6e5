"""Bad records, images and data files stop where they enter (the graph collator, the image processor, the
loaders of the scripts' data files) with an error naming the record, image or file, what is wrong with it and
what to do, instead of failing later inside a model, a resize or ``datasets``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hf_efficient import EfficientGraphForGraphClassification, EfficientViTImageProcessor, GraphCollator
from hf_efficient.data import ImageDataArguments, load_image_datasets, load_task_datasets, load_text_corpus

from ..models.graph.helpers import base_records, tiny_config
from .helpers import graph_record, write_csv

# ---------------------------------------------------------------------------------------------------------
# Graph records
# ---------------------------------------------------------------------------------------------------------

PATH = base_records()[2]  # a 4-node path, 6 directed edges, 3 node and 2 edge features
RECORD_CASES = {
    "a graph with no node": (
        {"edge_index": [[], []], "num_nodes": 0, "node_feat": [], "edge_attr": []},
        r"graph 1: the graph has no nodes \(num_nodes=0\).*dataset.filter",
    ),
    "a negative node id": (
        {**PATH, "edge_index": [[-1, 0], [0, 1]], "edge_attr": [[0.0] * 2] * 2},
        r"graph 1: edge_index holds node ids in \[-1, 1\] but the graph has num_nodes=4",
    ),
    "a node id past num_nodes": (
        {**PATH, "edge_index": [[0, 4], [1, 2]], "edge_attr": [[0.0] * 2] * 2},
        r"node ids in \[0, 4\] but the graph has num_nodes=4 \(ids must be in \[0, 4\)\)",
    ),
    "fractional node ids": (
        {**PATH, "edge_index": [[0.5, 1.0], [1.0, 2.0]], "edge_attr": [[0.0] * 2] * 2},
        r"edge_index must hold integer node ids, got float64 values such as \[0.5, 1.0, 1.0\]",
    ),
    "ragged edge rows": ({**PATH, "edge_index": [[0, 1], [1]]}, r"edge_index must be \[2\]\[E\]"),
    "fewer edge features than edges": (
        {**PATH, "edge_attr": [[0.0, 0.0]] * 2},
        r"graph 1: edge_attr has 2 rows for 6 edges",
    ),
    "NaN node features": (
        {**PATH, "node_feat": [[float("nan")] * 3] * 4},
        r"graph 1: node_feat holds NaN or infinite values",
    ),
    "NaN edge features": (
        {**PATH, "edge_attr": [[float("inf"), 0.0]] * 6},
        r"graph 1: edge_attr holds NaN or infinite values",
    ),
    "text node features": (
        {**PATH, "node_feat": [["a"] * 3] * 4},
        r"graph 1: node_feat must hold numbers, got <U1 values",
    ),
    "a fractional node count": ({**PATH, "num_nodes": 3.5}, r"num_nodes must be a whole number, got 3.5"),
    "node features of another count": (
        {**PATH, "node_feat": [[0.0] * 3] * 5},
        r"node_feat has 5 rows but num_nodes is 4",
    ),
}


@pytest.mark.parametrize("case", list(RECORD_CASES))
def test_bad_graph_records(case):
    record, message = RECORD_CASES[case]
    with pytest.raises(ValueError, match=message):
        GraphCollator(edge_attr=True, columns=())([PATH, record])


def test_node_labels_of_another_count_than_the_nodes():
    with pytest.raises(
        ValueError, match=r"graph 0: node labels y have shape \(5,\) but the graph has num_nodes=4"
    ):
        GraphCollator(label_level="node", columns=())([{**PATH, "y": [0, 1, 0, 1, 1]}])


def test_an_empty_list_of_graphs():
    with pytest.raises(ValueError, match="Cannot collate an empty list of graphs"):
        GraphCollator()([])


def test_whole_number_float_ids_self_loops_and_duplicate_edges_are_kept():
    """Ids stored as floats by a JSON or CSV round trip are read as ints; a self loop and an edge listed twice
    are kept as given (a multigraph: edge attention counts a listed edge each time), and the model's outputs
    stay finite."""
    record = {
        **graph_record(3, [(0, 1), (1, 2)], self_loops=(1,)),
        "node_feat": [[0.0, 1.0, 2.0]] * 3,
        "y": [1],
    }
    record["edge_index"] = [[float(i) for i in row] + [0.0] for row in record["edge_index"]]  # + 0 -> 1 again
    record["edge_index"][1][-1] = 1.0
    collated = GraphCollator(columns=())([record, PATH])
    assert collated["edge_index"].dtype == torch.long and collated["edge_index"].shape[1] == 6 + 6
    model = EfficientGraphForGraphClassification(tiny_config(attention_type="graph_sparse")).eval()
    assert torch.isfinite(model(**collated).logits).all()


# ---------------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------------

RGB = Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8))


@pytest.mark.parametrize(("mode", "num_channels"), [("LA", 1), ("LA", 3), ("RGBA", 1), ("P", 3), ("1", 1)])
def test_odd_image_modes_are_converted(mode, num_channels):
    processor = EfficientViTImageProcessor(num_channels=num_channels, size={"height": 16, "width": 16})
    pixels = processor(RGB.convert(mode), return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, num_channels, 16, 16) and torch.isfinite(pixels).all()


@pytest.mark.parametrize(
    ("images", "message"),
    [
        (np.zeros((0, 0, 3), dtype=np.uint8), r"An image of shape \(0, 0, 3\) has no pixels to resize"),
        (
            np.zeros((20, 30, 5), dtype=np.uint8),
            r"Cannot tell the channels of an image of shape \(20, 30, 5\)",
        ),
        ([], r"No images to process"),
    ],
)
def test_images_the_processor_cannot_read(images, message):
    with pytest.raises(ValueError, match=message):
        EfficientViTImageProcessor(num_channels=3)(images, return_tensors="pt")


def test_a_processor_for_no_channels_or_with_a_mean_per_other_channel():
    with pytest.raises(ValueError, match=r"num_channels must be a positive int .*got 0"):
        EfficientViTImageProcessor(num_channels=0)
    with pytest.raises(ValueError, match=r"image_mean has 3 values but num_channels=1"):
        EfficientViTImageProcessor(num_channels=1, image_mean=[0.5, 0.5, 0.5])


# ---------------------------------------------------------------------------------------------------------
# The scripts' data files
# ---------------------------------------------------------------------------------------------------------


def test_data_files_that_are_missing_empty_or_without_rows(tmp_path):
    good = write_csv(tmp_path / "good.csv", ["sentence", "label"], [["a film", 1], ["a bore", 0]])
    header_only = write_csv(tmp_path / "header.csv", ["sentence", "label"], [])
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(FileNotFoundError, match=r"--validation_file .*missing.csv: no such file"):
        load_task_datasets(train_file=good, validation_file=str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match=r"--train_file .*empty.csv is empty \(0 bytes\)"):
        load_task_datasets(train_file=str(tmp_path / "empty.csv"))
    with pytest.raises(ValueError, match=r"--train_file .*header.csv holds no rows \(a header only\?\)"):
        load_task_datasets(train_file=header_only)
    with pytest.raises(FileNotFoundError, match=r"--train_files .*none.txt: no such file"):
        load_text_corpus(files=[str(tmp_path / "none.txt")])
    (tmp_path / "corpus.txt").mkdir()
    with pytest.raises(FileNotFoundError, match=r"--train_files .*corpus.txt: a folder, not a file"):
        load_text_corpus(files=[str(tmp_path / "corpus.txt")])


MALFORMED_FILES = {  # {case: (file name, content, what the error names)}
    "a JSON line cut short": (
        "train.jsonl",
        '{"sentence": "a fine film", "label": 1}\n{"sentence": "a bore", "label": 0\n',
        r"train.jsonl, line 2: not a JSON record \(Expecting ',' delimiter at column 34\); every line",
    ),
    "a JSON line that is no object": (
        "train.jsonl",
        '{"sentence": "a fine film", "label": 1}\n["a bore", 0]\n',
        r"train.jsonl, line 2: list '\[\"a bore\", 0\]' is not a JSON object",
    ),
    "a JSON document cut short": (
        "train.json",
        '[{"sentence": "a fine film", "label": 1},\n {"sentence": "a bore" "label": 0}]',
        r"train.json, line 2, column 24: not valid JSON \(Expecting ',' delimiter\)",
    ),
    "a CSV row of three cells": (
        "train.csv",
        "sentence,label\na fine film,1\na bore, really,0\n",
        r"train.csv cannot be read: .*Expected 2 fields in line 3, saw 3; every row needs as many cells",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_FILES))
def test_a_malformed_record_is_named_by_file_and_line(case, tmp_path):
    """datasets says "An error occurred while generating the dataset", naming no file or line."""
    name, content, message = MALFORMED_FILES[case]
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=rf"^--train_file .*{message}"):
        load_task_datasets(train_file=str(tmp_path / name))


def test_text_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "corpus.txt").write_bytes(b"a fine film\n\xff\xfe a bore\n")
    message = r"--train_files .*corpus.txt cannot be read: UnicodeDecodeError: .*; save the file as UTF-8\.$"
    with pytest.raises(ValueError, match=message):
        load_text_corpus(files=[str(tmp_path / "corpus.txt")])


def test_label_columns_of_another_type_in_each_file_are_named(tmp_path):
    """Each file reads alone; together datasets cannot cast one's labels to the other's type."""
    ids = write_csv(tmp_path / "train.csv", ["sentence", "label"], [["a fine film", 1], ["a bore", 0]])
    names = write_csv(tmp_path / "dev.csv", ["sentence", "label"], [["a fine film", "pos"], ["a bad", "neg"]])
    message = (
        r"^The column 'label' holds integers in --train_file .*train.csv but strings in --validation_file "
        r".*dev.csv: every file must hold the same kind of values there"
    )
    with pytest.raises(ValueError, match=message):
        load_task_datasets(train_file=ids, validation_file=names)


def test_image_folders_that_are_missing_or_empty(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--train_dir .*no_images: no such folder"):
        load_image_datasets(ImageDataArguments(train_dir=str(tmp_path / "no_images")))
    (tmp_path / "empty" / "cats").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"--train_dir .*empty holds no files"):
        load_image_datasets(ImageDataArguments(train_dir=str(tmp_path / "empty")))
