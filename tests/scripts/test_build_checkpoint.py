"""scripts/build_checkpoint.py: the zoo's recipes built end to end on a tiny BERT (two steps per training
stage, short blocks), then rerun (nothing redone), resumed, re-carded and refused where it must be; a tiny
RoBERTa masked LM built with ``--base_model`` (its offset positions, its own MLM head, its tokenizer files); a
ModernBERT's rotary positions extended; one real all-MiniLM-L6-v2 smoke build (``slow``), the only one whose
training stages run in fresh interpreters as users run them (the tiny builds run the same scripts' ``main``
in this process: :func:`stages_in_process`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    BertConfig,
    BertModel,
    ModernBertForMaskedLM,
    RobertaForMaskedLM,
)

from hf_efficient import (
    EfficientBertForMaskedLM,
    EfficientBertModel,
    EfficientModernBertForMaskedLM,
    EfficientRobertaForMaskedLM,
    EfficientRobertaModel,
)
from hf_efficient.errors import InputError

from ..models.text.families import TEXT_FAMILIES
from ..models.text.helpers import MINILM
from ..processes import BLOCK_HF_EFFICIENT, run_python
from ..script_loader import load_script

NAME = "minilm-l6-longformer-4096"
TINY_POSITIONS, LONG = 64, 128
BUILT = f"tiny-bert-longformer-{LONG}"  # the recipe from tiny_bert at LONG positions: folder and card name


def small_budget(base_model: str, long: int, short: int, texts: int = 40) -> list[str]:
    """--set overrides: two steps per training stage, blocks of ``short`` and ``long`` tokens, the first
    ``texts`` IMDB reviews (a tenth held out: enough for two long blocks)."""
    values = {
        "base_model": base_model,
        "max_position_embeddings": long,
        "attention_config.attention_window": 8,
        "data.max_train_texts": texts,
        "data.held_out_percentage": 10,
        "distill.block_size": short,
        "distill.max_steps": 2,
        "distill.per_device_train_batch_size": 2,
        "distill.save_steps": 1,
        "mlm.block_size": long,
        "mlm.max_steps": 2,
        "mlm.save_steps": 1,
        "evaluate.lengths": [short, long],
        "evaluate.tokens": 2 * long,
        "evaluate.batch_tokens": 2 * long,
    }
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


SENTENCES = [  # what the tiny families' tokenizers are trained on (byte-level BPE reads any text)
    "a gripping , funny film with a great cast",
    "two hours i will not get back , and a story that goes nowhere",
    "the plot is thin but the actors give it their all",
] * 4


@pytest.fixture(scope="module")
def builder():
    return load_script("build_checkpoint")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """A tiny BERT (hidden 32, 2 layers, 64 positions) with MiniLM's tokenizer, saved as a BERT checkpoint."""
    folder = tmp_path_factory.mktemp("models") / "tiny_bert"
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_POSITIONS,
    )  # fmt: skip
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(MINILM).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def built(builder, stages_in_process, tiny_bert, tmp_path_factory):
    """(output folder, overrides) of a finished tiny build."""
    output = tmp_path_factory.mktemp("zoo") / BUILT
    overrides = small_budget(tiny_bert, LONG, 32)
    builder.build(NAME, str(output), overrides, write_card_to=None)
    return output, overrides


# In a fresh interpreter where importing hf_efficient raises: the folder's own code (hfe_*.py) must load it.
LOAD_REMOTE = """
import json, sys
from transformers import AutoModelForMaskedLM, AutoTokenizer
folder, out = sys.argv[1:]
model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)
json.dump({
    "module": type(model).__module__,
    "positions": model.config.max_position_embeddings,
    "mask_token": AutoTokenizer.from_pretrained(folder).mask_token,
    "hf_efficient_imported": any(name.split(".")[0] == "hf_efficient" for name in sys.modules),
}, open(out, "w"))
"""


@pytest.mark.slow  # the tiny build (~20 s) and a fresh interpreter
def test_final_folder_loads_through_remote_code_and_hf_efficient(built, tmp_path):
    output, _ = built
    final = output / "final"
    assert "AutoModelForMaskedLM" in json.loads((final / "config.json").read_text())["auto_map"]
    run_python(BLOCK_HF_EFFICIENT + LOAD_REMOTE, final, tmp_path / "out.json", env={"HF_HOME": str(tmp_path)})
    remote = json.loads((tmp_path / "out.json").read_text())
    assert remote["module"].startswith("transformers_modules.") and not remote["hf_efficient_imported"]
    assert remote["positions"] == LONG and remote["mask_token"] == "[MASK]"
    model = EfficientBertForMaskedLM.from_pretrained(final)
    assert model.config.max_position_embeddings == LONG
    assert model.config.attention_type == "longformer"
    assert type(AutoModelForMaskedLM.from_pretrained(final)) is EfficientBertForMaskedLM


