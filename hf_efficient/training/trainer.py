"""``EfficientTrainer``: transformers' ``Trainer`` that also spares the attention cores' temperatures and
normalisation gains from weight decay, and whose checkpoints a killed run cannot spoil.

``Trainer`` decays every parameter except biases and those of LayerNorm modules. An attention core's
learned temperature (RFA's sigma) or per-head LayerNorm gain (Transformer-LS's dual LayerNorm) is neither,
so AdamW pulls it toward 0 by a factor exp(-weight_decay * sum of learning rates) over a run, flattening
attention whatever the data says. Each core lists such parameters in ``AttentionCore.no_weight_decay``;
this trainer removes them from the decayed group.

Checkpoints: each ``checkpoint-N`` is marked complete once written, old ones are rotated out only then, and
resuming with ``resume_from_checkpoint=True`` (or ``"last"``) takes the newest complete one
(:mod:`hf_efficient.training.checkpoints`).

Non-finite training: a step whose loss or gradients are not finite (inf, NaN) stops the run with a
:class:`NonFiniteTrainingError` naming the step and the first parameter (in model order) whose gradient is
not finite, before the optimiser applies it, so no checkpoint holds it (``Trainer`` would carry on and save
NaN weights). ``allow_non_finite=True`` (``--allow_non_finite``) keeps ``Trainer``'s behaviour; with a
float16 loss scaler, whose skipped steps are how it finds its scale, only the loss is checked.

Progress: one bar, the training bar (:class:`~hf_efficient.training.OneProgressBarCallback`); saves draw
no bar of their own.

Hub: ``push_to_hub`` publishes ``trainer.model_card`` (the package's filled card, set by the scripts) instead
of ``Trainer``'s generic draft, and with ``hub_remote_code=True`` every save ships the remote code
(:func:`hf_efficient.hub.export_remote_code`, image processor included) so that ``trust_remote_code=True``
loads the model where hf_efficient is not installed. Everything else is ``Trainer``'s.
"""

from __future__ import annotations

import copy
import errno
import logging
import os
import shutil
from pathlib import Path

import datasets
import torch
from huggingface_hub import ModelCard
from torch import nn
from transformers import ProgressCallback, Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.training_args import ParallelMode
from transformers.utils import logging as transformers_logging

from ..attention.base import AttentionCore
from ..compat import hook_trainer_saving, trainer_model_columns, trainer_output_dir, trainer_prepare_inputs
from ..hub import export_remote_code
from .callbacks import OneProgressBarCallback
from .checkpoints import (
    discard_checkpoint,
    last_checkpoint,
    mark_checkpoint_complete,
    resolve_resume_checkpoint,
    rotate_checkpoints,
)

logger = logging.getLogger(__name__)


class NonFiniteTrainingError(RuntimeError):
    """A training step's loss or gradient is not finite; the run stopped before applying it."""


def first_non_finite_gradient(model: nn.Module) -> str | None:
    """The name of the first parameter (in ``named_parameters`` order: input side first) whose gradient holds
    an inf or NaN, or None. One reduction per parameter and one host sync when all are finite."""
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    if not named:
        return None
    sums = torch.stack([grad.detach().float().sum() for _, grad in named])  # inf / NaN if any element is
    if bool(torch.isfinite(sums).all()):
        return None
    return next((name for name, grad in named if not bool(torch.isfinite(grad).all())), named[0][0])


def no_weight_decay_parameter_names(model: nn.Module) -> set[str]:
    """Full names (as ``model.named_parameters()``) of the parameters the attention cores inside ``model``
    list in ``no_weight_decay``; for hand-written loops building AdamW parameter groups.

    Example:
        >>> spared = no_weight_decay_parameter_names(model)
        >>> named = list(model.named_parameters())
        >>> groups = [{"params": [p for n, p in named if n not in spared]},
        ...           {"params": [p for n, p in named if n in spared], "weight_decay": 0.0}]
    """
    names = set()
    for module_name, module in model.named_modules():
        if isinstance(module, AttentionCore):
            prefix = f"{module_name}." if module_name else ""
            own = dict(module.named_parameters(recurse=False))  # absent when switched off (learn_sigma=False)
            names.update(prefix + name for name in module.no_weight_decay if name in own)
    return names


