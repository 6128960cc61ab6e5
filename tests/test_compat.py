"""hf_efficient.compat: every private torch / transformers name it relies on still exists in the installed
release (an upgrade that removes one fails here, not silently in the fallback), and each fallback works."""

from __future__ import annotations

import importlib
import inspect
import logging

import pytest
import torch
import transformers.modeling_utils
from transformers import PreTrainedModel

from hf_efficient import compat

# ---- torch: saved-tensor hooks and export; transformers: loading, config and Trainer ----


def test_saved_tensor_hooks_query_exists():
    assert callable(getattr(torch._C._autograd, compat.TOP_SAVED_TENSORS_HOOKS, None))


def test_saved_tensor_hooks_active_sees_outer_hooks():
    assert not compat.saved_tensor_hooks_active()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert compat.saved_tensor_hooks_active()
    with torch.autograd.graph.save_on_cpu():
        assert compat.saved_tensor_hooks_active()
    assert not compat.saved_tensor_hooks_active()


def test_saved_tensor_hooks_fallback_says_active(monkeypatch):
    """Without torch's query a caller must step aside (as under someone else's hooks)."""
    monkeypatch.delattr(torch._C._autograd, compat.TOP_SAVED_TENSORS_HOOKS)
    assert compat.saved_tensor_hooks_active()


def test_loading_steps_exist_with_the_expected_arguments():
    adjust = inspect.signature(getattr(PreTrainedModel, compat.ADJUST_KEYS))
    assert list(adjust.parameters) == ["self", "loading_info"]
    finalize = inspect.getattr_static(PreTrainedModel, compat.FINALIZE_LOADING)
    assert isinstance(finalize, staticmethod)
    assert list(inspect.signature(finalize).parameters) == ["model", "load_config", "loading_info"]
    # from_pretrained marks what it loaded with this flag (read by compat.loaded_from_checkpoint)
    assert f'"{compat.LOADED_FLAG}"' in inspect.getsource(transformers.modeling_utils)


def test_efficient_models_have_the_loading_hooks():
    from hf_efficient.modeling.pretrained import EfficientPreTrainedModel

    for name in (compat.ADJUST_KEYS, compat.FINALIZE_LOADING):
        assert getattr(EfficientPreTrainedModel, name) is not getattr(PreTrainedModel, name)


def test_hooks_route_loading_and_report_through_the_given_functions(tmp_path, caplog):
    from hf_efficient import EfficientBertConfig, EfficientBertModel

    config = EfficientBertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    EfficientBertModel(config).save_pretrained(tmp_path)
    calls = []

    class Hooked(EfficientBertModel):
        pass

    def adjust(model, info):
        calls.append(("adjust", type(model).__name__, set(info.missing_keys)))

    def finalize(model, load_config, info, default):
        calls.append(("finalize", type(model).__name__))
        return default(model, load_config, info)

    assert compat.hook_model_loading(Hooked, adjust, finalize)
    with caplog.at_level(logging.WARNING):
        model, info = Hooked.from_pretrained(tmp_path, output_loading_info=True)
    # finalize wraps transformers' end of loading, which adjusts the keys
    assert [c[:2] for c in calls] == [("finalize", "Hooked"), ("adjust", "Hooked")]
    assert calls[1][2] == set() and not info["missing_keys"]


def test_loading_hooks_fallback_installs_nothing(monkeypatch):
    monkeypatch.delattr(PreTrainedModel, compat.ADJUST_KEYS)

    class Plain(PreTrainedModel):
        pass

    assert not compat.hook_model_loading(Plain, lambda *a: None, lambda *a: None)
    assert compat.FINALIZE_LOADING not in vars(Plain)


@pytest.mark.parametrize("flag", [True, False, None])
def test_loaded_from_checkpoint_reads_the_flag(flag):
    tensor = torch.zeros(2)
    if flag is not None:
        setattr(tensor, compat.LOADED_FLAG, flag)
    assert compat.loaded_from_checkpoint(tensor) is bool(flag)


def test_attn_implementation_property_exists():
    from transformers import PretrainedConfig

    assert isinstance(inspect.getattr_static(PretrainedConfig, compat.ATTN_IMPLEMENTATION), property)
    config = PretrainedConfig()
    config._attn_implementation = "eager"
    assert compat.attn_implementation(config) == "eager"
    assert compat.attn_implementation(object()) is None  # the fallback