@pytest.mark.slow  # the tiny build: two training stages (~20 s)
def test_extended_positions_copy_the_trained_table(built):
    """Right after the extension (before the masked-LM steps) rows 64..127 repeat rows 0..63."""
    output, _ = built
    distilled = EfficientBertModel.from_pretrained(output / "1-distill").get_position_embeddings().weight
    extended = EfficientBertModel.from_pretrained(output / "2-extend").get_position_embeddings().weight
    assert extended.shape[0] == LONG
    torch.testing.assert_close(extended[:TINY_POSITIONS], distilled)
    torch.testing.assert_close(extended[TINY_POSITIONS:], distilled[: LONG - TINY_POSITIONS])


@pytest.mark.slow  # the tiny build: two training stages (~20 s)
def test_card_holds_the_measured_numbers(built):
    output, _ = built
    results = json.loads((output / "4-evaluate" / "results.json").read_text())
    card = (output / "final" / "README.md").read_text()
    lengths = {(row["model"], row["length"]) for row in results["rows"]}
    reference = "tiny_bert encoder + this MLM head (reference)"
    assert lengths == {(BUILT, 32), (BUILT, LONG), (reference, 32)}
    for row in results["rows"]:
        assert f"{row['loss']:.4f}" in card and f"{row['perplexity']:.2f}" in card
    assert "base_model:" not in card  # a local base has no hub id to name (MiniLM's card: the smoke build)
    assert "trust_remote_code=True" in card
    assert "| masked LM max_steps | 2 |" in card  # the stages' budgets, without one run's TrainingArguments
    assert f"Positions {TINY_POSITIONS} to {LONG - 1} start as copies" in card  # the recipe's own limits
    # the command a reader reruns, overrides included, without the builder's own folder (kept in recipe.json)
    (command,) = [line for line in card.splitlines() if line.startswith("python scripts/build_checkpoint.py")]
    assert command.startswith(f"python scripts/build_checkpoint.py build {NAME} ")
    assert "--set=mlm.max_steps=2" in command and "--output_dir" not in command and str(output) not in card
    assert f"--output_dir {output}" in json.loads((output / "recipe.json").read_text())["command"]
    for stage in ("1-distill", "3-mlm"):
        seconds = json.loads((output / stage / "DONE.json").read_text())["seconds"]
        assert f"{stage} {seconds:.0f} s" in card


@pytest.mark.slow  # the tiny build: two training stages (~20 s)
def test_rerun_skips_finished_stages(builder, built, monkeypatch):
    output, overrides = built
    markers = {path: path.stat().st_mtime_ns for path in output.glob("*/DONE.json")}
    assert len(markers) == 4

    def no_training(*args, **kwargs):
        raise AssertionError(f"a stage was rerun: {args}")

    monkeypatch.setattr(builder, "run_training", no_training)
    monkeypatch.setattr(subprocess, "run", no_training)
    builder.build(NAME, str(output), overrides, write_card_to=None)
    assert {path: path.stat().st_mtime_ns for path in output.glob("*/DONE.json")} == markers


@pytest.mark.slow  # the tiny build: two training stages (~20 s)
def test_card_subcommand_rerenders_with_extra_results(builder, built, tmp_path):
    output, _ = built
    extra = output / "extra_results"
    extra.mkdir(exist_ok=True)
    table = {"title": "Long-document classification", "rows": [{"task": "imdb", "accuracy": "0.8765"}]}
    (extra / "classification.json").write_text(json.dumps(table))
    builder.main(["card", NAME, "--output_dir", str(output), "--write_card_to", str(tmp_path)])
    card = (output / "final" / "README.md").read_text()
    assert "Long-document classification" in card and "0.8765" in card
    assert (tmp_path / f"{BUILT}.md").read_text() == card


@pytest.mark.slow  # the tiny build: two training stages (~20 s)
def test_other_overrides_on_the_same_folder_are_refused(builder, built):
    output, overrides = built
    with pytest.raises(ValueError, match="another recipe"):
        builder.build(NAME, str(output), [*overrides, "mlm.max_steps=3"], write_card_to=None)


