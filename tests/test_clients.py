"""The libraries users bring, on our models (hf_efficient.clients, docs/clients.md): PEFT's default target
modules for every registered model type, LoRA and AutoPeft round trips that keep the attention type, an
adapter whose base would be rebuilt with another attention refusing to reload; sentence-transformers reading
a saved encoder with its pooling and length."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
import torch
from peft import AutoPeftModelForSequenceClassification, LoraConfig, get_peft_model
from peft.utils import constants as peft_constants
from sentence_transformers import SentenceTransformer
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertTokenizer,
    pipeline,
)

from hf_efficient import (
    EfficientBertForMaskedLM,
    EfficientBertForQuestionAnswering,
    EfficientBertForSequenceClassification,
    EfficientBertModel,
)
from hf_efficient.clients import when_imported
from hf_efficient.export import export_program, load_for_export
from hf_efficient.models.families import FAMILIES
from hf_efficient.training.checkpoints import check_resumes_same_attention

from .models.text.families import TEXT_FAMILIES
from .models.text.helpers import MINILM, TINY_BERT, tiny_config, write_vocab
from .models.vision.families import VISION_FAMILIES
from .processes import BLOCK_HF_EFFICIENT, run_python

MINILM_MODULES = ["Transformer", "Pooling", "Normalize"]  # all-MiniLM-L6-v2's sentence-transformers modules
LONGFORMER = {"attention_type": "longformer", "attention_config": {"attention_window": 4}}
IDS = torch.tensor([[2, 11, 12, 13, 14, 15, 16, 3], [2, 21, 22, 23, 3, 0, 0, 0]])
MASK = (IDS != 0).long()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS, attention_mask=MASK).logits


def quiet_peft(call, *args, **kwargs):
    """``call(*args, **kwargs)`` without the FutureWarning transformers 5 gives PEFT 0.21 for reading its
    deprecated ``is_gradient_checkpointing`` (on every model, transformers' own too: docs/clients.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return call(*args, **kwargs)


def lora(model, **options):
    return quiet_peft(get_peft_model, model, LoraConfig(task_type="SEQ_CLS", **options))


def test_every_registered_model_type_has_its_upstream_types_peft_defaults():
    """PEFT keyed its defaults by model_type and knew bert, not efficient_bert: LoraConfig(task_type=...)
    without target_modules raised "Please specify `target_modules` in `peft_config`"."""
    mappings = [m for n, m in vars(peft_constants).items() if n.startswith("TRANSFORMERS_MODELS_TO_")]
    found = 0
    for config_class in (family.config_class for family in FAMILIES.values()):
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
    reloaded = quiet_peft(AutoPeftModelForSequenceClassification.from_pretrained, tmp_path / "adapter")
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
    with pytest.warns(
        UserWarning, match=r"Could not find a config file in .*\(longformer attention, not saved"
    ):
        lora(model).save_pretrained(tmp_path / "adapter")  # PEFT says it already, when it saves the adapter
    with pytest.raises(OSError, match=r"longformer attention, not saved there: save_pretrained this model"):
        quiet_peft(AutoPeftModelForSequenceClassification.from_pretrained, tmp_path / "adapter")
    same = EfficientBertForSequenceClassification.from_pretrained(tmp_path / "bert")  # BERT's own attention
    assert same.name_or_path == str(tmp_path / "bert")


# ---------------------------------------------------------------------------------------------------------
# sentence-transformers
# ---------------------------------------------------------------------------------------------------------


def test_a_saved_encoder_is_an_embedder_with_its_checkpoints_pooling_and_its_length(tmp_path):
    """all-MiniLM-L6-v2 converted to Longformer over 1,024 positions and saved: sentence-transformers reads
    its mean pooling and normalisation (a plain folder got mean pooling only) and 1,024 tokens (the
    tokenizer's 512 otherwise), and embeds short texts as MiniLM does (the window covers them: exact)."""
    window = {"attention_window": 64, "global_token_indices": [0]}
    model = EfficientBertModel.from_pretrained(MINILM, attention_type="longformer", attention_config=window)
    model.resize_position_embeddings(1024)
    model.save_pretrained(tmp_path / "encoder")
    AutoTokenizer.from_pretrained(MINILM).save_pretrained(tmp_path / "encoder")
    embedder = SentenceTransformer(str(tmp_path / "encoder"), device="cpu")
    assert embedder.max_seq_length == 1024 and [type(m).__name__ for m in embedder] == MINILM_MODULES
    texts = ["a gripping, funny film", "two hours I will not get back"]
    expected = SentenceTransformer(str(MINILM), device="cpu").encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(embedder.encode(texts, convert_to_tensor=True), expected, rtol=0, atol=1e-5)
    tiny = EfficientBertModel(tiny_config("longformer"))  # not from a sentence-transformers checkpoint
    tiny.save_pretrained(tmp_path / "tiny")
    settings = json.loads((tmp_path / "tiny" / "sentence_bert_config.json").read_text())
    assert settings["max_seq_length"] == tiny.config.max_position_embeddings
    modules = json.loads((tmp_path / "tiny" / "modules.json").read_text())
    assert [m["type"].rpartition(".")[2] for m in modules] == ["Transformer", "Pooling"]
    EfficientBertForSequenceClassification(tiny_config(num_labels=2)).save_pretrained(tmp_path / "head")
    assert not (tmp_path / "head" / "modules.json").exists()  # a classifier is not an embedder


# ---------------------------------------------------------------------------------------------------------
# transformers' pipelines from remote code, where hf_efficient is not installed
# ---------------------------------------------------------------------------------------------------------

TEXT = "the cat sat on the mat and the dog ran under the tree"
# In a process where hf_efficient cannot be imported: each pipeline on the folder saved for it.
PIPELINES = """
import json, sys
from transformers import pipeline

folders, out = json.loads(sys.argv[1]), sys.argv[2]
results = {task: pipeline(task, model=folder, trust_remote_code=True) for task, folder in folders.items()}
results = {task: run(**INPUTS[task]) for task, run in results.items()}
results["hf_efficient_imported"] = any(name.split(".")[0] == "hf_efficient" for name in sys.modules)
json.dump(results, open(out, "w"))
"""
PIPELINE_INPUTS = {
    "fill-mask": {"inputs": "the cat [MASK] on the mat", "top_k": 3},
    "feature-extraction": {"inputs": TEXT},
    "text-classification": {"inputs": TEXT},
    "question-answering": {"question": "who sat on the mat ?", "context": TEXT},
}
AUTO_CLASSES = {
    "fill-mask": "AutoModelForMaskedLM",
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "question-answering": "AutoModelForQuestionAnswering",
}
PIPELINE_HEADS = {
    "fill-mask": EfficientBertForMaskedLM,
    "feature-extraction": EfficientBertModel,
    "text-classification": EfficientBertForSequenceClassification,
    "question-answering": EfficientBertForQuestionAnswering,
}


@pytest.mark.slow  # a fresh interpreter
def test_pipelines_run_from_remote_code_without_the_package(tmp_path):
    """transformers 5 removed pipeline("question-answering") and ours was registered by `import hf_efficient`
    only: a shared long-document QA model could not answer elsewhere. Its config.json now names our pipeline
    (custom_pipelines) in the remote code; the other tasks are transformers' own pipelines on our remote
    models. Each gives what it gives with hf_efficient imported."""
    tokenizer = BertTokenizer(vocab=str(write_vocab(tmp_path)))
    folders, expected = {}, {}
    for task, head in PIPELINE_HEADS.items():
        model = head(tiny_config("longformer", vocab_size=len(tokenizer), num_labels=2)).eval()
        model.register_for_auto_class(AUTO_CLASSES[task])
        folders[task] = str(tmp_path / task)
        model.save_pretrained(folders[task])
        tokenizer.save_pretrained(folders[task])
        expected[task] = pipeline(task, model=folders[task])(**PIPELINE_INPUTS[task])
    assert "custom_pipelines" in json.loads((tmp_path / "question-answering" / "config.json").read_text())
    script = BLOCK_HF_EFFICIENT + f"INPUTS = {PIPELINE_INPUTS!r}\n" + PIPELINES
    run_python(script, json.dumps(folders), tmp_path / "results.json")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results.pop("hf_efficient_imported") is False
    assert_same(results, json.loads(json.dumps(expected)))


def assert_same(got, expected, where: str = "") -> None:
    """``got`` is ``expected`` (nested dicts and lists of a pipeline's results), floats within 1e-5."""
    if isinstance(expected, dict):
        assert set(got) == set(expected), where
        for key in expected:
            assert_same(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), where
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), where
    else:
        assert got == expected, where


