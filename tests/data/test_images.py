"""The image data helpers: idx files placed by hand (no apt-get), the message when apt-get is missing, the
processor transform and the random crop/flip augmentation. Fetching the real Fashion-MNIST package (31 MB)
is left to the slow test in tests/scripts/test_vision.py, which then trains on it."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hf_efficient import EfficientViTConfig, EfficientViTImageProcessor
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