def test_extended_checkpoint_saves_a_tokenizer_of_its_length(builder, tiny_bert, tmp_path):
    """Stage 2 saves the tokenizer with the new length, so truncation=True (pipelines) cuts there, not at the
    base tokenizer's 512."""
    facts = builder.extend_positions(Path(tiny_bert), tmp_path / "2-extend", LONG)
    assert facts == {"positions_from": TINY_POSITIONS, "positions_to": LONG, "mlm_head": "new"}
    assert AutoTokenizer.from_pretrained(tiny_bert).model_max_length == 512
    assert AutoTokenizer.from_pretrained(tmp_path / "2-extend").model_max_length == LONG


def test_the_folder_is_named_by_the_positions_it_holds(builder, tmp_path):
    """A build at 1,024 positions goes to runs/zoo/minilm-l6-longformer-1024 by default; a folder named -4096
    for it is refused before any stage runs (issue 57: a -4096 folder held 1,024 positions)."""
    recipe = builder.load_recipe(NAME, ["max_position_embeddings=1024"])
    assert builder.output_folder(recipe, None) == Path("runs/zoo/minilm-l6-longformer-1024")
    assert builder.output_folder(builder.load_recipe(NAME), None) == Path(f"runs/zoo/{NAME}")
    assert builder.output_folder(recipe, str(tmp_path / "mine")) == tmp_path / "mine"
    with pytest.raises(InputError, match=r"its name says 4096 tokens, but this build holds 1024 positions"):
        builder.build(NAME, str(tmp_path / NAME), ["max_position_embeddings=1024"], write_card_to=None)
    assert not (tmp_path / NAME).exists()


def test_interrupted_stage_resumes_from_its_checkpoint(builder, tmp_path):
    recipe = builder.load_recipe(NAME)
    folder = tmp_path / "3-mlm"
    folder.mkdir()
    fresh = builder.training_command("pretrain_mlm.py", folder, "base", recipe, recipe["mlm"])
    assert "--overwrite_output_dir" in fresh and "--resume_from_checkpoint" not in fresh
    (folder / "checkpoint-25").mkdir()  # what a killed attempt left, no DONE.json
    resumed = builder.training_command("pretrain_mlm.py", folder, "base", recipe, recipe["mlm"])
    assert resumed[-2:] == ["--resume_from_checkpoint", "last"] and "--overwrite_output_dir" not in resumed


def test_unknown_name_and_key_errors(builder):
    with pytest.raises(ValueError, match="minilm-l6-performer-4096") as error:
        builder.load_recipe("minilm-l6-reformer")
    assert all(name in str(error.value) for name in builder.recipe_names())
    with pytest.raises(ValueError, match="no key 'mlm_steps'"):
        builder.load_recipe(NAME, ["mlm_steps=3"])


def test_every_recipe_names_five_attentions_at_4096(builder):
    names = builder.recipe_names()
    attentions = {builder.load_recipe(name)["attention_type"] for name in names}
    assert attentions == {"longformer", "bigbird", "performer", "nystromformer", "linear"}
    assert {builder.load_recipe(name)["max_position_embeddings"] for name in names} == {4096}


@pytest.mark.slow
def test_minilm_smoke_build(builder, tmp_path):
    """The real MiniLM through every stage, as docs/zoo.md's build command (4,096 positions) at the budget
    its docs test ran it with: two steps each, blocks of 64 and 1024 tokens. Over a minute: the 6-layer
    model at 1024 tokens, and the stages run in fresh interpreters."""
    output = tmp_path / NAME
    overrides = small_budget("all-MiniLM-L6-v2", 1024, 64, texts=120)
    overrides = [o for o in overrides if not o.startswith("max_position_embeddings=")]  # the recipe's 4096
    builder.build(NAME, str(output), overrides, write_card_to=None)
    model = EfficientBertForMaskedLM.from_pretrained(output / "final")
    assert model.config.max_position_embeddings == 4096 and model.config.hidden_size == 384
    card = (output / "final" / "README.md").read_text()
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in card and "uncased WordPiece" in card
    rows = json.loads((output / "4-evaluate" / "results.json").read_text())["rows"]
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in rows)


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory) -> Path:
    """transformers' tiny RoBERTa masked LM (66 position rows: 64 tokens past its two offset rows) with a
    byte-level BPE tokenizer, saved as users have one: a base with its own MLM head."""
    folder = tmp_path_factory.mktemp("models") / "My_RoBERTa"
    TEXT_FAMILIES["roberta"].saved_with_tokenizer(RobertaForMaskedLM, folder, SENTENCES)
    return folder


