"""The libraries users bring, on our models (hf_efficient.clients, docs/clients.md): PEFT's default target
modules for every registered model type, LoRA and AutoPeft round trips that keep the attention type, and an
adapter whose base would be rebuilt with another attention refusing to reload."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from peft import AutoPeftModelForSequenceClassification, LoraConfig, get_peft_model
from peft.utils import constants as peft_constants
from transformers import BertConfig, BertForSequenceClassification

from hf_efficient import EfficientBertForSequenceClassification
from hf_efficient.clients import when_imported
from hf_efficient.models import REGISTERED_CONFIGS

from .models.text.helpers import TINY_BERT, tiny_config

LONGFORMER = {"attention_type": "longformer", "attention_config": {"attention_window": 4}}
IDS = torch.tensor([[2, 11, 12, 13, 14, 15, 16, 3], [2, 21, 22, 23, 3, 0, 0, 0]])
MASK = (IDS != 0).long()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS, attention_mask=MASK).logits


def lora(model, **options):
    with (
        warnings.catch_warnings()
    ):  # transformers 5's FutureWarning on is_gradient_checkpointing, read by PEFT
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(model, LoraConfig(task_type="SEQ_CLS", **options))


def test_every_registered_model_type_has_its_upstream_types_peft_defaults():
    """PEFT keyed its defaults by model_type and knew bert, not efficient_bert: LoraConfig(task_type=...)
    without target_modules raised "Please specify `target_modules` in `peft_config`"."""
    mappings = [m for n, m in vars(peft_constants).items() if n.startswith("TRANSFORMERS_MODELS_TO_")]
    found = 0
    for config_class in REGISTERED_CONFIGS:
        for mapping in filter(lambda m: isinstance(m, dict), mappings):
            upstream = next((t for t in config_class.compatible_model_types if t in mapping), None)
            assert mapping.get(config_class.model_type) == (mapping[upstream] if upstream else None)
            found += upstream is not None
    assert (
        found > 20
    )  # efficient_bert in every method's mapping bert is in (LoRA, IA3, ...), efficient_vit too
    model = lora(EfficientBertForSequenceClassification(tiny_config(num_labels=2)))
    adapted = {name.rsplit(".", 2)[-2] for name, _ in model.named_modules() if name.endswith("lora_A")}
    assert adapted == {"query", "value"}  # LoRA's defaults for bert


def test_when_imported_runs_after_the_import_or_at_once(tmp_path, monkeypatch):
    (tmp_path / "a_client_library.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("a_client_library", lambda module: seen.append(module.VALUE))
    assert seen == []
    import a_client_library  # noqa: F401

    when_imported("a_client_library", lambda module: seen.append(module.VALUE + 1))
    assert seen == [1, 2]
    monkeypatch.delitem(sys.modules, "a_client_library")


def test_lora_and_autopeft_keep_the_attention_type(tmp_path):
    """An adapter trained on a saved model reloads onto it: same attention type, same logits; merged, too."""
    EfficientBertForSequenceClassification(tiny_config("longformer", num_labels=2)).save_pretrained(
        tmp_path / "base"
    )
    base = EfficientBertForSequenceClassification.from_pretrained(tmp_path / "base")
    adapted = lora(base, init_lora_weights=False)  # random LoRA weights: the adapter changes the logits
    expected = logits(adapted)
    adapted.save_pretrained(tmp_path / "adapter")
    reloaded = AutoPeftModelForSequenceClassification.from_pretrained(tmp_path / "adapter")
    assert reloaded.base_model.model.config.attention_type == "longformer"
    torch.testing.assert_close(logits(reloaded), expected, rtol=0, atol=0)
    torch.testing.assert_close(logits(reloaded.merge_and_unload()), expected, rtol=1e-5, atol=1e-6)


def test_an_adapter_whose_base_would_lose_its_attention_refuses_to_reload(tmp_path):
    """A BERT checkpoint loaded with Longformer attention: its folder rebuilds BERT's exact attention, so
    AutoPeft's reload from the adapter's base path gave logits off by 1e-3, without a word."""
    sizes = {key: value for key, value in TINY_BERT.items() if key != "max_position_embeddings"}
    BertForSequenceClassification(BertConfig(**sizes, num_labels=2)).save_pretrained(tmp_path / "bert")
    model = EfficientBertForSequenceClassification.from_pretrained(tmp_path / "bert", **LONGFORMER)
    assert model.name_or_path.endswith(
        "bert (longformer attention, not saved there: save_pretrained this model and load it from that "
        "folder to rebuild it)"
    )
    lora(model).save_pretrained(tmp_path / "adapter")
    with pytest.raises(OSError, match=r"longformer attention, not saved there: save_pretrained this model"):
        AutoPeftModelForSequenceClassification.from_pretrained(tmp_path / "adapter")
    same = EfficientBertForSequenceClassification.from_pretrained(tmp_path / "bert")  # BERT's own attention
    assert same.name_or_path == str(tmp_path / "bert")
