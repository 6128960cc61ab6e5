"""Steps every training script shares, so scripts stay a page long: set-up, callbacks, train and save."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow.compute
import torch
from datasets import Dataset, IterableDataset
from torch import nn
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import HubStrategy, TrainOutput

from ..errors import InputError
from ..modeling.checkpoint_files import check_pretrained_path
from .arguments import RandomStateArguments, decide_phases
from .callbacks import RandomStateCallback, has_random_state
from .checkpoints import check_resumes_same_attention, resolve_resume_checkpoint
from .config_files import parse_args_with_config_files
from .distributed import enable_cpu_ddp_if_launched, has_accelerator
from .model_card import build_model_card, save_model_card
from .output_dir import claim_output_dir

logger = logging.getLogger(__name__)
# Loggers whose INFO records the scripts show: this package's and the script's own (run as a file).
SCRIPT_LOGGERS = ("hf_efficient", "__main__")
# Flags of the scripts that name a checkpoint, config, tokenizer or image processor folder (or a hub id), with
# the file such a folder must hold.
PRETRAINED_PATH_FLAGS = {
    "model_name_or_path": "config.json",
    "config_name": "config.json",
    "tokenizer_name": None,  # tokenizer.json, vocab.txt, ...: the tokenizer class decides
    "image_processor_name": "preprocessor_config.json",
}


@dataclass
class EfficientTrainingArguments(TrainingArguments):
    """transformers' ``TrainingArguments`` plus the flags that let a run replace an earlier one's output, ship
    the modeling code, and carry on past a non-finite loss."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace the model and checkpoints an earlier run left in --output_dir (its checkpoints "
            "are deleted). Without it, such a folder is refused unless --resume_from_checkpoint continues it."
        },
    )
    hub_strategy: HubStrategy | str = field(
        default="end",
        metadata={
            "help": "When --push_to_hub pushes: end (the default here; transformers': every_save) pushes "
            "once, at the end of the run, with the filled model card; every_save, checkpoint or "
            "all_checkpoints also push as transformers does at each save (without the card until the end)."
        },
    )
    hub_remote_code: bool = field(
        default=False,
        metadata={
            "help": "Save (and push) the modeling code with the model, so that trust_remote_code=True loads "
            "it where hf_efficient is not installed (the image processor too, for vision models)."
        },
    )
    allow_non_finite: bool = field(
        default=False,
        metadata={
            "help": "Carry on when a training step's loss or gradients are not finite (transformers' "
            "behaviour). Without it the run stops at that step, naming the first parameter whose gradient is "
            "not finite; the checkpoints saved before it stay as they were."
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
    training_args = parsed[-1]
    # Warnings of every library; INFO from this package and the script only (not from datasets, urllib3,
    # filelock ... through the root logger), and only on the process that logs (rank 0).
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=logging.WARNING)
    level = logging.INFO if training_args.should_log else logging.WARNING
    for name in SCRIPT_LOGGERS:
        logging.getLogger(name).setLevel(level)
    check_device_flags(training_args)
    for arguments in parsed:  # a checkpoint path that does not exist: said now, not as a hub lookup error
        for flag, holds in PRETRAINED_PATH_FLAGS.items():
            check_pretrained_path(getattr(arguments, flag, None), f"--{flag}", holds)
    decide_phases(training_args, args)
    if not has_accelerator():  # pinned host memory only helps copies to an accelerator (and warns without)
        training_args.dataloader_pin_memory = False
    claim_output_dir(training_args, overwrite=getattr(training_args, "overwrite_output_dir", False))
    set_seed(training_args.seed)
    # float32 values below ~1e-38 (denormals) cost ~100x per operation on x86 CPUs; exp-based attention
    # (Performer, RFA) on a checkpoint's large-norm keys produces many of them, so flush them to zero as GPUs
    # do. No effect on results beyond the 1e-38 level; returns False where the CPU cannot.
    torch.set_flush_denormal(True)
    return parsed, model_kwargs


def check_device_flags(training_args: TrainingArguments) -> None:
    """The flags that need an accelerator, on a machine without one: ``--fp16`` is refused (transformers
    would train in float32 without a word: float16 autocast runs on accelerators only), and
    ``--torch_compile`` is said once (it compiles for minutes before the first step, so a short run is many
    times slower than eager). ``--bf16`` without ``--use_cpu`` is refused while the flags are parsed
    (:func:`~hf_efficient.training.config_files.flags_error`).

    Raises:
        InputError: ``--fp16`` or ``--fp16_full_eval`` without an accelerator.
    """
    if has_accelerator():
        return
    for flag in ("fp16", "fp16_full_eval"):
        if getattr(training_args, flag, False):
            raise InputError(
                f"--{flag} computes in float16 on a GPU, and this machine has none "
                "(torch.cuda.is_available() is False): transformers would train in float32 instead. Leave "
                "--fp16 out, or use --bf16 --use_cpu for bfloat16 on the CPU."
            )
    if getattr(training_args, "torch_compile", False):
        logger.info(
            "--torch_compile on the CPU: the model compiles for minutes before the first step, so a short "
            "run is many times slower than eager; it pays off on long runs only: leave it out for short ones"
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
        raise InputError(
            f"--random_state_redraw_steps must be >= 0, got {every}: N >= 1 redraws every N steps, "
            "0 never redraws."
        )
    if every == 0 or not has_random_state(model):
        return []
    return [RandomStateCallback(every, seed=seed, fixed_final_fraction=fixed)]


def random_state_settings(
    arguments: RandomStateArguments, callbacks: list[TrainerCallback]
) -> dict[str, float]:
    """The redraw flags for a model card's hyperparameters, when the run redraws random state (else none)."""
    if not any(isinstance(callback, RandomStateCallback) for callback in callbacks):
        return {}
    return {
        "random_state_redraw_steps": arguments.random_state_redraw_steps,
        "random_state_fixed_final_fraction": arguments.random_state_fixed_final_fraction,
    }


def note_exact_attention(model: nn.Module, longest: int) -> None:
    """Say once per attention type, in the run's info log, when its pattern covers every input of the run
    (the cores' ``covered_length()``: a Longformer window of 512 over texts of at most 64 tokens): every query
    then sees every key, so the run computes exact attention at the extra cost of the pattern. Not refused:
    a long-context checkpoint is fine-tuned and used on short texts too.

    Args:
        longest: the most tokens of any input of the run.
    """
    covering: dict[str, int] = {}
    for core in model.attention_cores():
        reach = core.covered_length()
        if reach is not None and reach >= longest:
            covering.setdefault(core.attention_type, reach)
    for attention_type, reach in covering.items():
        logger.info(
            "%s attention covers every input: each query sees every key of inputs up to %d tokens and the "
            "longest here has %d, so this run is exact attention at the extra cost of the pattern (full "
            "attention computes the same faster; a smaller window or block keeps it sparse)",
            attention_type, reach, longest,
        )  # fmt: skip


def longest_input(dataset) -> int | None:
    """The most tokens of any example of ``dataset`` (its ``input_ids``; a stream: its first example's, as
    the language-model scripts' blocks all have ``--block_size``), or None for other inputs (images,
    graphs)."""
    if isinstance(dataset, IterableDataset):
        first = next(iter(dataset), None)
        return len(first["input_ids"]) if first is not None and "input_ids" in first else None
    if not isinstance(dataset, Dataset) or "input_ids" not in dataset.column_names or not len(dataset):
        return None
    lengths = pyarrow.compute.list_value_length(dataset.with_format("arrow")["input_ids"])
    return int(pyarrow.compute.max(lengths).as_py())


def train_and_save(trainer: Trainer) -> TrainOutput:
    """Train (resuming from ``--resume_from_checkpoint``, ``last`` = the newest complete checkpoint in
    output_dir, once its attention is checked to be this run's), save model, tokenizer and trainer state, log
    the metrics, and print one line per process. An attention whose pattern covers every training input is
    said first (:func:`note_exact_attention`)."""
    args = trainer.args
    size = len(trainer.train_dataset) if hasattr(trainer.train_dataset, "__len__") else None
    if size == 0:
        raise InputError(
            "The training set is empty (0 examples): check the data files, the split and filters such as "
            "--max_train_samples."
        )
    resume = resolve_resume_checkpoint(args.resume_from_checkpoint, args.output_dir)
    config = getattr(trainer.model, "config", None)  # a model of ours, or any module Trainer trains
    if resume is not None and config is not None:
        check_resumes_same_attention(config, resume)
    longest = longest_input(trainer.train_dataset)
    if longest is not None and hasattr(trainer.model, "attention_cores"):
        note_exact_attention(trainer.model, longest)
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except ValueError as error:  # torch's optimizer.load_state_dict on differently grouped parameters
        if resume is None or "parameter group" not in str(error):
            raise
        raise InputError(
            f"Cannot resume the optimizer saved in {resume}: its parameter groups differ from this run's "
            f"({error}). Checkpoints written before the scripts trained with EfficientTrainer (which keeps "
            "RFA's sigma and Transformer-LS's LayerNorm gains out of weight decay) group them differently. "
            f"Continue from its weights with a fresh optimizer: --model_name_or_path {resume} instead of "
            "--resume_from_checkpoint."
        ) from error
    trainer.save_model(_internal_call=True)  # no push yet: finish_run pushes once, with the filled card
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


def finish_run(
    trainer: Trainer, eval_metrics: dict[str, float], *, headline: str | None, shown=(), **card
) -> None:
    """The end every script shares.

    Rank 0 prints ``headline: metric = value, ...`` for the ``shown`` metric names (with or without
    ``eval_``; no line without a headline), builds the model card (:func:`build_model_card` with ``card``,
    saying how to load the remote code when ``--hub_remote_code`` shipped it) and saves it as ``README.md``.
    With ``--push_to_hub`` every process then calls ``trainer.push_to_hub``, which uploads the output folder
    with that card (``EfficientTrainer.create_model_card``) rather than ``Trainer``'s draft.
    """
    args = trainer.args
    if trainer.is_world_process_zero():
        if headline is not None:
            # eval_accuracy, and eval_validation_matched_accuracy when a task has several evaluation splits
            values = {
                k: v
                for k, v in eval_metrics.items()
                if any(k.removeprefix("eval_") == n or k.endswith(f"_{n}") for n in shown)
            }
            print(f"{headline}: " + ", ".join(f"{k} = {v:.4f}" for k, v in values.items()), flush=True)
        model_card = build_model_card(
            trainer.model,
            repo_id=getattr(trainer, "hub_model_id", None),  # set by Trainer with --push_to_hub
            remote_code=getattr(args, "hub_remote_code", False),
            eval_metrics=eval_metrics,
            **card,
        )
        save_model_card(model_card, args.output_dir)
        trainer.model_card = model_card
    if args.push_to_hub:
        push_or_say_how(trainer)


def push_or_say_how(trainer: Trainer) -> None:
    """``trainer.push_to_hub`` at the end of a run; when the upload fails (network, hub, token), an error
    that says what state things are in and the command that pushes the saved folder again."""
    args = trainer.args
    try:
        trainer.push_to_hub(commit_message="End of training")
    except Exception as error:  # httpx / huggingface_hub errors of every kind: said, then re-raised
        repo = getattr(trainer, "hub_model_id", None) or args.hub_model_id or "<your-name>/<model>"
        raise RuntimeError(
            f"--push_to_hub: uploading {args.output_dir} to {repo} failed ({type(error).__name__}: {error}). "
            "The hub applies an upload as one commit, so the repository is as it was before it, and the "
            f"trained model is saved in {args.output_dir}. Push it again with: hf upload {repo} "
            f"{args.output_dir} --exclude 'checkpoint-*' --exclude '_*'"
        ) from error
