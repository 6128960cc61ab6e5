"""Every text script takes every family's checkpoint with any attention type its positions allow (the
dispatch is ModelArguments.load_model's, once for all scripts), and the vision script takes DeiT's and
DINOv2's: one tiny run per family, each with the family's own tokenizer as users have it, trained here."""

from __future__ import annotations

import json

import pytest
from transformers import (
    DeiTForImageClassification,
    Dinov2ForImageClassification,
    DistilBertForMaskedLM,
    ElectraForSequenceClassification,
    ModernBertForSequenceClassification,
    RobertaForCausalLM,
    RobertaForSequenceClassification,
    XLMRobertaForQuestionAnswering,
)

from hf_efficient.data import load_digits_dataset

from ..models.text.families import TEXT_FAMILIES
from ..models.vision.families import VISION_FAMILIES
from .helpers import COMMON, run_in_process

WINDOW = ["--attention_type", "longformer", "--attention_config", '{"attention_window": 8}']
STEPS = ["--max_steps", "2", "--per_device_train_batch_size", "4", *COMMON]


def texts(data) -> list[str]:
    """The training sentences (Rotten Tomatoes), which the family tokenizers are trained on."""
    with open(data["train"]) as f:
        return [line.rsplit(",", 1)[0].strip('"') for line in f.readlines()[1:]]


def qa_file(folder, sentences: list[str]) -> str:
    """SQuAD-style records over ``sentences``: the answer is each context's first word."""
    path = folder / "qa.jsonl"
    rows = []
    for index, context in enumerate(sentences[:8]):
        word = context.split()[0]
        answers = {"text": [word], "answer_start": [0]}
        row = {"id": str(index), "question": "what comes first ?", "context": context}
        rows.append({**row, "answers": answers})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


# family -> (upstream head saved as the checkpoint, script, its flags beyond the model, data and steps)
TEXT_CASES = {
    "roberta": (RobertaForSequenceClassification, "finetune_glue", WINDOW),
    "xlm-roberta": (XLMRobertaForQuestionAnswering, "finetune_qa", ["--attention_type", "linear"]),
    "electra": (ElectraForSequenceClassification, "finetune_glue", ["--attention_type", "nystromformer"]),
    "distilbert": (DistilBertForMaskedLM, "pretrain_mlm", ["--attention_type", "performer"]),
    "modernbert": (ModernBertForSequenceClassification, "finetune_glue", ["--attention_type", "full"]),
}


def script_data(script: str, data, tmp_path, sentences) -> list[str]:
    if script == "finetune_glue":
        return ["--train_file", data["train"], "--validation_file", data["dev"], "--max_seq_length", "64"]
    if script == "finetune_qa":
        qa = qa_file(tmp_path, sentences)
        return ["--train_file", qa, "--validation_file", qa, "--max_seq_length", "64", "--doc_stride", "8"]
    return ["--train_files", data["corpus"], "--block_size", "64", "--validation_split_percentage", "20"]


@pytest.mark.parametrize("name", sorted(TEXT_CASES))
def test_each_text_family_runs_a_script(name, data, tmp_path, request):
    family, (upstream, script, flags) = TEXT_FAMILIES[name], TEXT_CASES[name]
    sentences = texts(data)
    labels = {"num_labels": 2} if script == "finetune_glue" else {}  # the sentences are positive or negative
    family.saved_with_tokenizer(upstream, tmp_path / "checkpoint", sentences, **labels)
    main = request.getfixturevalue(script).main
    args = ["--model_name_or_path", str(tmp_path / "checkpoint"), "--output_dir", str(tmp_path / "out")]
    main([*args, *script_data(script, data, tmp_path, sentences), *flags, *STEPS])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == f"efficient_{name}"
    assert config["attention_type"] == flags[1]
    # the tokenizer saved beside it cuts at the tokens the positions hold: RoBERTa's 66 rows hold 64
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["model_max_length"] == 64
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_pretrain_clm_and_fill_mask_take_a_roberta(pretrain_clm, fill_mask, pretrain_mlm, data, tmp_path):
    """A RoBERTa causal LM trains with linear attention; a RoBERTa masked LM pretrained by the script fills
    RoBERTa's <mask>."""
    family, sentences = TEXT_FAMILIES["roberta"], texts(data)
    family.saved_with_tokenizer(RobertaForCausalLM, tmp_path / "clm", sentences)
    args = ["--model_name_or_path", str(tmp_path / "clm"), "--output_dir", str(tmp_path / "clm_out")]
    pretrain_clm.main([*args, "--train_files", data["corpus"], "--block_size", "32", *STEPS[:-len(COMMON)],
                       "--attention_type", "linear", *COMMON])  # fmt: skip
    assert json.loads((tmp_path / "clm_out" / "config.json").read_text())["model_type"] == "efficient_roberta"
    results = fill_mask.main(["--model", str(tmp_path / "clm_out"), "--top_k", "2", "a <mask> film ."])
    assert len(results[0]) == 2


def test_a_type_the_family_refuses_is_one_line(finetune_glue, data, tmp_path, capsys):
    """ModernBERT's rotary positions refuse Linformer: exit status 2, the type and the family named."""
    family = TEXT_FAMILIES["modernbert"]
    family.saved_with_tokenizer(ModernBertForSequenceClassification, tmp_path / "checkpoint", texts(data))
    args = ["--model_name_or_path", str(tmp_path / "checkpoint"), "--output_dir", str(tmp_path / "out")]
    args += ["--train_file", data["train"], "--attention_type", "linformer", *STEPS]
    status, stderr = run_in_process("finetune_glue", args, capsys)
    last = stderr.strip().splitlines()[-1]  # above it: datasets' progress bar of the CSV read first
    assert status == 2 and "Traceback" not in stderr, stderr
    assert last.startswith("error: ") and "the modernbert family refuses" in last
    assert "attention_type 'linformer' cannot carry rotary positions" in last and "Types that can: " in last


@pytest.mark.parametrize(
    "name, upstream", [("deit", DeiTForImageClassification), ("dinov2", Dinov2ForImageClassification)]
)
def test_each_vision_family_finetunes(name, upstream, finetune_image_classification, tmp_path):
    family = VISION_FAMILIES[name]
    family.config(upstream)  # the tiny sizes, 16x16 RGB images
    model = upstream(family.config(upstream))
    model.save_pretrained(tmp_path / "checkpoint")
    digits = load_digits_dataset()["train"]
    for index in range(16):
        row = digits[index]
        folder = tmp_path / "images" / str(row["label"] % 2)
        folder.mkdir(parents=True, exist_ok=True)
        row["image"].save(folder / f"{index}.png")
    args = ["--model_name_or_path", str(tmp_path / "checkpoint"), "--output_dir", str(tmp_path / "out")]
    args += ["--train_dir", str(tmp_path / "images"), "--ignore_mismatched_sizes", "true"]
    args += ["--attention_type", "nystromformer", "--validation_split_percentage", "25", *STEPS]
    finetune_image_classification.main(args)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == f"efficient_{name}" and config["attention_type"] == "nystromformer"
