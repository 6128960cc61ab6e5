"""The vision training scripts end to end on tiny models and real images (scikit-learn digits, offline).

pretrain_mae -> finetune_image_classification warm-started from it with the attention swapped; from scratch
with shifted windows; from a transformers ViT checkpoint; an imagefolder; the pipeline on a saved folder;
the image data helpers (idx files, Fashion-MNIST fetch, augmentation); clear errors. Fashion-MNIST itself
(a 31 MB Debian package) is fetched only by the test marked slow.
"""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from PIL import Image
from transformers import HfArgumentParser, ViTConfig, ViTForImageClassification, pipeline

import hf_efficient
from hf_efficient import EfficientViTConfig, EfficientViTImageProcessor, validate_attention_config
from hf_efficient.data import (
    FASHION_MNIST_CLASSES,
    debian,
    fashion_mnist_dir,
    image_transform,
    load_digits_dataset,
    load_fashion_mnist,
    random_crop_flip,
    read_idx,
)
from hf_efficient.training import ConfigArguments, parse_args_with_config_files

from ..script_loader import load_script

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "vision"
TINY = str(CONFIGS / "base_tiny.json")
CONFIG_ERRORS = (ValueError, StrictDataclassClassValidationError)  # @strict wraps the config's ValueErrors
COMMON = ["--report_to", "none", "--logging_steps", "1", "--seed", "0", "--save_strategy", "no"]


@pytest.fixture(scope="module")
def pretrain():
    return load_script("pretrain_mae")


@pytest.fixture(scope="module")
def finetune():
    return load_script("finetune_image_classification")


def run_args(output_dir, *extra, dataset=("--dataset_name", "digits")) -> list[str]:
    return ["--config", TINY, *dataset, "--output_dir", str(output_dir), *COMMON, *extra]


@pytest.fixture(scope="module")
def mae_checkpoint(pretrain, tmp_path_factory) -> Path:
    """An MAE with Longformer attention pretrained for 6 steps on the digits."""
    output_dir = tmp_path_factory.mktemp("mae_longformer")
    metrics = pretrain.main(
        run_args(output_dir, "--attention_type", "longformer", "--max_steps", "6", "--max_eval_samples", "64")
    )
    assert metrics["train_loss"] > 0 and metrics["eval_loss"] > 0  # pixel MSE on the masked patches
    return output_dir


def test_every_vision_attention_type_has_a_valid_override():
    files = {p.stem: p for p in (CONFIGS / "attention").glob("*.json")}
    assert set(files) == set(hf_efficient.list_attention_types("vision"))
    base = json.loads((CONFIGS / "base_fmnist.json").read_text())["model"]
    for name, path in files.items():
        model = json.loads(path.read_text())["model"]
        assert model["attention_type"] == name
        validate_attention_config(name, model["attention_config"])
        EfficientViTConfig(**{**base, **model})  # valid with the Fashion-MNIST sizes


@pytest.mark.parametrize(
    ("script", "base", "grid"),
    [("finetune_image_classification", "base_fmnist", 7), ("pretrain_mae", "base_mae", 7)]
    + [("finetune_image_classification", "base_tiny", 4), ("pretrain_mae", "base_tiny", 4)],
)
def test_base_configs_parse_for_their_script(script, base, grid, tmp_path):
    module = load_script(script)
    classes = (module.ModelArguments, module.ImageDataArguments, ConfigArguments, module.TrainingArguments)
    path = CONFIGS / f"{base}.json"
    args = ["--config", str(path), "--attention_type", "swin_window", "--output_dir", str(tmp_path)]
    parsed, model = parse_args_with_config_files(HfArgumentParser(classes), EfficientViTConfig, None, args)
    config = EfficientViTConfig(**model)
    assert config.grid_size == (grid, grid) and config.attention_config["window_size"] == 4
    assert parsed[-1].learning_rate == json.loads(path.read_text())["training"]["learning_rate"]


def test_mae_saves_model_processor_and_card(mae_checkpoint):
    config = json.loads((mae_checkpoint / "config.json").read_text())
    assert config["architectures"] == ["EfficientViTMAEForPreTraining"] and config["image_size"] == 8
    assert config["attention_type"] == "longformer" and config["attention_config"]["attention_window"] == 14
    processor = EfficientViTImageProcessor.from_pretrained(mae_checkpoint)
    assert processor.num_channels == 1 and processor.size == {"height": 8, "width": 8}
    assert json.loads((mae_checkpoint / "eval_results.json").read_text())["eval_loss"] > 0
    card = (mae_checkpoint / "README.md").read_text()
    expected = ["pipeline_tag: image-feature-extraction", "Beltagy et al. 2020", "75% of the patches"]
    expected += ["training tokens/s", "8x8 images", "Labels unused", "mask_ratio", "AutoModelForPreTraining"]
    assert [text for text in expected if text not in card] == [] and "swin_window" not in card