def test_size_oblivious_setting_exists_and_is_patched():
    module, setting = compat.SIZE_OBLIVIOUS
    config = importlib.import_module(module)
    before = getattr(config, setting)
    with compat.size_oblivious_tracing():
        assert getattr(config, setting) is True
    assert getattr(config, setting) == before


def test_size_oblivious_fallback_is_a_no_op(monkeypatch):
    monkeypatch.setattr(compat, "SIZE_OBLIVIOUS", ("torch.fx.experimental._config", "no_such_setting"))
    with compat.size_oblivious_tracing():
        pass
    monkeypatch.setattr(compat, "SIZE_OBLIVIOUS", ("no_such_module_here", "backed_size_oblivious"))
    with compat.size_oblivious_tracing():
        pass


def test_trainer_steps_exist_with_the_expected_arguments():
    from transformers import Trainer

    expected = {
        compat.TRAINER_SAVE: ["self", "output_dir", "state_dict"],
        compat.TRAINER_SAVE_CHECKPOINT: ["self", "model", "trial"],
        compat.TRAINER_PREPARE_INPUTS: ["self", "inputs"],
        compat.TRAINER_OUTPUT_DIR: ["self", "trial"],
    }
    for name, parameters in expected.items():
        assert list(inspect.signature(getattr(Trainer, name)).parameters) == parameters, name
    remove = inspect.signature(getattr(Trainer, compat.TRAINER_REMOVE_UNUSED_COLUMNS)).parameters
    assert list(remove)[:3] == ["self", "dataset", "description"]


def test_efficient_trainer_has_the_saving_hooks():
    from transformers import Trainer

    from hf_efficient.training import EfficientTrainer

    for name in (compat.TRAINER_SAVE, compat.TRAINER_SAVE_CHECKPOINT):
        assert getattr(EfficientTrainer, name) is not getattr(Trainer, name)


def test_trainer_helper_fallbacks():
    """Without Trainer's helpers: tensors moved to the device, output_dir, the dataset unchanged."""
    from types import SimpleNamespace

    trainer = SimpleNamespace(args=SimpleNamespace(device=torch.device("cpu"), output_dir="out"))
    batch = compat.trainer_prepare_inputs(trainer, {"input_ids": torch.ones(2, dtype=torch.long), "n": 3})
    assert batch["n"] == 3 and batch["input_ids"].device.type == "cpu"
    assert compat.trainer_output_dir(trainer, None) == "out"
    dataset = [1, 2]
    assert compat.trainer_model_columns(trainer, dataset, "probe") is dataset


# ---- end of the saved-tensor hooks, loading, config, export and Trainer block ----


# ---- torch: softmax backward (BigBird's native kernels) ----


def test_softmax_backward_is_torchs_fused_op_and_its_fallback_agrees(monkeypatch):
    assert compat._SOFTMAX_BACKWARD is torch._softmax_backward_data, "torch._softmax_backward_data is gone"
    scores = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(scores, -1)
    grad = torch.randn_like(probs)
    (expected,) = torch.autograd.grad(probs, scores, grad)
    probs = probs.detach()
    out = torch.empty_like(probs)
    for got in (
        compat.softmax_backward(grad, probs, -1),
        compat.softmax_backward(grad, probs, -1, out=out),
        compat._softmax_backward_public(grad, probs, -1),
        compat._softmax_backward_public(grad, probs, -1, torch.empty_like(probs)),
    ):
        torch.testing.assert_close(got, expected)
    assert compat.softmax_backward(grad, probs, -1, out=out).data_ptr() == out.data_ptr()
    monkeypatch.setattr(compat, "_SOFTMAX_BACKWARD", None)  # a release without it
    torch.testing.assert_close(compat.softmax_backward(grad, probs, -1, out=out), expected)


# ---- torch: CPU flash attention ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"],
)
def test_cpu_flash_attention_ops_exist(name):
    """Fails when a torch upgrade removes the private op: Longformer's native kernel would quietly fall
    back to the public sdpa with plain autograd (slower, more memory in backward)."""
    assert hasattr(torch.ops.aten, name)
    assert compat.HAS_CPU_FLASH