# ---------------------------------------------------------------------------------------------------------
# Every path that rebuilds a model keeps its attention type and its outputs
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow  # torch.export traces the model (20-30 s); the fast loop runs each client's own test above
def test_the_attention_type_survives_every_path_that_rebuilds_the_model(tmp_path):
    """One saved Longformer classifier, rebuilt by each path a user takes: from_pretrained through the Auto
    class, a run resuming from it (refused with another attention), AutoPeft's reload of an adapter, and
    transformers' from_pretrained of the adapter folder through its base path, a pipeline,
    sentence-transformers on its encoder, torch.export: each has its attention type and its outputs."""
    tokenizer = BertTokenizer(vocab=str(write_vocab(tmp_path)))
    config = tiny_config("longformer", vocab_size=len(tokenizer), num_labels=2)
    saved = EfficientBertForSequenceClassification(config).eval()
    expected = logits(saved)
    folder = tmp_path / "model"
    saved.save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    def check(model, got, path: str, atol: float = 0.0) -> None:
        assert model.config.attention_type == "longformer", path
        torch.testing.assert_close(got, expected, rtol=0, atol=atol, msg=path)

    rebuilt = AutoModelForSequenceClassification.from_pretrained(folder)
    check(rebuilt, logits(rebuilt), "from_pretrained")
    check_resumes_same_attention(rebuilt.config, folder)  # what a resumed run checks of its checkpoint
    with pytest.raises(ValueError, match='the checkpoint was trained with attention_type="longformer"'):
        check_resumes_same_attention(tiny_config("performer", vocab_size=len(tokenizer)), folder)

    adapted = lora(EfficientBertForSequenceClassification.from_pretrained(folder), init_lora_weights=False)
    expected = logits(adapted)  # the adapter's own logits: what its reloads must give
    adapted.save_pretrained(tmp_path / "adapter")
    reloaded = quiet_peft(AutoPeftModelForSequenceClassification.from_pretrained, tmp_path / "adapter")
    check(reloaded.base_model.model, logits(reloaded), "AutoPeft")
    through_base = quiet_peft(AutoModelForSequenceClassification.from_pretrained, tmp_path / "adapter")
    check(through_base, logits(through_base), "from_pretrained of the adapter folder")

    expected = logits(saved)
    classify = pipeline("text-classification", model=str(folder), top_k=None)
    (scores,) = classify([tokenizer.decode(IDS[0], skip_special_tokens=True)])
    probabilities = torch.tensor(
        [next(s["score"] for s in scores if s["label"] == f"LABEL_{i}") for i in (0, 1)]
    )
    torch.testing.assert_close(probabilities, expected[0].softmax(-1), rtol=0, atol=1e-6)
    assert classify.model.config.attention_type == "longformer"

    saved.bert.save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "encoder")
    embedder = SentenceTransformer(str(tmp_path / "encoder"), device="cpu")
    assert embedder[0].auto_model.config.attention_type == "longformer"
    hidden = saved.bert(input_ids=IDS[:1]).last_hidden_state.mean(1)
    embedded = embedder.encode(tokenizer.decode(IDS[0], skip_special_tokens=True), convert_to_tensor=True)
    torch.testing.assert_close(embedded, hidden[0], rtol=0, atol=1e-5)

    exported = export_program(load_for_export(folder))
    inputs = {"input_ids": IDS, "attention_mask": MASK, "token_type_ids": torch.zeros_like(IDS)}
    check(load_for_export(folder), exported(**inputs)["logits"], "export", 1e-5)