def test_finetune_from_mae_with_swapped_attention_and_the_pipeline(finetune, mae_checkpoint, tmp_path):
    args = run_args(tmp_path, "--model_name_or_path", str(mae_checkpoint), "--attention_type", "performer")
    args += ["--max_steps", "4", "--max_eval_samples", "50", "--random_state_redraw_steps", "2"]
    metrics = finetune.main(args)
    assert 0 <= metrics["eval_accuracy"] <= 1
    assert (
        json.loads((tmp_path / "eval_results.json").read_text())["eval_accuracy"] == metrics["eval_accuracy"]
    )
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["EfficientViTForImageClassification"]
    assert config["attention_type"] == "performer" and config["id2label"]["7"] == "7"
    card = (tmp_path / "README.md").read_text()
    expected = ["pipeline_tag: image-classification", "type: accuracy", "Choromanski et al. 2021"]
    expected += [
        "random features redrawn",
        "10 classes",
        str(mae_checkpoint),
        'pipeline("image-classification"',
    ]
    assert [text for text in expected if text not in card] == []
    classify = pipeline("image-classification", model=str(tmp_path), device="cpu")
    digit = load_digits_dataset()["test"][0]["image"].convert("RGB").resize((32, 32))  # any size and mode
    predictions = classify(digit, top_k=3)
    assert len(predictions) == 3 and {p["label"] for p in predictions} <= {str(d) for d in range(10)}


def test_from_scratch_with_shifted_windows_learns_the_digits(finetune, tmp_path):
    args = run_args(
        tmp_path, "--attention_type", "swin_window", "--max_steps", "150", "--logging_steps", "50"
    )
    metrics = finetune.main([*args, "--augment", "false"])
    assert metrics["eval_accuracy"] > 0.4  # chance: 0.1 (360 test digits)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["attention_config"] == {"window_size": 4, "shift_windows": True}


def test_finetune_a_transformers_vit_checkpoint_on_an_imagefolder(finetune, tmp_path):
    """A 3-channel 16x16 ViT (another label count) on grey 8x8 images in class folders; labels are names."""
    vit = ViTForImageClassification(
        ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, num_labels=3)
    )  # fmt: skip
    vit.save_pretrained(tmp_path / "vit")  # no image processor saved: ViT's defaults for the config
    digits = load_digits_dataset()["train"]
    for index in range(24):
        row = digits[index]
        folder = tmp_path / "images" / ("even" if row["label"] % 2 == 0 else "odd")
        folder.mkdir(parents=True, exist_ok=True)
        row["image"].save(folder / f"{index}.png")
    # No --config: a base file's model section would override the checkpoint's sizes.
    args = ["--train_dir", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out"), *COMMON]
    args += ["--model_name_or_path", str(tmp_path / "vit"), "--ignore_mismatched_sizes", "true"]
    args += ["--per_device_train_batch_size", "8"]
    args += ["--attention_type", "nystromformer", "--max_steps", "2", "--validation_split_percentage", "25"]
    metrics = finetune.main(args)
    assert metrics["eval_samples_per_second"] > 0 and 0 <= metrics["eval_accuracy"] <= 1
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "efficient_vit" and config["num_channels"] == 3
    assert config["id2label"] == {"0": "even", "1": "odd"} and config["attention_type"] == "nystromformer"
    processor = EfficientViTImageProcessor.from_pretrained(tmp_path / "out")
    assert processor.size == {"height": 16, "width": 16} and processor.num_channels == 3


def test_script_errors_are_clear(pretrain, finetune, tmp_path):
    with pytest.raises(ValueError, match=r"Unknown dataset 'no_such_images'.*fashion_mnist, digits"):
        finetune.main(run_args(tmp_path, dataset=("--dataset_name", "no_such_images")))
    with pytest.raises(ValueError, match=r"exactly one image dataset"):
        finetune.main(run_args(tmp_path, dataset=()))
    with pytest.raises(ValueError, match=r"no image column 'img'.*\['image', 'label'\].*--image_column_name"):
        finetune.main(run_args(tmp_path, "--image_column_name", "img"))
    with pytest.raises(ValueError, match=r"no label column 'labels'.*--label_column_name"):
        finetune.main(run_args(tmp_path, "--label_column_name", "labels"))
    with pytest.raises(CONFIG_ERRORS, match=r"image_size=9 must be a multiple of patch_size=2"):
        finetune.main(run_args(tmp_path, "--config_overrides", "image_size=9"))
    with pytest.raises(CONFIG_ERRORS, match=r"'graph_sparse' is not available for vision models"):
        finetune.main(run_args(tmp_path, "--attention_type", "graph_sparse"))
    with pytest.raises(ValueError, match=r"swin_window attends by 2-D patch position"):
        pretrain.main(run_args(tmp_path, "--attention_type", "swin_window"))


@pytest.mark.parametrize("name", ["pretrain_mae", "finetune_image_classification"])
def test_script_help_renders(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script(name).main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--attention_type" in out and "--dataset_name" in out


# Image data helpers


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_idx_files_placed_by_hand_need_no_apt(tmp_path, monkeypatch):
    folder = tmp_path / "by_hand" / "fashion"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("t10k", 4)):
        _write_idx(folder / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (count, 28, 28)))
        _write_idx(folder / f"{split}-labels-idx1-ubyte.gz", np.arange(count) % 10)
    images = read_idx(folder / "train-images-idx3-ubyte.gz")
    assert images.shape == (6, 28, 28) and images.dtype == np.uint8
    monkeypatch.setattr(debian.shutil, "which", lambda name: None)  # apt-get would fail if asked
    monkeypatch.setenv("HF_EFFICIENT_FASHION_MNIST_DIR", str(tmp_path))
    assert fashion_mnist_dir() == folder
    data = load_fashion_mnist()
    assert {split: len(rows) for split, rows in data.items()} == {"train": 6, "test": 4}
    first = data["train"][0]
    assert first["image"].mode == "L" and first["image"].size == (28, 28)
    assert np.array_equal(np.asarray(first["image"]), images[0])
    assert data["test"].features["label"].names == FASHION_MNIST_CLASSES
    with pytest.raises(ValueError, match="not an idx file"):
        (tmp_path / "bad.gz").write_bytes(gzip.compress(b"\x01\x02\x03\x04"))
        read_idx(tmp_path / "bad.gz")