def _flash_inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8, generator=g, dtype=torch.float64).float() for _ in range(3))
    allowed = torch.rand(3, 1, 5, 5, generator=g) < 0.6
    allowed |= torch.eye(5, dtype=torch.bool)  # every row allows a key
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    return q, k, v, mask


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "fallback"])
def test_cpu_flash_attention_equals_attention_and_its_gradients(fused, monkeypatch):
    """Forward (output and log-sum-exp) and backward of the wrappers, through torch's fused op and
    through the plain-maths fallback, equal autograd through the public scaled_dot_product_attention."""
    monkeypatch.setattr(compat, "HAS_CPU_FLASH", fused)
    q, k, v, mask = _flash_inputs()
    scale = 0.3
    out, lse = compat.cpu_flash_attention(q, k, v, mask, scale)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask, scale=scale)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ((q @ k.transpose(-1, -2)) * scale + mask).logsumexp(-1))
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = compat.cpu_flash_attention_backward(grad_out, q, k, v, out, lse, mask, scale)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-5)


# ---- end: torch: CPU flash attention -----------------------------------------------------------------


# ---- torch: tensor version counter (the edge kernel's pattern cache) ----


def test_tensor_version_is_the_in_place_counter_and_its_fallback_never_repeats():
    t = torch.zeros(3)
    before = compat.tensor_version(t)
    assert before == t._version, "Tensor._version is gone"
    t.add_(1)
    assert compat.tensor_version(t) == t._version != before
    stand_in = object()  # a release whose tensors have no counter
    assert compat.tensor_version(stand_in) != compat.tensor_version(stand_in)


# ---- torch: module hooks ----


def test_runs_plain_forward_sees_every_kind_of_hook(monkeypatch):
    """A module's own forward hooks, global ones, and a forward replaced on the instance (accelerate's way)
    each make it not plain; without torch's attributes it is not plain either."""
    module = torch.nn.Linear(2, 2)
    assert compat.runs_plain_forward(module)
    handle = module.register_forward_pre_hook(lambda module, args: None)
    assert not compat.runs_plain_forward(module)
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)
    assert not compat.runs_plain_forward(module)
    handle.remove()
    assert compat.runs_plain_forward(module)
    module.forward = lambda x: x
    assert not compat.runs_plain_forward(module)
    monkeypatch.delattr(torch.nn.modules.module, compat.GLOBAL_FORWARD_HOOKS[0])
    assert not compat.runs_plain_forward(torch.nn.Linear(2, 2))


# ---- transformers: Auto-class registration and hub uploads ----


def test_auto_class_and_upload_names_exist_and_hiding_restores_registration(tmp_path):
    from transformers import AutoModelForMaskedLM
    from transformers.utils import PushToHubMixin

    from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM

    assert hasattr(PushToHubMixin, "_get_files_timestamps") and hasattr(
        PushToHubMixin, "_upload_modified_files"
    )
    assert EfficientBertConfig in compat.auto_model_mapping(AutoModelForMaskedLM)
    assert compat.auto_class_of(EfficientBertForMaskedLM) is None
    model = EfficientBertForMaskedLM(
        EfficientBertConfig(
            hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, vocab_size=20
        )
    )
    model.register_for_auto_class("AutoModelForMaskedLM")
    try:
        with compat.auto_class_hidden(model):
            assert compat.auto_class_of(type(model)) is None
        assert compat.auto_class_of(type(model)) == "AutoModelForMaskedLM"
    finally:
        del type(model)._auto_class
    (tmp_path / "f.txt").write_text("x")
    assert set(compat.files_timestamps(model, tmp_path)) == {"f.txt"}


def test_removed_pipeline_tasks_table_exists_and_question_answering_is_ours():
    """transformers 5 refuses the tasks of this table by name; hf_efficient takes question-answering out of
    it and registers its own pipeline (the test fails if the table goes: the fallback then applies)."""
    from transformers import pipelines

    from hf_efficient.models.text.question_answering import QuestionAnsweringPipeline

    assert isinstance(getattr(pipelines, compat.REMOVED_PIPELINE_TASKS), dict)
    assert "question-answering" not in pipelines.REMOVED_TASKS
    assert pipelines.check_task("question-answering")[1]["impl"] is QuestionAnsweringPipeline
