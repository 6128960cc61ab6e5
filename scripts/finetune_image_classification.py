"""Train an EfficientViT image classifier (any vision attention type) over ``Trainer``.

From scratch through a config (``--config``), or from a checkpoint: our MAE (``scripts/pretrain_mae.py``) or
ViT output, or any HF ViT / ViT-MAE checkpoint, with ``--attention_type`` swapping its attention. Runs with
``python`` or ``accelerate launch``. Offline example, a small ViT on Fashion-MNIST (Debian package, fetched on
first use) with shifted-window attention:

    python scripts/finetune_image_classification.py --config configs/vision/base_fmnist.json \
        --attention_type swin_window --dataset_name fashion_mnist --output_dir runs/fmnist-swin_window

Data: ``--dataset_name fashion_mnist`` / ``digits`` (scikit-learn) / a hub dataset / a save_to_disk folder,
or ``--train_dir`` (imagefolder). Online: ``--model_name_or_path google/vit-base-patch16-224
--ignore_mismatched_sizes`` (a new head). With a checkpoint, the model section of ``--config`` overrides its
config: give a base file of the same sizes (base_fmnist.json after base_mae.json), or none. Accuracy is
computed offline; writes ``eval_results.json``, the model, its image processor and a model card, so
``pipeline("image-classification", output_dir)`` works.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, default_data_collator

from hf_efficient import EfficientViTConfig, EfficientViTForImageClassification
from hf_efficient.cli import run_script
from hf_efficient.data import ImageDataArguments, describe_images, load_image_splits
from hf_efficient.data.images import transformed_splits
from hf_efficient.errors import InputError
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    VisionModelArguments,
    build_compute_metrics,
    efficiency_metrics,
    evaluate_and_save,
    finish_run,
    random_state_callbacks,
    releases_output_dirs,
    setup_run,
    train_and_save,
)

VISION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "vision"
ATTENTION_CONFIGS = VISION_CONFIGS / "attention"
logger = logging.getLogger(__name__)


@dataclass
class ModelArguments(VisionModelArguments):
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "EfficientViT / MAE / any ViT checkpoint; none: from scratch."}
    )


@dataclass
class ImageClassificationTask:
    """What ``build_compute_metrics`` needs: accuracy of argmax predictions."""

    metrics: tuple[str, ...] = ("accuracy",)
    is_regression: bool = False


def check_model_given(model_args: ModelArguments, config_args: ConfigArguments) -> None:
    """A checkpoint or the model's sizes must be given: without either, EfficientViTConfig's defaults would
    build ViT-base (86M parameters, 224-pixel images) whatever the images' size. (transformers'
    run_image_classification.py starts from a pretrained ViT by default; offline there is none to start from.)
    """
    sources = (
        model_args.model_name_or_path,
        model_args.config_name,
        config_args.config,
        config_args.config_overrides,
    )
    if any(source is not None for source in sources):
        return
    bases = ", ".join(f"configs/vision/{path.name}" for path in sorted(VISION_CONFIGS.glob("base_*.json")))
    raise InputError(
        "No model given: pass --model_name_or_path (a ViT, ViT-MAE or EfficientViT checkpoint) or --config "
        f"with the model's sizes to train from scratch ({bases}); without either the defaults would build "
        "ViT-base (86M parameters, 224-pixel images) whatever the size of the images."
    )


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser(
        (ModelArguments, ImageDataArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(parser, EfficientViTConfig, ATTENTION_CONFIGS, args)
    model_args, data_args, config_args, training_args = parsed
    check_model_given(model_args, config_args)
    training_args.remove_unused_columns = False  # the image column feeds the transform, not forward()

    with training_args.main_process_first(desc="loading images"):  # rank 0 fetches / converts first
        splits = load_image_splits(data_args, training_args.seed)
    names = splits.label_names
    labels = {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}
    # Any ViT checkpoint loads; --attention_type / --attention_config swap its attention.
    model = model_args.load_model(EfficientViTForImageClassification, {**model_kwargs, **labels})
    processor = model_args.image_processor(model.config)
    columns = (data_args.image_column_name, data_args.label_column_name)
    train, evaluation = transformed_splits(splits, processor, *columns, augment=data_args.augment)

    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=default_data_collator,
        processing_class=processor,  # saved beside the model: pipeline("image-classification") loads it
        compute_metrics=build_compute_metrics(ImageClassificationTask()),
        # The cores say whether they have random state to redraw (Performer, RFA); no branching on names.
        callbacks=random_state_callbacks(model, model_args, training_args.seed),
    )
    config = model.config
    logger.info(
        "%s: %d training images, %d classes, %s attention, %s parameters", splits.source, len(train),
        len(names), config.attention_type, f"{model.num_parameters():,}",
    )  # fmt: skip
    train_result = train_and_save(trainer)
    eval_metrics = evaluate_and_save(trainer) if evaluation is not None else {}
    start = f"`{model_args.model_name_or_path}`" if model_args.model_name_or_path else "scratch"
    finish_run(
        trainer,
        eval_metrics,
        headline=splits.source,
        shown=("loss", "accuracy"),
        summary=f"Image classification on {splits.source} by `scripts/finetune_image_classification.py`, "
        f"from {start}.",
        data_description=describe_images(splits, config, data_args.augment),
        datasets=[splits.hub_id] if splits.hub_id else None,
        base_model=model_args.model_name_or_path,
        training_args=training_args,
        extra_hyperparameters={"image_size": config.image_size, "augment": data_args.augment},
        eval_description=f"Accuracy on {len(evaluation or []):,} images ({splits.eval_split}).",
        eval_dataset=splits.hub_id or splits.source,
        efficiency=efficiency_metrics(train_result.metrics, config.max_position_embeddings),
    )
    return eval_metrics


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
