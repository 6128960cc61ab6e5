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

Progress: one bar, the training bar (:class:`~hf_efficient.training.OneProgressBarCallback`); saves draw
no bar of their own.

Hub: ``push_to_hub`` publishes ``trainer.model_card`` (the package's filled card, set by the scripts) instead
of ``Trainer``'s generic draft, and with ``hub_remote_code=True`` every save ships the remote code
(:func:`hf_efficient.hub.export_remote_code`, image processor included) so that ``trust_remote_code=True``
loads the model where hf_efficient is not installed. Everything else is ``Trainer``'s.
"""

from __future__ import annotations

import copy
import logging
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
    mark_checkpoint_complete,
    resolve_resume_checkpoint,
    rotate_checkpoints,
)

logger = logging.getLogger(__name__)


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

        transformers' "Writing model shards" bar is off meanwhile: a save takes well under a second for the
        models these scripts train, and a bar per checkpoint would interleave with the training bar."""
        bars_were_on = transformers_logging.is_progress_bar_enabled()
        transformers_logging.disable_progress_bar()
        try:
            default(output_dir, state_dict)
        finally:
            if bars_were_on:
                transformers_logging.enable_progress_bar()
        if self.args.should_save and getattr(self.args, "hub_remote_code", False):
            export_remote_code(self.accelerator.unwrap_model(self.model), output_dir or self.args.output_dir)

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
