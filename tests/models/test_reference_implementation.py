"""``attention_config["implementation"] = "reference"`` in every model class and head, for every type it
takes: the mechanism's maths in one piece gives the default kernels' loss and gradients (float32, to 1e-5).
The kernels themselves are compared with their references core by core in tests/attention/test_kernels.py;
this checks that the setting travels from a model's config to every core (global and local attention, the
MAE decoder) and that nothing around the cores depends on the path taken."""

from __future__ import annotations

import copy

import pytest
import torch

from .test_mixed_precision import CASES, HEADS

# The edit loop (`make test-fast`) runs every type on one head per encoder (BERT's masked LM, ViT's image
# classifier, ViT-MAE with its decoder, the graph classifier) and every other head on its first type; the
# other head x type pairs are `slow` (make test): the same encoder's cores under another head, whose maths per
# type is test_kernels.py's (every kernel against its reference, causal forms included) in the fast loop too.
EVERY_TYPE_HEADS = ("masked_lm", "image_classification", "mae_pretraining", "graph_classification")
REFERENCE_CASES = [
    pytest.param(
        head, t, marks=() if head in EVERY_TYPE_HEADS or t == HEADS[head].types()[0] else pytest.mark.slow
    )
    for head, t in CASES
]


def _with_reference(config):
    config = copy.deepcopy(config)
    config.attention_config = {**(config.attention_config or {}), "implementation": "reference"}
    return config


def _loss_and_gradients(model, batch):
    model.zero_grad()
    torch.manual_seed(0)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("head", "attention_type"), REFERENCE_CASES)
def test_reference_implementation_equals_the_default(head, attention_type):
    spec = HEADS[head]
    torch.manual_seed(0)
    model = spec.build(attention_type).eval()
    reference = type(model)(_with_reference(model.config)).eval()
    reference.load_state_dict(model.state_dict())
    cores = [m for m in reference.modules() if hasattr(m, "kernel_for")]
    assert cores and all(core.config.implementation == "reference" for core in cores)
    batch = spec.batch(model)
    loss, grads = _loss_and_gradients(model, batch)
    ref_loss, ref_grads = _loss_and_gradients(reference, batch)
    torch.testing.assert_close(ref_loss, loss, atol=1e-5, rtol=1e-5)
    assert ref_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(ref_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)