@pytest.mark.slow  # a tiny build: two training stages (~20 s)
def test_a_roberta_base_builds_with_its_offset_positions_head_and_tokenizer(
    builder, stages_in_process, tiny_roberta, tmp_path
):
    """``--base_model`` takes a RoBERTa: the folder is named after it, its table grows past the two offset
    rows (LONG tokens: LONG + 2 rows, the trained rows repeated after the offset), the MLM stage continues the
    base's own head, the reference row is the base itself, and final/ holds its tokenizer files."""
    overrides = [o for o in small_budget("unused", LONG, 32) if not o.startswith("base_model=")]
    recipe = builder.load_recipe(NAME, [f"base_model={json.dumps(str(tiny_roberta))}", *overrides])
    built_name = f"my-roberta-longformer-{LONG}"
    assert builder.output_folder(recipe, None) == Path("runs/zoo") / built_name  # named after its base
    output = tmp_path / built_name
    final = builder.build(NAME, str(output), overrides, None, base_model=str(tiny_roberta))
    distilled = EfficientRobertaModel.from_pretrained(output / "1-distill").get_position_embeddings().weight
    extended = EfficientRobertaModel.from_pretrained(output / "2-extend").get_position_embeddings().weight
    assert extended.shape[0] == LONG + 2
    torch.testing.assert_close(extended[: TINY_POSITIONS + 2], distilled)
    torch.testing.assert_close(extended[TINY_POSITIONS + 2 :], distilled[2 : LONG - TINY_POSITIONS + 2])
    base = RobertaForMaskedLM.from_pretrained(tiny_roberta)
    head = EfficientRobertaForMaskedLM.from_pretrained(output / "2-extend").lm_head
    torch.testing.assert_close(head.dense.weight, base.lm_head.dense.weight)  # the base's head, not a new one
    assert json.loads((output / "2-extend" / "DONE.json").read_text())["mlm_head"] == "base"

    model = AutoModelForMaskedLM.from_pretrained(final)
    assert type(model) is EfficientRobertaForMaskedLM and model.config.attention_type == "longformer"
    tokenizer = AutoTokenizer.from_pretrained(final)
    text = "two hours i will not get back"
    assert tokenizer(text).input_ids == AutoTokenizer.from_pretrained(tiny_roberta)(text).input_ids
    assert tokenizer.model_max_length == LONG and tokenizer.mask_token == "<mask>"
    rows = json.loads((output / "4-evaluate" / "results.json").read_text())["rows"]
    assert {row["model"] for row in rows} == {
        built_name,
        "My_RoBERTa with its own MLM head (reference)",
    }
    card = (final / "README.md").read_text()
    assert "continuing the base's own MLM head" in card and "RobertaTokenizer" in card
    assert f"inputs longer than {LONG} tokens ({LONG + 2} position rows) raise" in card
    assert "MiniLM" not in card.replace("in place of the recipe's MiniLM", "")
    command = json.loads((output / "recipe.json").read_text())["command"]
    assert f"--base_model {tiny_roberta}" in command


def test_a_modernbert_base_extends_its_rotary_positions_and_keeps_its_head(builder, tmp_path):
    """ModernBERT's rotary positions have no table: stage 2 sets the config's length (no error about a
    table to copy), and the masked LM keeps the base's head."""
    folder = tmp_path / "modernbert"
    TEXT_FAMILIES["modernbert"].saved_with_tokenizer(ModernBertForMaskedLM, folder, SENTENCES)
    facts = builder.extend_positions(folder, tmp_path / "2-extend", LONG, str(folder))
    assert facts == {"positions_from": TINY_POSITIONS, "positions_to": LONG, "mlm_head": "base"}
    model = EfficientModernBertForMaskedLM.from_pretrained(tmp_path / "2-extend")
    assert model.config.max_position_embeddings == LONG
    base = ModernBertForMaskedLM.from_pretrained(folder)
    torch.testing.assert_close(model.head.dense.weight, base.head.dense.weight)
    assert AutoTokenizer.from_pretrained(tmp_path / "2-extend").model_max_length == LONG


def test_a_missing_base_model_is_one_clear_error(builder, tmp_path):
    with pytest.raises(InputError, match=r"--base_model: no such folder"):
        builder.build(NAME, str(tmp_path / "out"), [], None, base_model=str(tmp_path / "nothing-here"))
    assert not (tmp_path / "out").exists()