# ---------------------------------------------------------------------------------------------------------
# every family: sentence-transformers past 512 tokens, LoRA on its parameter names
# ---------------------------------------------------------------------------------------------------------

FAMILY_SENTENCES = ["a gripping , funny film with a great cast", "two hours i will not get back"] * 8
LONG_TEXT = " ".join(["the cast is great and the film is funny"] * 80)  # about 720 words


@pytest.mark.parametrize("name", list(TEXT_FAMILIES))
def test_each_text_family_saves_an_embedder_that_reads_past_512_tokens(name, tmp_path):
    """Our encoder of each family (Longformer attention, 1,024 positions), saved with the family's tokenizer:
    SentenceTransformer(folder) embeds with it, reading a 700-word text whole (no 512-token cut)."""
    family = TEXT_FAMILIES[name]
    upstream = next(cls for cls in family.heads if family.heads[cls].endswith("Model"))
    offset = 2 if family.pad_token_id == 1 else 0  # RoBERTa's positions start after the padding row
    tokenizer = family.saved_with_tokenizer(
        upstream, tmp_path / "upstream", FAMILY_SENTENCES, max_position_embeddings=1024 + offset
    )
    window = {"attention_window": 16}
    model = family.ours(upstream).from_pretrained(
        tmp_path / "upstream", attention_type="longformer", attention_config=window
    )
    model.save_pretrained(tmp_path / "encoder")
    tokenizer.model_max_length = 1024
    tokenizer.save_pretrained(tmp_path / "encoder")
    embedder = SentenceTransformer(str(tmp_path / "encoder"), device="cpu")
    assert embedder.max_seq_length == 1024
    assert len(tokenizer(LONG_TEXT)["input_ids"]) > 600
    assert embedder.tokenize([LONG_TEXT])["input_ids"].shape[1] > 600  # not cut at 512 tokens
    embeddings = embedder.encode([LONG_TEXT, "a funny film"], convert_to_tensor=True)
    assert embeddings.shape == (2, model.config.hidden_size) and torch.isfinite(embeddings).all()
    assert embedder[0].auto_model.config.attention_type == "longformer"


