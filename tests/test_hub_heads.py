"""Remote code of the heads added beside BERT's and ViT's first ones (multiple choice, pretraining, next
sentence, masked image modeling) and of the other families (ELECTRA's generator, DistilBERT's classifier):
the ``auto_map`` a save with remote code writes names each under its Auto class, and a fresh process where
hf_efficient cannot be imported loads them by that Auto class with ``trust_remote_code=True`` and reproduces
their outputs (tests/test_hub.py covers the machinery on BERT's MLM)."""

from __future__ import annotations

import json

import pytest
import torch

from hf_efficient import (
    EfficientBertForMultipleChoice,
    EfficientBertForNextSentencePrediction,
    EfficientBertForPreTraining,
    EfficientDistilBertConfig,
    EfficientDistilBertForSequenceClassification,
    EfficientElectraConfig,
    EfficientElectraForMaskedLM,
    EfficientViTForMaskedImageModeling,
)
from hf_efficient.hub import flat_module_name

from .attention.helpers import small_config
from .models.text.families import DISTILBERT_SIZES, ELECTRA_SIZES
from .models.text.helpers import batch
from .models.text.helpers import tiny_config as text_config
from .models.vision.helpers import images
from .models.vision.helpers import tiny_config as vision_config
from .processes import BLOCK_HF_EFFICIENT, run_python


def pairs(ids_and_mask: tuple) -> dict:
    return dict(zip(("input_ids", "attention_mask"), ids_and_mask, strict=True))


# name: (Auto class, model class, its config, its inputs, the output fields compared)
HEADS = {
    "AutoModelForMultipleChoice": (
        "AutoModelForMultipleChoice",
        EfficientBertForMultipleChoice,
        lambda: text_config("longformer"),
        lambda: {name: t.reshape(2, 3, 20) for name, t in pairs(batch(b=6, lengths=[20, 9, 4] * 2)).items()},
        ("logits",),
    ),
    "AutoModelForPreTraining": (
        "AutoModelForPreTraining",
        EfficientBertForPreTraining,
        lambda: text_config("performer"),
        lambda: pairs(batch()),
        ("prediction_logits", "seq_relationship_logits"),
    ),
    "AutoModelForNextSentencePrediction": (
        "AutoModelForNextSentencePrediction",
        EfficientBertForNextSentencePrediction,
        lambda: text_config("linformer"),
        lambda: pairs(batch()),
        ("logits",),
    ),
    "AutoModelForMaskedImageModeling": (
        "AutoModelForMaskedImageModeling",
        EfficientViTForMaskedImageModeling,
        lambda: vision_config("swin_window", encoder_stride=4),
        lambda: {"pixel_values": images(), "bool_masked_pos": torch.arange(16).expand(2, -1) % 3 == 0},
        ("reconstruction", "loss"),
    ),
    "ElectraForMaskedLM": (  # embeddings projected (embedding_size 16, hidden 32), its own code file
        "AutoModelForMaskedLM",
        EfficientElectraForMaskedLM,
        lambda: EfficientElectraConfig(
            **ELECTRA_SIZES, attention_type="bigbird", attention_config=small_config("bigbird")
        ),
        lambda: pairs(batch()),
        ("logits",),
    ),
    "DistilBertForSequenceClassification": (  # DistilBERT's config and layer
        "AutoModelForSequenceClassification",
        EfficientDistilBertForSequenceClassification,
        lambda: EfficientDistilBertConfig(**DISTILBERT_SIZES, attention_type="linear"),
        lambda: pairs(batch()),
        ("logits",),
    ),
}

LOAD_AND_RUN = """
import importlib
import sys
import torch
import transformers

torch.set_num_threads(1)
out_path, *jobs = sys.argv[1:]
results = {}
for job in jobs:
    name, auto_name, folder, inputs_path = job.split("|")
    model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        output = model(**torch.load(inputs_path))
    results[name] = {"module": type(model).__module__, "class": type(model).__name__, **output}
results["hf_efficient_imported"] = any(name.split(".")[0] == "hf_efficient" for name in sys.modules)
torch.save(results, out_path)
"""


def saved_heads(folder) -> dict:
    """Each head, registered for its Auto class and saved (with remote code, as transformers' models) into
    its own folder: {name: (Auto class, folder, inputs file, model class, fields, expected outputs)}."""
    saved = {}
    for name, (auto_name, model_class, config, make_inputs, fields) in HEADS.items():
        torch.manual_seed(0)
        model = model_class(config()).eval()
        path = folder / model_class.__name__
        model_class.register_for_auto_class(auto_name)
        try:
            model.save_pretrained(path)
        finally:
            del model_class._auto_class  # back to the inherited None for the other tests
        inputs = make_inputs()
        torch.save(inputs, path / "inputs.pt")
        with torch.no_grad():
            expected = model(**inputs)
        saved[name] = (auto_name, path, path / "inputs.pt", model_class, fields, expected)
    return saved


def test_auto_map_names_every_new_head(tmp_path):
    for auto_name, path, _, model_class, _, _ in saved_heads(tmp_path).values():
        auto_map = json.loads((path / "config.json").read_text())["auto_map"]
        module = flat_module_name(model_class.__module__)  # hfe_models_text_modeling_efficient_bert, ...
        assert auto_map[auto_name] == f"{module}.{model_class.__name__}"
        assert (path / f"{module}.py").is_file()


@pytest.mark.slow  # a fresh interpreter
def test_new_heads_load_with_trust_remote_code_without_hf_efficient(tmp_path):
    saved = saved_heads(tmp_path)
    out = tmp_path / "out.pt"
    jobs = [f"{name}|{auto_name}|{path}|{inputs}" for name, (auto_name, path, inputs, *_) in saved.items()]
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    run_python(BLOCK_HF_EFFICIENT + LOAD_AND_RUN, out, *jobs, env=env, cwd=tmp_path)
    results = torch.load(out)
    assert results["hf_efficient_imported"] is False
    for name, (_, _, _, model_class, fields, expected) in saved.items():
        result = results[name]
        assert (
            result["module"].startswith("transformers_modules.") and result["class"] == model_class.__name__
        )
        for field in fields:  # 1e-9 apart: a loaded weight sits at another memory alignment
            torch.testing.assert_close(result[field], expected[field], atol=1e-6, rtol=1e-6, msg=field)


def test_model_card_loads_each_head_with_its_auto_class():
    from hf_efficient.training.model_card import build_model_card

    for auto_name, model_class, config, _, _ in HEADS.values():
        model = model_class(config())
        card = str(build_model_card(model, summary="A head.", data_description="None.", repo_id="user/head"))
        assert f'model = {auto_name}.from_pretrained("user/head")' in card, auto_name
