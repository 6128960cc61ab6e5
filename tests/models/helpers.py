"""What the three encoders' tests share: the errors a strict config raises, the gradient checks."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from huggingface_hub.errors import StrictDataclassError

# transformers' strict configs wrap the TypeError of a field's type check and the ValueError of a class
# validator (StrictDataclassFieldValidationError, ...ClassValidationError); the message carries it.
CONFIG_ERRORS = (ValueError, StrictDataclassError)

# Parameters a non-causal encoder never uses: RFA's recency gate exists for its causal form only. They get no
# gradient (DDP then needs find_unused_parameters=True); reported to the attention owners.
CAUSAL_ONLY_PARAMETERS = {"rfa": ("gate_weight", "gate_bias")}


def assert_grads_finite(model: torch.nn.Module) -> None:
    """After a backward pass every parameter has a finite gradient, but a causal-only parameter of a core
    (``CAUSAL_ONLY_PARAMETERS``), which a bidirectional encoder never uses."""
    unused = {
        f"{prefix}.{name}"
        for prefix, module in model.named_modules()
        for name in CAUSAL_ONLY_PARAMETERS.get(getattr(module, "attention_type", None), ())
    }
    for name, param in model.named_parameters():
        if name in unused:
            continue
        assert param.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"


def parameter_gradients(model: torch.nn.Module, loss: Callable[[], torch.Tensor]) -> dict[str, torch.Tensor]:
    """{name: gradient} of every parameter that gets one from a backward pass of ``loss()``, the global RNG
    pinned first (reformer_lsh draws fresh rotations in training, like dropout)."""
    model.zero_grad()
    torch.manual_seed(0)
    loss().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def enable_gradient_checkpointing(model) -> None:
    """transformers' gradient_checkpointing_enable (non-reentrant torch.utils.checkpoint)."""
    with warnings.catch_warnings():  # transformers 5.23 renamed it activation_checkpointing_enable
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()


def assert_same_gradients(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """The same parameters got gradients, equal up to float32 rounding of a recomputed forward."""
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)
