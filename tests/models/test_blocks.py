"""The shared blocks' memory savings in training (hf_efficient.modeling.memory): the feed-forward's
activation output is recomputed in backward instead of kept, and dropout keeps a 1-byte mask; gradients
stay those of the plain path."""

import gc
import weakref

import pytest
import torch

from hf_efficient import EfficientBertForMaskedLM, EfficientViTForImageClassification
from hf_efficient.modeling import memory
from hf_efficient.modeling.memory import CompactDropout

from .helpers import assert_same_gradients, parameter_gradients
from .text.helpers import batch
from .text.helpers import tiny_config as text_config
from .vision.helpers import images
from .vision.helpers import tiny_config as vision_config


@pytest.fixture(autouse=True)
def save_memory_on_every_size(monkeypatch):
    """The savings apply from 4M elements up; these tiny models must take that path too."""
    monkeypatch.setattr(memory, "MIN_ELEMENTS_TO_SAVE_MEMORY", 0)


def text_model_and_loss(device: str = "cpu"):
    model = EfficientBertForMaskedLM(text_config("full", hidden_dropout_prob=0.1)).train().to(device)
    ids, mask = (t.to(device) for t in batch())
    return model, lambda: model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss


def vision_model_and_loss(device: str = "cpu"):
    model = (
        EfficientViTForImageClassification(vision_config("full", hidden_dropout_prob=0.1)).train().to(device)
    )
    pixels, labels = images().to(device), torch.tensor([0, 1], device=device)
    return model, lambda: model(pixel_values=pixels, labels=labels).loss


def under_bfloat16_autocast(loss):
    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return loss()

    return run


def plain(loss):
    """The loss computed under a no-op saved-tensor hook, which turns the recompute off (the path taken
    when anyone else's hooks are active): every saved tensor kept as autograd would keep it."""

    def run():
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            return loss()

    return run


@pytest.mark.parametrize("make", [text_model_and_loss, vision_model_and_loss], ids=["post_norm", "pre_norm"])
def test_recomputed_activation_gives_the_plain_gradients(make):
    model, loss = make()
    # the same dropout masks in both runs: parameter_gradients pins the RNG before each
    assert_same_gradients(parameter_gradients(model, loss), parameter_gradients(model, plain(loss)))


def activations_alive_after_forward(model, run) -> tuple[int, int]:
    """(how many layers' act(pre) outputs are still alive after ``run()``'s forward, how many there were);
    then the backward, so the gradients are checked to flow."""
    outputs = []  # weak references to each layer's act(pre), (b, n, intermediate_size)
    handles = [
        layer.intermediate.intermediate_act_fn.register_forward_hook(
            lambda module, args, out: outputs.append(weakref.ref(out))
        )
        for layer in model.base_model.encoder.layer
    ]
    value = run()
    gc.collect()
    alive = sum(ref() is not None for ref in outputs)
    value.backward()
    for handle in handles:
        handle.remove()
    return alive, len(outputs)


@pytest.mark.parametrize("make", [text_model_and_loss, vision_model_and_loss], ids=["post_norm", "pre_norm"])
def test_activation_output_is_not_kept_for_backward(make):
    model, loss = make()
    assert activations_alive_after_forward(model, loss)[0] == 0  # recomputed in backward
    alive, count = activations_alive_after_forward(model, plain(loss))
    assert count == alive == model.config.num_hidden_layers  # the plain path keeps every one


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compact_dropout_keeps_a_bool_mask_and_the_dropout_maths(device):
    dropout = CompactDropout(0.25).train()
    x = torch.randn(200, 500, device=device, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = dropout(x)
    assert [t.dtype for t in saved] == [torch.bool]  # torch.nn.Dropout saves a float32 mask on CPU
    kept = y != 0
    assert 0.23 < 1 - kept.float().mean().item() < 0.27  # 100,000 draws of Bernoulli(0.25)
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.75)
    assert torch.equal(dropout.eval()(x), x)


@pytest.mark.gpu
@pytest.mark.parametrize("make", [text_model_and_loss, vision_model_and_loss], ids=["post_norm", "pre_norm"])
def test_savings_on_cuda_under_bfloat16_autocast(make):
    """The recompute and the 1-byte masks on a GPU in mixed precision (Trainer's --bf16): the same gradients
    as the plain path, and no activation output kept."""
    model, loss = make("cuda")
    loss = under_bfloat16_autocast(loss)
    assert_same_gradients(parameter_gradients(model, loss), parameter_gradients(model, plain(loss)))
    assert activations_alive_after_forward(model, loss)[0] == 0


def test_double_backward_through_the_recomputed_activation():
    """A gradient penalty (create_graph=True) differentiates through the recomputed act(pre) as well."""

    def penalty(loss_fn, model):
        loss = loss_fn()
        weight = model.bert.encoder.layer[0].output.dense.weight
        (grad,) = torch.autograd.grad(loss, weight, create_graph=True)
        return grad.pow(2).sum()

    model, loss = text_model_and_loss()
    assert_same_gradients(
        parameter_gradients(model, lambda: penalty(loss, model)),
        parameter_gradients(model, lambda: penalty(plain(loss), model)),
    )


def test_small_tensors_keep_the_plain_ops(monkeypatch):
    """Below the size threshold (where the plain ops were measured faster) the feed-forward keeps its
    activation."""
    monkeypatch.setattr(memory, "MIN_ELEMENTS_TO_SAVE_MEMORY", 10**9)
    model, loss = text_model_and_loss()
    assert activations_alive_after_forward(model, loss) == (model.config.num_hidden_layers,) * 2
