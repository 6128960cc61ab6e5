"""``EfficientTrainer``: transformers' ``Trainer`` that also spares the attention cores' temperatures and
normalisation gains from weight decay, and whose checkpoints a killed run cannot spoil.

``Trainer`` decays every parameter except biases and those of LayerNorm modules. An attention core's
learned temperature (RFA's sigma) or per-head LayerNorm gain (Transformer-LS's dual LayerNorm) is neither,
so AdamW pulls it toward 0 by a factor exp(-weight_decay * sum of learning rates) over a run, flattening
attention whatever the data says. Each core lists such parameters in ``AttentionCore.no_weight_decay``;
this trainer removes them from the decayed group.

Checkpoints: each ``checkpoint-N`` is marked complete once written, old ones are rotated out only then, and
resuming with ``resume_from_checkpoint=True`` (or ``"last"``) takes the newest complete one
(:mod:`hf_efficient.training.checkpoints`). Everything else is ``Trainer``'s.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..attention.base import AttentionCore
from .checkpoints import (
    discard_checkpoint,
    mark_checkpoint_complete,
    resolve_resume_checkpoint,
    rotate_checkpoints,
)


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

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        spared = no_weight_decay_parameter_names(model)
        return [name for name in super().get_decay_parameter_names(model) if name not in spared]

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """``Trainer.train``; ``resume_from_checkpoint=True`` or ``"last"`` resumes from the newest complete
        checkpoint of ``output_dir`` (incomplete ones, left by a run killed while saving, are skipped), and a
        given folder must be a complete checkpoint."""
        resume_from_checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        """``Trainer``'s checkpoint, written over no stale folder of the same step, marked complete once every
        process has written its files; ``save_total_limit`` then deletes old complete checkpoints only."""
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            discard_checkpoint(folder)  # an incomplete one left by a killed run must not mix with this one
        self.accelerator.wait_for_everyone()
        limit = self.args.save_total_limit
        self.args.save_total_limit = None  # Trainer would rotate before the marker is written
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        self.accelerator.wait_for_everyone()  # every rank's files (RNG states) are written
        if self.args.should_save:
            mark_checkpoint_complete(folder, self.state.global_step)
            rotate_checkpoints(folder.parent, limit, self.state.best_model_checkpoint)
