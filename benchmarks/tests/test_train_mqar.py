"""benchmarks/tasks/train_mqar.py end to end on a tiny setting (a few steps): a bidirectional type and a
causal one write mqar_results.json with what benchmarks.studies.mqar and benchmarks.seeds read; the causal
form is refused for a type without one; every text type has MQAR settings that validate, or none to size."""

from __future__ import annotations

import json

import pytest

import hf_efficient
from benchmarks.tasks import train_mqar
from hf_efficient import validate_attention_config
from tests.attention.helpers import script_settings
from tests.scripts.helpers import COMMON

TINY = [
    *("--seq_len", "32", "--num_kv_pairs", "4", "--vocab_size", "64", "--hidden_size", "16"),
    *("--num_train", "64", "--num_validation", "16", "--num_test", "24", "--max_steps", "3"),
    *("--per_device_train_batch_size", "16", "--eval_strategy", "steps", "--eval_steps", "2"),
    *("--save_steps", "2", "--config_overrides", "num_attention_heads=2"),
]


@pytest.mark.parametrize(
    ("attention_type", "extra"),
    [("reformer_lsh", ["--attention_config", '{"chunk_length": 8}']), ("linear", ["--causal"])],
)
def test_train_mqar_writes_results(tmp_path, attention_type, extra):
    script = train_mqar
    output_dir = tmp_path / attention_type
    result = script.main(
        [*TINY, "--attention_type", attention_type, *extra, "--output_dir", str(output_dir), *COMMON]
    )
    saved = json.loads((output_dir / "mqar_results.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["attention_type"] == attention_type
    assert saved["formulation"] == ("causal" if "--causal" in extra else "bidirectional")
    # 4 queries per example: accuracies are whole counts of the 96 test and 64 validation queries
    assert round(saved["test_accuracy"] * 96, 6) in range(97)
    assert round(saved["eval_accuracy"] * 64, 6) in range(65)
    assert (saved["hidden_size"], saved["seq_len"], saved["num_kv_pairs"]) == (16, 32, 4)
    assert saved["model"]["intermediate_size"] == 32 and saved["model"]["num_hidden_layers"] == 2
    assert saved["steps"] == 3 and saved["seconds_per_step"] > 0 and saved["train_runtime"] > 0
    assert [step for step, _ in saved["eval_curve"]] == [2, 3]
    assert saved["data"]["seeds"] == {"train": 0, "validation": 20, "test": 10}
    assert any(output_dir.glob("checkpoint-*"))  # what --resume_from_checkpoint last continues from


def test_causal_form_refused_for_a_type_without_one(tmp_path):
    script = train_mqar
    with pytest.raises(ValueError, match="--causal needs an attention type with a causal form"):
        script.main(
            [*TINY, "--attention_type", "bigbird", "--causal", "--output_dir", str(tmp_path), *COMMON]
        )


def test_every_text_attention_type_has_mqar_settings_or_its_defaults():
    settings = script_settings("mqar")
    unsized = {"full", "linear"}  # no hyperparameter to size to the task
    assert set(hf_efficient.list_attention_types("text")) - set(settings) == unsized
    for name, entry in settings.items():
        validate_attention_config(name, entry["attention_config"])
