"""Steps every training script shares, so scripts stay a page long: set-up, callbacks, train and save."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import TrainOutput

from ..modeling.checkpoint_files import check_pretrained_path
from .callbacks import RandomStateCallback, has_random_state
from .checkpoints import resolve_resume_checkpoint
from .config_files import parse_args_with_config_files
from .distributed import enable_cpu_ddp_if_launched, has_accelerator
from .output_dir import claim_output_dir

# Flags of the scripts that name a checkpoint or tokenizer folder (or a hub id).
PRETRAINED_PATH_FLAGS = ("model_name_or_path", "tokenizer_name")


@dataclass
class EfficientTrainingArguments(TrainingArguments):
    """transformers' ``TrainingArguments`` plus the flag that lets a run replace an earlier one's output."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace the model and checkpoints an earlier run left in --output_dir (its checkpoints "
            "are deleted). Without it, such a folder is refused unless --resume_from_checkpoint continues it."
        },
    )


def setup_run(parser: HfArgumentParser, model_config_class: type, attention_dir, args: list[str] | None):
    """CPU DDP when launched without an accelerator, arguments over the config files, logging, seed, and
    the output folder claimed for this run (:func:`~hf_efficient.training.output_dir.claim_output_dir`: a
    lock, and no silent overwrite of an earlier run's model; ``--overwrite_output_dir`` replaces it).

    Returns:
        (the parsed dataclasses, the model config kwargs), as :func:`parse_args_with_config_files`.
    """
    enable_cpu_ddp_if_launched()  # before TrainingArguments exists
    parsed, model_kwargs = parse_args_with_config_files(parser, model_config_class, attention_dir, args)
    for arguments in parsed:  # a checkpoint path that does not exist: said now, not as a hub lookup error
        for flag in PRETRAINED_PATH_FLAGS:
            check_pretrained_path(getattr(arguments, flag, None), f"--{flag}")
    training_args = parsed[-1]
    if not has_accelerator():  # pinned host memory only helps copies to an accelerator (and warns without)
        training_args.dataloader_pin_memory = False
    level = logging.INFO if training_args.should_log else logging.WARNING  # the main process logs
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=level)
    claim_output_dir(training_args, overwrite=getattr(training_args, "overwrite_output_dir", False))
    set_seed(training_args.seed)
    # float32 values below ~1e-38 (denormals) cost ~100x per operation on x86 CPUs; exp-based attention
    # (Performer, RFA) on a checkpoint's large-norm keys produces many of them, so flush them to zero as GPUs
    # do. No effect on results beyond the 1e-38 level; returns False where the CPU cannot.
    torch.set_flush_denormal(True)
    return parsed, model_kwargs


@dataclass
class RandomStateArguments:
    """The command-line flag of every script whose model may hold random attention state (Performer's and
    RFA's features); scripts' ``ModelArguments`` extend it."""

    random_state_redraw_steps: int = field(
        default=1000,
        metadata={
            "help": "Redraw random features (Performer, RFA) every N steps; 0 keeps the model's features "
            "(drawn at initialisation, or loaded with --model_name_or_path) for the whole run."
        },
    )
    random_state_fixed_final_fraction: float = field(
        default=0.2,
        metadata={
            "help": "No redraws in this final fraction of max_steps: the weights settle on the features."
        },
    )


def random_state_callbacks(
    model: nn.Module, arguments: RandomStateArguments, seed: int
) -> list[TrainerCallback]:
    """``[RandomStateCallback]`` if a core of ``model`` has random state (Performer, RFA) and redraws are
    asked for (``random_state_redraw_steps`` >= 1), else ``[]``: with 0 the cores keep the features they
    have (drawn from their (seed, layer) at initialisation, or loaded), the ones the model is saved and
    evaluated with."""
    every, fixed = arguments.random_state_redraw_steps, arguments.random_state_fixed_final_fraction
    if every < 0:
        raise ValueError(
            f"--random_state_redraw_steps must be >= 0, got {every}: N >= 1 redraws every N steps, "
            "0 never redraws."
        )
    if every == 0 or not has_random_state(model):
        return []
    return [RandomStateCallback(every, seed=seed, fixed_final_fraction=fixed)]


def train_and_save(trainer: Trainer) -> TrainOutput:
    """Train (resuming from ``--resume_from_checkpoint``, ``last`` = the newest complete checkpoint in
    output_dir), save model, tokenizer and trainer state, log the metrics, and print one line per process."""
    args = trainer.args
    size = len(trainer.train_dataset) if hasattr(trainer.train_dataset, "__len__") else None
    if size == 0:
        raise ValueError(
            "The training set is empty (0 examples): check the data files, the split and filters such as "
            "--max_train_samples."
        )
    resume = resolve_resume_checkpoint(args.resume_from_checkpoint, args.output_dir)
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except ValueError as error:  # torch's optimizer.load_state_dict on differently grouped parameters
        if resume is None or "parameter group" not in str(error):
            raise
        raise ValueError(
            f"Cannot resume the optimizer saved in {resume}: its parameter groups differ from this run's "
            f"({error}). Checkpoints written before the scripts trained with EfficientTrainer (which keeps "
            "RFA's sigma and Transformer-LS's LayerNorm gains out of weight decay) group them differently. "
            f"Continue from its weights with a fresh optimizer: --model_name_or_path {resume} instead of "
            "--resume_from_checkpoint."
        ) from error
    trainer.save_model()
    trainer.save_state()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    print(
        f"[process {args.process_index} of {args.world_size}] trained {result.global_step} steps, "
        f"training loss {result.training_loss:.4f}",
        flush=True,
    )
    return result


def evaluate_and_save(trainer: Trainer, dataset=None, prefix: str = "eval") -> dict[str, float]:
    """``trainer.evaluate`` with the metrics logged and saved as ``<prefix>_results.json``."""
    metrics = trainer.evaluate(dataset, metric_key_prefix=prefix)
    trainer.log_metrics(prefix, metrics)
    trainer.save_metrics(prefix, metrics)
    return metrics
