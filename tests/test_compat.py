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