class EfficientTrainer(Trainer):
    """``Trainer`` whose AdamW leaves the attention cores' ``no_weight_decay`` parameters undecayed.

    Example:
        >>> trainer = EfficientTrainer(model=model, args=args, train_dataset=train)
    """

    model_card: ModelCard | None = None  # published by create_model_card (push_to_hub) when set

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # One progress bar per run (the training bar), not one more per evaluation; a notebook's progress
        # callback or --disable_tqdm's printer is left as Trainer chose it.
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(OneProgressBarCallback)

    def create_model_card(self, **kwargs) -> None:
        """Write ``self.model_card`` as ``README.md`` in ``output_dir`` (``push_to_hub`` uploads it); without
        one, ``Trainer``'s draft from ``kwargs`` (``finetuned_from``, ``dataset``, ...)."""
        if self.model_card is None:
            return super().create_model_card(**kwargs)
        if self.is_world_process_zero():
            Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
            self.model_card.save(Path(self.args.output_dir) / "README.md")
        return None

    def _save_with_remote_code(self, default, output_dir: str | None = None, state_dict=None) -> None:
        """``Trainer``'s save (``default``: model, then processor), then the remote code with
        ``hub_remote_code``: after the processor, whose ``preprocessor_config.json`` must name the shipped
        image processor too.

        The final save (into ``output_dir`` itself, over an earlier run's model, where checkpoints have their
        own completeness marker) is written into ``output_dir/_saving`` first and moved into place once every
        file is whole (:func:`publish_folder`), so a run killed while writing leaves the previous model as
        it was.

        transformers' "Writing model shards" bar is off meanwhile: a save takes well under a second for the
        models these scripts train, and a bar per checkpoint would interleave with the training bar."""
        target = Path(output_dir or self.args.output_dir)
        # the process that writes (others reach here under DDP and write nothing)
        final = self.args.should_save and target.resolve() == Path(self.args.output_dir).resolve()
        folder = target / SAVING_FOLDER if final else target
        if final:
            shutil.rmtree(folder, ignore_errors=True)  # what a killed save left
        bars_were_on = transformers_logging.is_progress_bar_enabled()
        transformers_logging.disable_progress_bar()
        try:
            default(str(folder), state_dict)
        finally:
            if bars_were_on:
                transformers_logging.enable_progress_bar()
        if self.args.should_save and getattr(self.args, "hub_remote_code", False):
            export_remote_code(self.accelerator.unwrap_model(self.model), folder)
        if final:
            publish_folder(folder, target)

    def training_step(self, model: nn.Module, inputs, num_items_in_batch=None) -> torch.Tensor:
        """``Trainer``'s step (forward, backward), then the non-finite check (see the module's docstring)."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if getattr(self.args, "allow_non_finite", False):
            return loss
        if not bool(torch.isfinite(loss).all()):
            raise self._non_finite(f"the loss is {loss.item()}")
        if getattr(self.accelerator, "scaler", None) is None:  # a loss scaler skips such steps itself
            name = first_non_finite_gradient(self.accelerator.unwrap_model(model))
            if name is not None:
                raise self._non_finite(
                    f"the gradient of {name} (the first parameter, in model order, whose gradient is not "
                    "finite) holds inf or NaN"
                )
        return loss

    def _non_finite(self, what: str) -> NonFiniteTrainingError:
        last = last_checkpoint(self.args.output_dir) if Path(self.args.output_dir).is_dir() else None
        kept = f" The last checkpoint, {last}, holds the model before this step." if last else ""
        return NonFiniteTrainingError(
            f"Training stopped at step {self.state.global_step + 1}: {what}.{kept} Lower --learning_rate, "
            "set --max_grad_norm, or train in float32 / bfloat16 rather than float16, then resume "
            "(--resume_from_checkpoint last); --allow_non_finite carries on regardless."
        )

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        spared = no_weight_decay_parameter_names(model)
        return [name for name in super().get_decay_parameter_names(model) if name not in spared]

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """``Trainer.train``; ``resume_from_checkpoint=True`` or ``"last"`` resumes from the newest complete
        checkpoint of ``output_dir`` (incomplete ones, left by a run killed while saving, are skipped), and a
        given folder must be a complete checkpoint. Under DDP, ``ddp_find_unused_parameters`` left unset is
        decided by :meth:`parameters_without_gradient` instead of ``Trainer``'s blanket ``True``."""
        resume_from_checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if (
            self.args.parallel_mode == ParallelMode.DISTRIBUTED
            and self.args.ddp_find_unused_parameters is None
        ):
            self._decide_find_unused_parameters()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _decide_find_unused_parameters(self) -> None:
        # As Trainer: activation checkpointing re-runs forward passes, which find_unused_parameters breaks.
        checkpointing = getattr(self.model, "is_activation_checkpointing", False)
        checkpointing = checkpointing or getattr(self.args, "activation_checkpointing", False)
        unused = [] if checkpointing else self.parameters_without_gradient()
        if unused is None:  # not a map-style dataset to probe: Trainer's default (True without checkpointing)
            return
        self.args.ddp_find_unused_parameters = bool(unused)
        # Accelerate built its DDP options from the arguments in __init__, and reads them when wrapping
        if self.accelerator.ddp_handler is not None:
            self.accelerator.ddp_handler.find_unused_parameters = bool(unused)
        reason = f"{len(unused)} parameter(s) get no gradient: {unused[:3]}" if unused else "none unused"
        logger.info("DDP find_unused_parameters=%s (%s)", bool(unused), reason)

    def parameters_without_gradient(self, num_examples: int = 2) -> list[str] | None:
        """Names of the trainable parameters that get no gradient from one training step on the first
        ``num_examples`` training examples (a Longformer without global tokens leaves its global projections
        unused, for instance), or None when the training set cannot be indexed.

        DDP needs ``find_unused_parameters=True`` exactly when this is non-empty; ``True`` otherwise costs a
        graph traversal per step and a warning. Random state (torch's RNGs, the collator's) is left as it was.
        """
        dataset = self.train_dataset
        if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            return None
        if isinstance(dataset, datasets.Dataset):
            dataset = trainer_model_columns(self, dataset, description="probe")
        model, device = self.model, self.args.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            collator = copy.deepcopy(self.data_collator)  # a seeded collator's counter must not advance
            examples = [dataset[i] for i in range(min(num_examples, len(dataset)))]
            inputs = trainer_prepare_inputs(self, collator(examples))
            was_training = model.training
            model.train()
            self.compute_loss(model, inputs).backward()
            model.train(was_training)
        unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
        model.zero_grad(set_to_none=True)
        return unused

    def _save_complete_checkpoint(self, default, model, trial) -> None:
        """``Trainer``'s checkpoint (``default``), written over no stale folder of the same step, marked
        complete once every process has written its files; ``save_total_limit`` then deletes old complete
        checkpoints only."""
        folder = Path(trainer_output_dir(self, trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            discard_checkpoint(folder)  # an incomplete one left by a killed run must not mix with this one
        self.accelerator.wait_for_everyone()
        limit = self.args.save_total_limit
        self.args.save_total_limit = None  # Trainer would rotate before the marker is written
        try:
            default(model, trial)
        except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
            if not _out_of_space(error, folder.parent):
                raise
            if self.args.should_save:
                discard_checkpoint(folder)  # the partial checkpoint: its space back, no half-written folder
            kept = last_checkpoint(folder.parent)
            raise OSError(
                errno.ENOSPC,
                f"No space left on the device while writing {folder} ({error}): the partial checkpoint was "
                "removed" + (f", and {kept}, the last complete one, is kept" if kept else "") + ". Free "
                "space there (or keep fewer checkpoints: --save_total_limit), then continue with "
                "--resume_from_checkpoint last.",
            ) from error
        finally:
            self.args.save_total_limit = limit
        self.accelerator.wait_for_everyone()  # every rank's files (RNG states) are written
        if self.args.should_save:
            mark_checkpoint_complete(folder, self.state.global_step)
            rotate_checkpoints(folder.parent, limit, self.state.best_model_checkpoint)


# Trainer's saving steps are private, so compat installs these two around them.
hook_trainer_saving(
    EfficientTrainer, EfficientTrainer._save_with_remote_code, EfficientTrainer._save_complete_checkpoint
)


def _out_of_space(error: Exception, folder: Path) -> bool:
    """Whether a failed write was the device running out of space: an ENOSPC OSError, or (torch.save's
    RuntimeError names no errno) less than FULL_DISK_BYTES left where it was writing."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    try:
        return shutil.disk_usage(folder).free < FULL_DISK_BYTES
    except OSError:
        return False


FULL_DISK_BYTES = 16 * 2**20
# Where the final save is written before it replaces the model at the top of output_dir; a leading "_" keeps
# it out of Trainer's hub uploads.
SAVING_FOLDER = "_saving"
WEIGHT_FILE_PREFIXES = ("model.safetensors", "model-", "pytorch_model")


def publish_folder(staged: Path, target: Path) -> None:
    """Move every file of ``staged`` (a complete save) into ``target``, replacing the files of the same name,
    then remove weight files of ``target`` the new save does not have (the shards of a differently sharded
    earlier model) and ``staged`` itself.

    Each file is flushed to disk before a rename (``os.replace``, atomic per file) puts it in place: a kill
    while the save was being written (seconds for large weights) leaves the previous model untouched; only
    a kill inside the renames themselves (microseconds) can leave a mix of both saves."""
    names = set()
    for path in sorted(staged.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for path in sorted(staged.iterdir(), key=lambda p: p.name.startswith("model")):  # weights last
        destination = target / path.name
        if path.is_dir() and destination.is_dir():
            shutil.rmtree(destination)
        os.replace(path, destination)
        names.add(path.name)
    for path in target.iterdir():
        if path.is_file() and path.name.startswith(WEIGHT_FILE_PREFIXES) and path.name not in names:
            path.unlink()
    shutil.rmtree(staged, ignore_errors=True)
