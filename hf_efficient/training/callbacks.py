"""Training-time random state: redraw Performer features / re-seed LSH hashes every N optimiser steps.

Cores never change their random state inside ``forward``; they expose
:meth:`~hf_efficient.attention.AttentionCore.resample_random_state`, and this module calls it:

- :class:`RandomStateCallback` for ``transformers.Trainer``;
- :func:`resample_attention_random_state` for hand-written (e.g. Accelerate) loops.

:class:`OneProgressBarCallback` is ``Trainer``'s progress bar without the nested evaluation bars.

Seeds are derived from the global step, so a run is reproducible, and every process of a distributed run
draws the same state without communication (each core mixes in its own layer index).
"""

from __future__ import annotations

from torch import nn
from transformers import ProgressCallback, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import has_length

from ..attention.base import AttentionCore
from ..errors import InputError


def resample_attention_random_state(model: nn.Module, seed: int) -> int:
    """Call ``resample_random_state(seed)`` on every attention core inside ``model``.

    Args:
        model: any module (a DDP/compiled wrapper is fine: its submodules are visited).
        seed: the seed for this redraw; each core combines it with its layer index.

    Returns:
        The number of attention cores visited.
    """
    cores = [module for module in model.modules() if isinstance(module, AttentionCore)]
    for core in cores:
        core.resample_random_state(seed)
    return len(cores)


def has_random_state(model: nn.Module) -> bool:
    """Whether any attention core inside ``model`` has training-time random state to redraw.

    Asks the cores (does the core's class override ``resample_random_state``?), so callers never branch on
    attention type names.
    """
    return any(
        type(module).resample_random_state is not AttentionCore.resample_random_state
        for module in model.modules()
        if isinstance(module, AttentionCore)
    )


def step_seed(base_seed: int, global_step: int) -> int:
    """The redraw seed for a global step: distinct per step, identical on every process."""
    return (base_seed * 1_000_003 + global_step) % 2**62


class RandomStateCallback(TrainerCallback):
    """Redraw the attention cores' random state every ``redraw_every_n_steps`` optimiser steps.

    Example:
        >>> trainer = Trainer(model, args, callbacks=[RandomStateCallback(redraw_every_n_steps=1000)])

    Args:
        redraw_every_n_steps: redraw after every N-th optimiser step (N >= 1).
        seed: base seed; the seed of a redraw is ``step_seed(seed, global_step)``.
        fixed_final_fraction: no redraw in this final fraction of ``max_steps`` (0 <= f < 1), nor after the
            last step, so the weights settle on the features they are evaluated and saved with. A redraw
            late in a decayed learning-rate schedule is one the weights can no longer adapt to: on
            Fashion-MNIST, redraws at steps 16k and 17k of 18k raised Performer's training loss from 0.35
            to 0.49 and cost it ~6 test points. Ignored when the run's length is unknown.
    """

    def __init__(self, redraw_every_n_steps: int, seed: int = 0, fixed_final_fraction: float = 0.2):
        if isinstance(redraw_every_n_steps, bool) or not isinstance(redraw_every_n_steps, int):
            raise InputError(f"redraw_every_n_steps must be an int, got {redraw_every_n_steps!r}.")
        if redraw_every_n_steps < 1:
            raise InputError(f"redraw_every_n_steps must be >= 1, got {redraw_every_n_steps}.")
        if not 0.0 <= fixed_final_fraction < 1.0:
            raise InputError(
                f"fixed_final_fraction must be in [0, 1), got {fixed_final_fraction}: it is the final part "
                "of training with fixed features (0 = redraw until the last step)."
            )
        self.redraw_every_n_steps = redraw_every_n_steps
        self.seed = seed
        self.fixed_final_fraction = fixed_final_fraction

    def redraws_at(self, global_step: int, max_steps: int) -> bool:
        """Whether the state is redrawn after optimiser step ``global_step`` of ``max_steps`` (0: unknown)."""
        if global_step % self.redraw_every_n_steps != 0:
            return False
        if max_steps <= 0:
            return True
        # Never after the last step, nor in the final fixed part of training.
        return global_step < max_steps and global_step <= (1.0 - self.fixed_final_fraction) * max_steps

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        **kwargs,
    ) -> TrainerControl:
        # The final evaluation and the saved model must use the features the weights were trained with (a
        # redraw after the last step once cost a Fashion-MNIST Performer 35 accuracy points).
        if model is not None and self.redraws_at(state.global_step, state.max_steps):
            resample_attention_random_state(model, step_seed(self.seed, state.global_step))
        return control


class OneProgressBarCallback(ProgressCallback):
    """``Trainer``'s progress bar, one per run: an evaluation once training has begun draws no bar of its
    own (``ProgressCallback`` nests one inside the training bar at every evaluation, and draws another for
    the final evaluation); during training its progress shows as the training bar's postfix, its metrics in
    the logged lines. A run that only evaluates or predicts keeps ``ProgressCallback``'s bars.

    :class:`~hf_efficient.training.EfficientTrainer` uses it in place of ``ProgressCallback``.
    """

    def __init__(self, max_str_len: int = 100):
        super().__init__(max_str_len)
        self.trained = False  # whether this trainer's training has begun (then no evaluation bars)
        self.evaluated_batches = 0  # of the evaluation running inside training

    def on_train_begin(self, args, state, control, **kwargs):
        self.trained = True
        super().on_train_begin(args, state, control, **kwargs)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not self.trained:
            return super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)
        if state.is_world_process_zero and self.training_bar is not None and has_length(eval_dataloader):
            self.evaluated_batches += 1
            self.training_bar.set_postfix_str(f"evaluating {self.evaluated_batches}/{len(eval_dataloader)}")
        return None

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluated_batches = 0
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.set_postfix_str("")
        super().on_evaluate(args, state, control, **kwargs)
