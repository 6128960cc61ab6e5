"""Pretrain an EfficientViT masked autoencoder (He et al. 2021; any vision attention type) over ``Trainer``.

The encoder sees a random ``1 - mask_ratio`` of the patches, the decoder reconstructs the pixels of the
others (mean squared error on the masked patches). Runs with ``python`` or ``accelerate launch``. Offline
example on Fashion-MNIST (Debian package, fetched on first use), then a classifier warm-started from it:

    python scripts/pretrain_mae.py --config configs/vision/base_mae.json --attention_type nystromformer \
        --dataset_name fashion_mnist --output_dir runs/mae-fmnist-nystromformer
    python scripts/finetune_image_classification.py --config configs/vision/base_fmnist.json \
        --attention_type nystromformer --model_name_or_path runs/mae-fmnist-nystromformer \
        --dataset_name fashion_mnist --output_dir runs/cls-fmnist-nystromformer

Data as ``finetune_image_classification.py`` (labels are not needed). Online: ``--model_name_or_path
facebook/vit-mae-base`` continues MAE's pretraining. Encoder attention types that need the full patch grid
(``swin_window``) raise: MAE's encoder sees a random subset. Saves the model, its image processor and a model
card in ``--output_dir``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, default_data_collator

from hf_efficient import EfficientViTConfig, EfficientViTMAEForPreTraining
from hf_efficient.cli import run_script
from hf_efficient.data import ImageDataArguments, describe_images, load_image_splits
from hf_efficient.data.images import transformed_splits
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    VisionModelArguments,
    efficiency_metrics,
    evaluate_and_save,
    finish_run,
    random_state_callbacks,
    releases_output_dirs,
    setup_run,
    train_and_save,
)

ATTENTION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "vision" / "attention"
logger = logging.getLogger(__name__)


@dataclass
class ModelArguments(VisionModelArguments):
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Warm-start from an MAE / ViT-MAE checkpoint; none: from scratch."}
    )


@dataclass
class MAEArguments:
    """run_mae.py's MAE flags: the config's masking and loss, and the batch-scaled learning rate."""

    mask_ratio: float | None = field(
        default=None, metadata={"help": "Share of patches masked (config: 0.75); overrides the config."}
    )
    norm_pix_loss: bool | None = field(
        default=None, metadata={"help": "Normalise each target patch (mean 0, std 1); overrides the config."}
    )
    base_learning_rate: float | None = field(
        default=None,
        metadata={"help": "learning_rate = base_learning_rate * total batch size / 256 (He et al. 2021)."},
    )


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser(
        (ModelArguments, ImageDataArguments, MAEArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(parser, EfficientViTConfig, ATTENTION_CONFIGS, args)
    model_args, data_args, mae_args, _, training_args = parsed
    for name in ("mask_ratio", "norm_pix_loss"):
        if getattr(mae_args, name) is not None:
            model_kwargs[name] = getattr(mae_args, name)
    if mae_args.base_learning_rate is not None:
        total_batch = (
            training_args.per_device_train_batch_size
            * training_args.gradient_accumulation_steps
            * training_args.world_size
        )
        training_args.learning_rate = mae_args.base_learning_rate * total_batch / 256
    training_args.remove_unused_columns = False  # the image column feeds the transform, not forward()
    training_args.label_names = ["pixel_values"]  # the images are the targets: Trainer evaluates the loss
    training_args.prediction_loss_only = True  # and only the loss (not the reconstructed pixels)

    with training_args.main_process_first(desc="loading images"):  # rank 0 fetches / converts first
        splits = load_image_splits(data_args, training_args.seed, with_labels=False)
    model = model_args.load_model(EfficientViTMAEForPreTraining, model_kwargs)
    processor = model_args.image_processor(model.config)
    column = data_args.image_column_name
    train, evaluation = transformed_splits(splits, processor, column, None, augment=data_args.augment)

    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=default_data_collator,
        processing_class=processor,  # saved beside the model for the fine-tuning script
        # The cores say whether they have random state to redraw (Performer, RFA); no branching on names.
        callbacks=random_state_callbacks(model, model_args, training_args.seed),
    )
    config = model.config
    num_patches = config.max_position_embeddings - 1
    visible = config.kept_patches(num_patches)  # as EfficientViTMAEForPreTraining.random_masking
    logger.info(
        "%s: %d training images, %d of %d patches visible, %s attention, %s parameters", splits.source,
        len(train), visible, num_patches, config.attention_type,
        f"{model.num_parameters():,}",
    )  # fmt: skip
    train_result = train_and_save(trainer)
    eval_metrics = evaluate_and_save(trainer) if evaluation is not None else None
    finish_run(
        trainer,
        eval_metrics or {},
        headline=splits.source,
        shown=("loss",),
        summary=f"Masked-autoencoder pretraining on {splits.source} by `scripts/pretrain_mae.py`.",
        data_description=describe_images(splits, config, data_args.augment) + " Labels unused.",
        datasets=[splits.hub_id] if splits.hub_id else None,
        base_model=model_args.model_name_or_path,
        training_args=training_args,
        extra_hyperparameters={"mask_ratio": config.mask_ratio, "norm_pix_loss": config.norm_pix_loss},
        eval_description=f"Pixel loss on the masked patches of {len(evaluation or []):,} held-out images "
        f"({splits.eval_split}; random masks).",
        efficiency=efficiency_metrics(train_result.metrics, 1 + visible),  # tokens the encoder sees
    )
    return {**train_result.metrics, **(eval_metrics or {})}


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
