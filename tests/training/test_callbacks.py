"""RandomStateCallback and resample_attention_random_state: when random features are redrawn in training
(every n steps, never after the last step nor in the final fraction), reproducibly per (seed, step, layer),
and the scripts' --random_state_redraw_steps."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import TrainerControl, TrainerState

from hf_efficient.training import RandomStateCallback, resample_attention_random_state
from hf_efficient.training.run import RandomStateArguments, random_state_callbacks

from ..attention.helpers import make_core


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(
            [make_core("performer", layer_idx=i) for i in range(2)] + [make_core("linear", layer_idx=2)]
        )


def test_callback_redraws_every_n_steps_reproducibly():
    model, twin = TinyModel(), TinyModel()
    callback = RandomStateCallback(redraw_every_n_steps=3)
    state, control = TrainerState(), TrainerControl()
    initial = [layer.projection_matrix.clone() for layer in model.layers[:2]]
    for step in (1, 2):
        state.global_step = step
        callback.on_step_end(None, state, control, model=model)
    assert all(torch.equal(a.projection_matrix, b) for a, b in zip(model.layers, initial, strict=False))
    state.global_step = 3
    assert callback.on_step_end(None, state, control, model=model) is control
    after = [layer.projection_matrix.clone() for layer in model.layers[:2]]
    assert not any(torch.equal(a, b) for a, b in zip(after, initial, strict=True))
    assert not torch.equal(after[0], after[1])  # layers draw different features

    callback.on_step_end(None, state, control, model=twin)  # same step -> same features
    assert all(torch.equal(a.projection_matrix, b) for a, b in zip(twin.layers, after, strict=False))
    state.global_step = 6
    callback.on_step_end(None, state, control, model=twin)
    assert not torch.equal(twin.layers[0].projection_matrix, after[0])


def test_callback_never_redraws_after_the_last_step():
    # The final evaluation and the saved model must see the features the weights were trained with.
    model = TinyModel()
    callback = RandomStateCallback(redraw_every_n_steps=3)
    state, control = TrainerState(max_steps=6), TrainerControl()
    before = model.layers[0].projection_matrix.clone()
    state.global_step = 6
    callback.on_step_end(None, state, control, model=model)
    assert torch.equal(model.layers[0].projection_matrix, before)
    state.global_step = 3  # an intermediate multiple still redraws
    callback.on_step_end(None, state, control, model=model)
    assert not torch.equal(model.layers[0].projection_matrix, before)


def test_callback_keeps_features_fixed_in_the_final_fraction_of_training():
    # Late redraws meet a decayed learning rate the weights cannot adapt with (FMNIST Performer: -6 points).
    callback = RandomStateCallback(redraw_every_n_steps=2, fixed_final_fraction=0.5)
    assert [s for s in range(1, 11) if callback.redraws_at(s, max_steps=10)] == [2, 4]
    assert [s for s in range(1, 11) if callback.redraws_at(s, max_steps=0)] == [2, 4, 6, 8, 10]  # unknown
    default = RandomStateCallback(redraw_every_n_steps=1000)
    assert [s for s in range(1000, 18001, 1000) if default.redraws_at(s, 18000)][-1] == 14000
    model, state, control = TinyModel(), TrainerState(max_steps=10), TrainerControl()
    before = model.layers[0].projection_matrix.clone()
    state.global_step = 6
    callback.on_step_end(None, state, control, model=model)
    assert torch.equal(model.layers[0].projection_matrix, before)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"fixed_final_fraction must be in \[0, 1\)"):
            RandomStateCallback(redraw_every_n_steps=2, fixed_final_fraction=bad)


def test_resample_function_for_custom_loops():
    model = TinyModel()
    before = model.layers[0].projection_matrix.clone()
    assert resample_attention_random_state(model, seed=5) == 3  # every core visited
    assert not torch.equal(model.layers[0].projection_matrix, before)
    with pytest.raises(ValueError, match="redraw_every_n_steps"):
        RandomStateCallback(redraw_every_n_steps=0)


def test_script_redraw_flag_zero_keeps_the_initial_features():
    # --random_state_redraw_steps 0: the features drawn from (seed, layer) at initialisation stay for the run.
    model = TinyModel()
    callbacks = random_state_callbacks(model, RandomStateArguments(random_state_redraw_steps=0), seed=0)
    assert callbacks == []
    (callback,) = random_state_callbacks(model, RandomStateArguments(random_state_redraw_steps=7), seed=3)
    assert (callback.redraw_every_n_steps, callback.seed) == (7, 3)
    with pytest.raises(ValueError, match=r"random_state_redraw_steps must be >= 0, got -1.*0 never redraws"):
        random_state_callbacks(model, RandomStateArguments(random_state_redraw_steps=-1), seed=0)
