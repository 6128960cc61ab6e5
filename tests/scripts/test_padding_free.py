"""``--padding_free`` in the text and graph scripts (on where exact, refused where not) and
``pretrain_mlm.py --packing`` (whole texts packed into one row per batch, no attention across them), with
length-grouped sampling (``--train_sampling_strategy group_by_length``, and transformers 4's
``--group_by_length`` read as it); tiny models, in-process."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from hf_efficient import EfficientBertForMaskedLM
from hf_efficient.data import PackedMLMCollator

from .helpers import COMMON, pretrain_args
from .test_graph import SLICE, run_args

WINDOW = {"attention_window": 8, "global_token_indices": [0]}


def saved_config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_pretrain_packing_and_padding_free(pretrain_mlm, finetune_glue, data, tmp_path):
    """--packing trains and evaluates on packed rows; the model is padding-free by default (saved so) and
    --padding_free false runs padded; a fine-tune from it with length-grouped sampling (transformers 4's
    --group_by_length) keeps padding-free."""
    args = pretrain_args(data, tmp_path / "packed", "longformer", WINDOW, "--max_steps", "2", "--packing")
    metrics = pretrain_mlm.main(
        [*args, "--validation_split_percentage", "10", "--train_sampling_strategy", "group_by_length"]
    )
    assert metrics["train_loss"] > 0 and metrics["eval_loss"] > 0 and 0 <= metrics["eval_accuracy"] <= 1
    assert saved_config(tmp_path / "packed")["padding_free"] is True
    args = pretrain_args(data, tmp_path / "padded", "full", {}, "--max_steps", "1", "--padding_free", "false")
    pretrain_mlm.main(args)
    assert saved_config(tmp_path / "padded")["padding_free"] is False
    glue = ["--model_name_or_path", str(tmp_path / "packed"), "--train_file", data["train"]]
    glue += [
        "--validation_file",
        data["dev"],
        "--output_dir",
        str(tmp_path / "glue"),
        "--max_seq_length",
        "64",
    ]
    metrics = finetune_glue.main(
        [*glue, "--max_steps", "2", "--group_by_length", *COMMON]  # transformers 4's switch
    )
    assert 0 <= metrics["eval_accuracy"] <= 1 and saved_config(tmp_path / "glue")["padding_free"] is True
    for run in ("packed", "glue"):  # both spellings reach Trainer as its length-grouped sampler
        training_args = torch.load(tmp_path / run / "training_args.bin", weights_only=False)
        assert training_args.train_sampling_strategy == "group_by_length"
    with pytest.raises(ValueError, match="--packing already makes one example per text"):
        pretrain_mlm.main([*args, "--packing", "--line_by_line"])


def test_packed_mlm_loss_equals_the_padded_batch(pretrain_mlm, data, tmp_path):
    """A packed row's MLM loss equals the loss of the same masked sequences as a padded batch: each
    sequence attends to itself only, and the loss averages over the same masked tokens."""
    pretrain_mlm.main(pretrain_args(data, tmp_path, "longformer", WINDOW, "--max_steps", "1"))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    texts = ["a gripping, funny film", "two hours I will not get back, ever", "fine"]
    examples = [tokenizer(text, return_special_tokens_mask=True) for text in texts]
    row = PackedMLMCollator(tokenizer, mlm_probability=0.5, mask_seed=0)(examples)
    lengths = [len(example["input_ids"]) for example in examples]
    assert row["input_ids"].shape == (1, sum(lengths)) and (row["labels"] != -100).any()
    assert row["position_ids"][0].tolist() == [i for length in lengths for i in range(length)]
    model = EfficientBertForMaskedLM.from_pretrained(tmp_path).eval()
    padded_ids = torch.full((3, max(lengths)), tokenizer.pad_token_id)
    padded_labels = torch.full((3, max(lengths)), -100)
    for i, piece in enumerate(
        zip(row["input_ids"][0].split(lengths), row["labels"][0].split(lengths), strict=True)
    ):
        padded_ids[i, : lengths[i]], padded_labels[i, : lengths[i]] = piece
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        packed_loss = model(**row).loss
        padded_loss = model(padded_ids, attention_mask=mask, labels=padded_labels).loss
    torch.testing.assert_close(packed_loss, padded_loss, atol=1e-5, rtol=1e-5)


def test_graph_padding_free_default_and_refusal(train_graph, tmp_path):
    """On by default for attention along edges; off by default (and refused when asked for) with
    Graphormer's bias, which needs the padded batch."""
    train_graph.main(run_args(tmp_path / "sparse", *SLICE))
    assert saved_config(tmp_path / "sparse")["padding_free"] is True
    graphormer = run_args(tmp_path / "graphormer", *SLICE, "--attention_type", "full", "--max_steps", "1")
    train_graph.main(graphormer)
    config = saved_config(tmp_path / "graphormer")
    assert config["graph_bias"] == "graphormer" and config["padding_free"] is False
    with pytest.raises(
        ValueError, match="--padding_free: graph_bias='graphormer' is one .* per padded graph"
    ):
        train_graph.main([*graphormer, "--padding_free", "true", "--output_dir", str(tmp_path / "refused")])


def test_tokens_per_second_counts_the_examples_own_lengths():
    """A packed or line-by-line run's model card turns examples/s into tokens/s with its examples' mean
    length, not the block size they stay under; a stream (no length) with the block size."""
    from datasets import Dataset, IterableDataset

    from hf_efficient.training.language_modeling import mean_length

    texts = Dataset.from_dict({"input_ids": [[101, 7, 102], [101, 7, 8, 9, 10, 102]]})
    assert mean_length(texts, 128) == 4.5
    stream = IterableDataset.from_generator(lambda: iter([{"input_ids": [1, 2]}]))
    assert mean_length(stream, 128) == 128
