"""The vision training scripts end to end on tiny models and real images (scikit-learn digits, offline).

pretrain_mae -> finetune_image_classification warm-started from it with the attention swapped; from scratch
with shifted windows; from a transformers ViT checkpoint; an imagefolder; the pipeline on a saved folder;
clear errors. Fashion-MNIST itself (a 31 MB Debian package) is fetched only by the test marked slow; the image
data helpers (idx files, the fetch, augmentation) are tested in tests/data/test_images.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import HfArgumentParser, ViTConfig, ViTForImageClassification, pipeline

import hf_efficient
from hf_efficient import (
    EfficientViTConfig,
    EfficientViTImageProcessor,
    EfficientViTMAEForPreTraining,
    validate_attention_config,
)
from hf_efficient.data import (
    load_digits_dataset,
    load_fashion_mnist,
)
from hf_efficient.errors import InputError
from hf_efficient.training import ConfigArguments, parse_args_with_config_files

from ..attention.helpers import script_settings
from ..models.helpers import CONFIG_ERRORS
from ..processes import launch
from ..script_loader import CONFIGS, QUIET, SCRIPTS, load_script
from .helpers import trainer_progress_bars

VISION_CONFIGS = CONFIGS / "vision"
TINY = str(VISION_CONFIGS / "base_tiny.json")
COMMON = [*QUIET, "--logging_steps", "1", "--save_strategy", "no"]


def run_args(output_dir, *extra, dataset=("--dataset_name", "digits")) -> list[str]:
    return ["--config", TINY, *dataset, "--output_dir", str(output_dir), *COMMON, *extra]


@pytest.fixture(scope="module")
def mae_checkpoint(pretrain_mae, tmp_path_factory) -> Path:
    """An MAE with Longformer attention pretrained for 6 steps on the digits."""
    output_dir = tmp_path_factory.mktemp("mae_longformer")
    metrics = pretrain_mae.main(
        run_args(output_dir, "--attention_type", "longformer", "--max_steps", "6", "--max_eval_samples", "64")
    )
    assert metrics["train_loss"] > 0 and metrics["eval_loss"] > 0  # pixel MSE on the masked patches
    return output_dir


def test_every_vision_setting_of_a_core_is_valid():
    """What the vision scripts set per type (script_configs["vision"]): valid with the Fashion-MNIST sizes;
    every vision type but the two without hyperparameters to size has one."""
    settings = script_settings("vision", "vision")
    assert set(hf_efficient.list_attention_types("vision")) - set(settings) == {"full", "linear"}
    base = json.loads((VISION_CONFIGS / "base_fmnist.json").read_text())["model"]
    for name, entry in settings.items():
        validate_attention_config(name, entry["attention_config"])
        EfficientViTConfig(**{**base, "attention_type": name, "attention_config": entry["attention_config"]})


@pytest.mark.parametrize(
    ("script", "base", "grid"),
    [("finetune_image_classification", "base_fmnist", 7), ("pretrain_mae", "base_mae", 7)]
    + [("finetune_image_classification", "base_tiny", 4), ("pretrain_mae", "base_tiny", 4)],
)
def test_base_configs_parse_for_their_script(script, base, grid, tmp_path):
    module = load_script(script)
    training = module.EfficientTrainingArguments
    classes = (module.ModelArguments, module.ImageDataArguments, ConfigArguments, training)
    path = VISION_CONFIGS / f"{base}.json"
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


def test_finetune_from_mae_with_swapped_attention_and_the_pipeline(
    finetune_image_classification, mae_checkpoint, tmp_path
):
    args = run_args(tmp_path, "--model_name_or_path", str(mae_checkpoint), "--attention_type", "performer")
    args += ["--max_steps", "4", "--max_eval_samples", "50", "--random_state_redraw_steps", "2"]
    metrics = finetune_image_classification.main(args)
    # scored over exactly the 50 capped evaluation images: a whole number of them right
    assert round(metrics["eval_accuracy"] * 50, 6).is_integer()
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


def test_image_processor_name_and_config_name(finetune_image_classification, mae_checkpoint, tmp_path):
    """--image_processor_name (run_image_classification.py's): a saved processor's normalisation, resized to
    the model's image size and converted to its channels; one that cannot be loaded raises instead of
    falling back. --config_name: a model built from a checkpoint folder's config (sizes, patch grid)."""
    EfficientViTImageProcessor(num_channels=1, image_mean=[0.2], image_std=[0.4]).save_pretrained(
        tmp_path / "processor"
    )
    args = ["--config_name", str(mae_checkpoint), "--image_processor_name", str(tmp_path / "processor")]
    args += ["--max_steps", "1", "--max_eval_samples", "8"]
    finetune_image_classification.main(run_args(tmp_path / "run", *args))
    saved = json.loads((tmp_path / "run" / "preprocessor_config.json").read_text())
    model = json.loads((tmp_path / "run" / "config.json").read_text())
    pretrained = json.loads((mae_checkpoint / "config.json").read_text())
    assert (saved["image_mean"], saved["image_std"]) == ([0.2], [0.4])
    assert saved["size"] == {"height": model["image_size"], "width": model["image_size"]}
    assert model["architectures"] == ["EfficientViTForImageClassification"]
    assert [model[k] for k in ("hidden_size", "patch_size")] == [
        pretrained[k] for k in ("hidden_size", "patch_size")
    ]
    (tmp_path / "empty").mkdir()  # a folder without preprocessor_config.json
    with pytest.raises(OSError, match="preprocessor_config.json"):
        bad = run_args(
            tmp_path / "bad", "--image_processor_name", str(tmp_path / "empty"), "--max_steps", "1"
        )
        finetune_image_classification.main(bad)


@pytest.mark.slow  # a fresh interpreter: transformers' warnings are printed once per process
def test_a_run_from_a_checkpoint_shows_one_progress_bar_and_no_processor_warning(mae_checkpoint, tmp_path):
    """Evaluations during training draw no bar of their own (transformers' ProgressCallback nests one in the
    training bar at every evaluation, and draws another for the final one); the checkpoint's image processor
    loads with the model's num_channels as a declared option, not with transformers' "kwargs ['num_channels']
    were applied for backward compatibility" warning. Checkpoints and the final save draw no "Writing model
    shards" bar (transformers' save_pretrained draws one per save)."""
    args = run_args(tmp_path, "--model_name_or_path", str(mae_checkpoint), "--max_steps", "4")
    args += ["--eval_strategy", "steps", "--eval_steps", "2", "--max_eval_samples", "16"]
    args += ["--save_strategy", "steps", "--save_steps", "2"]
    run = launch([sys.executable, str(SCRIPTS / "finetune_image_classification.py"), *args])
    assert trainer_progress_bars(run.stderr) == [4]  # the training bar, 4 steps
    assert "evaluating 1/1" in run.stderr  # the evaluations' progress, in the training bar
    assert "were applied for backward compatibility" not in run.stdout + run.stderr
    assert "eval_accuracy" in run.stdout  # the evaluations ran
    assert "Writing model shards" not in run.stderr
    assert list(tmp_path.glob("checkpoint-*")), "checkpoints were saved"


@pytest.mark.slow  # 150 training steps
def test_from_scratch_with_shifted_windows_learns_the_digits(finetune_image_classification, tmp_path):
    args = run_args(
        tmp_path, "--attention_type", "swin_window", "--max_steps", "150", "--logging_steps", "50"
    )
    metrics = finetune_image_classification.main([*args, "--augment", "false"])
    assert metrics["eval_accuracy"] > 0.4  # chance: 0.1 (360 test digits)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["attention_config"] == {"window_size": 4, "shift_windows": True}


def test_finetune_a_transformers_vit_checkpoint_on_an_imagefolder(finetune_image_classification, tmp_path):
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
    metrics = finetune_image_classification.main(args)
    # accuracy counts whole images: 0..6 of the 6 held out (25% of 24)
    assert metrics["eval_samples_per_second"] > 0 and metrics["eval_accuracy"] * 6 in range(7)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "efficient_vit" and config["num_channels"] == 3
    assert config["id2label"] == {"0": "even", "1": "odd"} and config["attention_type"] == "nystromformer"
    processor = EfficientViTImageProcessor.from_pretrained(tmp_path / "out")
    assert processor.size == {"height": 16, "width": 16} and processor.num_channels == 3


def test_script_errors_are_clear(pretrain_mae, finetune_image_classification, tmp_path):
    no_model = ["--dataset_name", "digits", "--output_dir", str(tmp_path), "--max_steps", "1", *COMMON]
    message = r"No model given: pass --model_name_or_path .* or --config .*configs/vision/base_tiny.json"
    with pytest.raises(ValueError, match=message):  # not a ViT-base for 8-pixel digits
        finetune_image_classification.main(no_model)
    with pytest.raises(ValueError, match=r"Unknown dataset 'no_such_images'.*fashion_mnist, digits"):
        finetune_image_classification.main(run_args(tmp_path, dataset=("--dataset_name", "no_such_images")))
    with pytest.raises(ValueError, match=r"exactly one image dataset"):
        finetune_image_classification.main(run_args(tmp_path, dataset=()))
    with pytest.raises(ValueError, match=r"no image column 'img'.*\['image', 'label'\].*--image_column_name"):
        finetune_image_classification.main(run_args(tmp_path, "--image_column_name", "img"))
    with pytest.raises(ValueError, match=r"no label column 'labels'.*--label_column_name"):
        finetune_image_classification.main(run_args(tmp_path, "--label_column_name", "labels"))
    with pytest.raises(CONFIG_ERRORS, match=r"image_size=9 must be a multiple of patch_size=2"):
        finetune_image_classification.main(run_args(tmp_path, "--config_overrides", "image_size=9"))
    with pytest.raises(CONFIG_ERRORS, match=r"'graph_sparse' is not available for vision models"):
        finetune_image_classification.main(run_args(tmp_path, "--attention_type", "graph_sparse"))
    with pytest.raises(ValueError, match=r"swin_window attends by 2-D patch position"):
        pretrain_mae.main(run_args(tmp_path, "--attention_type", "swin_window"))


def test_a_config_of_other_image_sizes_than_the_checkpoint_is_refused(
    finetune_image_classification, tmp_path
):
    """docs/vision.md's MAE -> classifier pattern over an MAE of 32-pixel, 3-channel images with a --config
    of 8-pixel grey ones: one error naming both values and the fix, before transformers' load report (issue
    57); --ignore_mismatched_sizes starts those weights afresh and trains."""
    sizes = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config = EfficientViTConfig(image_size=32, num_channels=3, patch_size=2, **sizes)
    EfficientViTMAEForPreTraining(config).save_pretrained(tmp_path / "mae")
    args = run_args(tmp_path / "run", "--model_name_or_path", str(tmp_path / "mae"), "--max_steps", "1")
    with pytest.raises(InputError, match=r"mae has image_size=32, num_channels=3, but the model settings "
                       r"\(--config's model section, --config_overrides\) set image_size=8, num_channels=1.*"
                       r"pass --ignore_mismatched_sizes"):  # fmt: skip
        finetune_image_classification.main(args)
    finetune_image_classification.main([*args, "--ignore_mismatched_sizes", "--max_eval_samples", "8"])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["image_size"] == 8


@pytest.mark.parametrize("name", ["pretrain_mae", "finetune_image_classification"])
def test_script_help_renders(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script(name).main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--attention_type" in out and "--dataset_name" in out


@pytest.mark.slow
def test_fashion_mnist_from_the_debian_package(finetune_image_classification, tmp_path, monkeypatch):
    """Fetches the 31 MB .deb with apt-get download (no install) into a fresh cache, then trains briefly."""
    monkeypatch.setenv("HF_EFFICIENT_FASHION_MNIST_DIR", str(tmp_path / "cache"))
    data = load_fashion_mnist()
    assert (len(data["train"]), len(data["test"])) == (60_000, 10_000)
    assert np.bincount(data["test"]["label"]).tolist() == [1000] * 10
    assert data["train"][0]["label"] == 9  # the first training image is an ankle boot
    args = ["--config", str(VISION_CONFIGS / "base_fmnist.json"), "--dataset_name", "fashion_mnist"]
    args += ["--output_dir", str(tmp_path / "out"), "--max_train_samples", "64", "--max_eval_samples", "64"]
    args += ["--max_steps", "2", "--per_device_train_batch_size", "32", *COMMON]
    metrics = finetune_image_classification.main(args)
    assert round(metrics["eval_accuracy"] * 64, 6).is_integer()  # over exactly the 64 capped test images
    card = (tmp_path / "out" / "README.md").read_text()
    assert "zalando-datasets/fashion_mnist" in card and "Ankle boot" in card


def test_mae_flags_of_run_mae(pretrain_mae, tmp_path):
    """--mask_ratio / --norm_pix_loss override the config; --base_learning_rate is scaled by the total batch
    over 256, as transformers' run_mae.py does."""
    args = ["--max_steps", "1", "--mask_ratio", "0.5", "--norm_pix_loss", "true"]
    args += [
        "--base_learning_rate",
        "0.0016",
        "--per_device_train_batch_size",
        "16",
        "--max_eval_samples",
        "8",
    ]
    pretrain_mae.main(run_args(tmp_path, *args))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["mask_ratio"] == 0.5 and config["norm_pix_loss"] is True
    saved = torch.load(tmp_path / "training_args.bin", weights_only=False)
    assert saved.learning_rate == pytest.approx(0.0016 * 16 / 256)
    assert "| learning_rate | 0.0001 |" in (tmp_path / "README.md").read_text()
