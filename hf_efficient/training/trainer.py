"""``EfficientTrainer``: transformers' ``Trainer`` that also spares the attention cores' temperatures and
normalisation gains from weight decay.

``Trainer`` decays every parameter except biases and those of LayerNorm modules. An attention core's
learned temperature (RFA's sigma) or per-head LayerNorm gain (Transformer-LS's dual LayerNorm) is neither,
so AdamW pulls it toward 0 by a factor exp(-weight_decay * sum of learning rates) over a run, flattening
attention whatever the data says. Each core lists such parameters in ``AttentionCore.no_weight_decay``;
this trainer removes them from the decayed group. Everything else is ``Trainer``'s.
"""

from __future__ import annotations

from torch import nn
from transformers import Trainer

from ..attention.base import AttentionCore


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
