"""What the three encoders' tests share: the errors a strict config raises, the gradient checks, the export
check."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError

# transformers' strict configs wrap the TypeError of a field's type check and the ValueError of a class
# validator (StrictDataclassFieldValidationError, ...ClassValidationError); the message carries it.
CONFIG_ERRORS = (ValueError, StrictDataclassError)


def assert_grads_finite(model: torch.nn.Module) -> None:
    """After a backward pass every parameter has a finite gradient (RFA's causal-only gate exists in causal
    models only, so an encoder has no parameter without one)."""
    for name, param in model.named_parameters():
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


# How far an export may be from the eager model (largest absolute difference over every served output).
PROGRAM_TOLERANCE, ONNX_TOLERANCE = 1e-5, 1e-4


def check_export_matches(model, folder: Path | None, onnx: bool = True) -> None:
    """``torch.export`` and (``onnx``) ONNX Runtime against the eager model, on two input sizes the export did
    not trace (``hf_efficient.export.compare_sizes``: other batch sizes and sequence lengths / graph sizes):
    the program within PROGRAM_TOLERANCE, ONNX Runtime within ONNX_TOLERANCE. ``folder``: where the ONNX file
    goes."""
    from hf_efficient.export import (
        OnnxRuntimeModel,
        compare_sizes,
        export_onnx,
        export_program,
        max_difference,
        trace_sizes,
    )

    exported = export_program(model)
    traced, sizes = trace_sizes(model), compare_sizes(model)
    dims = {d for spec in exported.inputs for d in spec.shape if isinstance(d, str)}
    for size in sizes:  # every dynamic dimension at a size the trace did not see
        assert all(size[d] != traced[d] for d in dims if d in traced), (size, traced)
    assert max_difference(model, exported, sizes) <= PROGRAM_TOLERANCE
    if onnx:
        path = export_onnx(exported, Path(folder) / "model.onnx")
        assert max_difference(model, OnnxRuntimeModel(path, threads=1).run, sizes) <= ONNX_TOLERANCE