# LoRA's target modules for the families PEFT has no default for (docs/families.md says the same)
LORA_TARGETS = {"distilbert": ["q_lin", "v_lin"], "modernbert": ["Wqkv"]}
LORA_CASES = [("text", name) for name in TEXT_FAMILIES] + [("vision", n) for n in ("deit", "dinov2")]


@pytest.mark.parametrize("modality, name", LORA_CASES)
def test_lora_adapts_each_familys_attention(modality, name, tmp_path):
    """LoRA on each family's own parameter names: PEFT's default targets where its upstream type has them
    (RoBERTa's, XLM-R's, ELECTRA's query/value), else the documented ones (DistilBERT's q_lin/v_lin,
    ModernBERT's Wqkv, query/value for DeiT and DINOv2, whose upstream types PEFT has no default for)."""
    families = TEXT_FAMILIES if modality == "text" else VISION_FAMILIES
    family = families[name]
    upstream = next(cls for cls in family.heads if "Classification" in cls.__name__)
    upstream(family.config(upstream)).save_pretrained(tmp_path / "upstream")
    model = family.ours(upstream).from_pretrained(tmp_path / "upstream")
    lora_mapping = peft_constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    default = lora_mapping.get(model.config.model_type)
    targets = LORA_TARGETS.get(name, None if default else ["query", "value"])
    assert (default is None) == (targets is not None), f"{name}: PEFT's default {default}, ours {targets}"
    options = {"target_modules": targets} if targets else {}
    # an image classifier takes pixel_values: no task_type (PEFT's sequence classifier passes input_ids)
    config = LoraConfig(task_type="SEQ_CLS", **options) if modality == "text" else LoraConfig(**options)
    adapted = quiet_peft(get_peft_model, model, config)
    names = {n.rsplit(".", 2)[-2] for n, _ in adapted.named_modules() if n.endswith("lora_A")}
    assert names == set(targets or default)
    inputs = family.inputs(upstream) if modality == "vision" else family.inputs(family.ours(upstream))[0]
    assert adapted(**inputs).logits.shape[0] > 0