def test_missing_apt_get_says_how_to_fetch_by_hand(tmp_path, monkeypatch):
    monkeypatch.setattr(debian.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"apt-get download dataset-fashion-mnist && dpkg -x"):
        fashion_mnist_dir(tmp_path / "empty")


def test_transform_and_augmentation():
    processor = EfficientViTImageProcessor.for_config(
        EfficientViTConfig(image_size=8, patch_size=2, num_channels=1)
    )
    digits = load_digits_dataset()["train"].select(range(4))
    batch = image_transform(processor, augment=True)(digits[:4])
    assert batch["pixel_values"].shape == (4, 1, 8, 8) and batch["labels"].tolist() == digits["label"]
    assert batch["pixel_values"].min() >= -1 and batch["pixel_values"].max() <= 1
    image = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4)
    torch.manual_seed(1)
    first = [np.asarray(random_crop_flip(image)) for _ in range(8)]
    torch.manual_seed(1)
    again = [np.asarray(random_crop_flip(image)) for _ in range(8)]
    assert all(a.shape == (8, 8) for a in first) and all(
        np.array_equal(a, b) for a, b in zip(first, again, strict=True)
    )
    assert any(not np.array_equal(a, np.asarray(image)) for a in first)  # something moved


@pytest.mark.slow
def test_fashion_mnist_from_the_debian_package(finetune, tmp_path, monkeypatch):
    """Fetches the 31 MB .deb with apt-get download (no install) into a fresh cache, then trains briefly."""
    monkeypatch.setenv("HF_EFFICIENT_FASHION_MNIST_DIR", str(tmp_path / "cache"))
    data = load_fashion_mnist()
    assert (len(data["train"]), len(data["test"])) == (60_000, 10_000)
    assert np.bincount(data["test"]["label"]).tolist() == [1000] * 10
    assert data["train"][0]["label"] == 9  # the first training image is an ankle boot
    args = ["--config", str(CONFIGS / "base_fmnist.json"), "--dataset_name", "fashion_mnist"]
    args += ["--output_dir", str(tmp_path / "out"), "--max_train_samples", "64", "--max_eval_samples", "64"]
    args += ["--max_steps", "2", "--per_device_train_batch_size", "32", *COMMON]
    metrics = finetune.main(args)
    assert 0 <= metrics["eval_accuracy"] <= 1
    card = (tmp_path / "out" / "README.md").read_text()
    assert "zalando-datasets/fashion_mnist" in card and "Ankle boot" in card
