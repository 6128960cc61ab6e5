"""ListOps (LRA): the evaluator on hand-worked expressions, the generator's bounds and determinism, the data
and tokenizer, and benchmarks/tasks/train_listops.py end to end on tiny expressions (two attention types; the
summary of runs is benchmarks.studies.listops, tested in test_listops_summary.py)."""

from __future__ import annotations

import json
import multiprocessing
import random
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from transformers import AutoTokenizer

import hf_efficient
from benchmarks.tasks import train_listops
from benchmarks.tasks.listops import (
    CLOSE,
    OPERATORS,
    VOCAB,
    ListOpsSpec,
    build_listops_tokenizer,
    describe_listops,
    evaluate_listops,
    expression_depth,
    generate_expression,
    generate_listops,
    outer_operator_agreement,
    outer_operator_baseline,
    outer_operator_guesses,
    tokenize_listops,
)
from hf_efficient import validate_attention_config
from tests.attention.helpers import script_settings

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--report_to", "none", "--logging_steps", "1", "--seed", "0", "--dataloader_pin_memory", "false"]


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("7", 7),
        ("[MIN 3 1 4 ]", 1),
        ("[MAX 3 1 4 ]", 4),
        ("[MED 3 1 4 ]", 3),
        ("[MED 1 4 ]", 2),  # even count: floor of the mean of the two middle values, (1 + 4) // 2
        ("[MED 8 9 ]", 8),  # 8.5 rounded down
        ("[MED 9 0 2 7 ]", 4),  # sorted 0 2 7 9: (2 + 7) // 2
        ("[SM 7 8 9 ]", 4),  # 24 mod 10
        ("[SM 5 ]", 5),
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[SM 3 [MED 1 8 2 9 ] 7 ]", 5),  # MED = (2 + 8) // 2 = 5; 3 + 5 + 7 = 15
        ("[MIN [MAX 1 [SM 5 6 ] ] [MED 7 [MAX 8 2 ] 9 ] ]", 1),  # MIN(MAX(1, 1), MED(7, 8, 9)) = MIN(1, 8)
        ("[SM [SM 9 9 ] [MAX 0 [MIN 5 [MED 6 3 ] ] ] 5 ]", 7),  # 8 + MAX(0, MIN(5, 4)) + 5 = 17
    ],
)
def test_evaluator_on_hand_worked_expressions(expression, value):
    assert evaluate_listops(expression) == value
    assert evaluate_listops(expression.split()) == value  # token lists too


def test_median_of_digits_is_int_of_numpy_median():
    rng = random.Random(0)
    for _ in range(200):
        values = [rng.randrange(10) for _ in range(rng.randint(1, 8))]
        expression = "[MED " + " ".join(map(str, values)) + " ]"
        assert evaluate_listops(expression) == int(np.median(values))


@pytest.mark.parametrize("bad", ["[MAX 1 2", "[MAX 1 ] ]", "[MAX ]", "1 2", "[FOO 1 ]", ""])
def test_evaluator_rejects_malformed_expressions(bad):
    with pytest.raises(ValueError):
        evaluate_listops(bad)


def test_depth():
    assert expression_depth("4") == 0 and expression_depth("[MAX 1 2 ]") == 1
    assert expression_depth("[MAX 1 [MIN 2 [SM 1 1 ] ] [MED 3 4 ] ]") == 3


def _argument_counts(tokens: list[str]) -> list[int]:
    counts, stack = [], []
    for token in tokens:
        if stack and token != CLOSE:
            stack[-1] += 1
        if token in OPERATORS:
            stack.append(0)
        elif token == CLOSE:
            counts.append(stack.pop())
    return counts


@pytest.mark.parametrize(
    "spec",
    [ListOpsSpec(20, 60, max_depth=4, min_args=2, max_args=3), ListOpsSpec(500, 2000), ListOpsSpec(6, 6)],
)
def test_generator_respects_length_depth_and_arguments(spec):
    rng = random.Random(1)
    expressions = [generate_expression(rng, spec) for _ in range(20 if spec.max_length > 100 else 300)]
    for tokens in expressions:
        assert spec.min_length <= len(tokens) <= spec.max_length
        assert 1 <= expression_depth(tokens) <= spec.max_depth - 1  # the last level holds digits only
        assert all(spec.min_args <= n <= spec.max_args for n in _argument_counts(tokens))
        assert 0 <= evaluate_listops(tokens) <= 9
    if len(expressions) == 300 and spec.max_length - spec.min_length > 20:  # labels, lengths spread out
        labels = Counter(evaluate_listops(tokens) for tokens in expressions)
        assert len(labels) >= 8 and max(labels.values()) / len(expressions) < 0.3
        assert len({len(tokens) for tokens in expressions}) > 10  # of 34 reachable (20-53), low ones likelier


def _argument_kinds(tokens: list[str]) -> list[tuple[int, bool]]:
    """(level, is an operator) of every operator argument; the root is level 1."""
    kinds, level = [], 0
    for token in tokens:
        if token == CLOSE:
            level -= 1
            continue
        if level:
            kinds.append((level + 1, token in OPERATORS))
        if token in OPERATORS:
            level += 1
    return kinds


def test_generator_draws_nodes_as_lra_does():
    # With a range that keeps every tree with an operator at its root, nothing else is conditioned on:
    # an argument above the last level is an operator with probability operator_probability, one on the
    # last level never is, and argument counts are uniform over min_args..max_args (LRA: 0.25, 2-10).
    spec = ListOpsSpec(4, ListOpsSpec(4, 4, max_depth=4).longest(), max_depth=4)
    rng = random.Random(0)
    expressions = [generate_expression(rng, spec) for _ in range(1500)]
    kinds = [kind for tokens in expressions for kind in _argument_kinds(tokens)]
    above_last = [is_operator for level, is_operator in kinds if level < spec.max_depth]
    assert len(above_last) > 5000 and abs(np.mean(above_last) - 0.25) < 0.02
    assert not any(is_operator for level, is_operator in kinds if level == spec.max_depth)
    counts = Counter(n for tokens in expressions for n in _argument_counts(tokens))
    assert set(counts) == set(range(2, 11))
    assert max(counts.values()) / min(counts.values()) < 1.3
    # In range 500-1000 (most arguments digits, as in LRA): the outermost operator alone predicts far more
    # than the majority class (MIN -> 0 and MAX -> 9 over several top-level digits).
    data = generate_listops(ListOpsSpec(500, 1000), {"train": 400, "test": 200}, seed=0)
    by_operator = {op: Counter() for op in OPERATORS}
    for source, label in zip(data["train"]["source"], data["train"]["label"], strict=True):
        by_operator[source.split()[0]][label] += 1
    assert by_operator["[MIN"].most_common(1)[0][0] == 0 and by_operator["[MAX"].most_common(1)[0][0] == 9
    majority = describe_listops(data["test"])["majority_fraction"]
    assert majority < 0.3 and outer_operator_baseline(data["train"], data["test"]) > majority + 0.08


def test_outer_operator_baseline_by_hand():
    rows = {"source": ["[MAX 1 9 ]", "[MAX 9 9 ]", "[MAX 3 2 ]", "[MIN 0 4 ]"], "label": [9, 9, 3, 0]}
    train = Dataset.from_dict(rows)
    test = Dataset.from_dict({"source": ["[MAX 9 1 ]", "[MIN 5 6 ]", "[SM 1 1 ]"], "label": [9, 5, 2]})
    # MAX -> 9 (right), MIN -> 0 (wrong), SM never outermost in training -> the overall majority 9 (wrong)
    assert outer_operator_baseline(train, test) == pytest.approx(1 / 3)
    guesses = outer_operator_guesses(train)
    assert guesses == {"[MAX": 9, "[MIN": 0}
    # A model answering 9, 0, 9 answers by the outer operator on the first two; SM has no guess: no agreement
    assert outer_operator_agreement([9, 0, 9], list(test["source"]), guesses) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="one answer per expression"):
        outer_operator_agreement([9], list(test["source"]), guesses)


def test_generator_is_deterministic_for_a_seed():
    spec = ListOpsSpec(30, 80)
    first = [generate_expression(random.Random(5), spec) for _ in range(3)]
    assert first == [generate_expression(random.Random(5), spec) for _ in range(3)]
    assert first != [generate_expression(random.Random(6), spec) for _ in range(3)]


def test_spec_rejects_impossible_settings():
    with pytest.raises(ValueError, match="out of reach"):
        ListOpsSpec(10, 60, max_depth=2, max_args=2)  # one operator level: at most 2 + 2 = 4 tokens
    with pytest.raises(ValueError, match="min_args"):
        ListOpsSpec(10, 60, min_args=1)
    with pytest.raises(ValueError, match="min_length"):
        ListOpsSpec(3, 60)
    with pytest.raises(ValueError, match="operator_probability"):
        ListOpsSpec(10, 60, operator_probability=0)
    with pytest.raises(ValueError, match="max_depth"):
        ListOpsSpec(10, 60, max_depth=1)
    with pytest.raises(RuntimeError, match="widen the length range"):  # reachable, but far too rare
        generate_expression(random.Random(0), ListOpsSpec(400, 410, max_depth=4, operator_probability=0.01))


def test_dataset_is_deterministic_cached_and_described(tmp_path):
    spec, sizes = ListOpsSpec(20, 60), {"train": 40, "validation": 5, "test": 10}
    data = generate_listops(spec, sizes, seed=3, cache_dir=tmp_path / "a")
    assert {split: len(d) for split, d in data.items()} == sizes
    assert data["train"].features["label"].names == [str(d) for d in range(10)]
    again = generate_listops(spec, sizes, seed=3, cache_dir=tmp_path / "b")
    assert list(again["train"]["source"]) == list(data["train"]["source"])
    assert list(data["train"]["source"]) != list(data["test"]["source"])[:40]  # splits have their own streams
    assert (tmp_path / "a" / "listops_spec.json").exists() and not (tmp_path / "a" / "generator").exists()
    cached = generate_listops(spec, sizes, seed=3, cache_dir=tmp_path / "a")
    assert list(cached["test"]["source"]) == list(data["test"]["source"])
    other = generate_listops(spec, sizes, seed=4, cache_dir=tmp_path / "a")  # settings changed: regenerated
    assert list(other["train"]["source"]) != list(data["train"]["source"])
    stats = describe_listops(data["train"])
    assert 20 <= stats["length_min"] <= stats["length_max"] <= 60 and stats["depth_max"] <= 10
    assert sum(stats["label_counts"].values()) == 40
    labels = list(data["train"]["label"])
    assert all(evaluate_listops(s) == y for s, y in zip(list(data["train"]["source"]), labels, strict=True))


@pytest.mark.distributed  # two processes of a spawn pool
def test_runs_started_together_share_one_cache(tmp_path):
    # Two processes asking for the same data at the same moment (several attention types started in parallel):
    # one generates under the lock, the other waits and loads; neither reads the other's half-written files.
    spec, sizes = ListOpsSpec(20, 60), {"train": 3000, "test": 20}
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(2, mp_context=context) as pool:
        start = manager.Barrier(2)
        futures = [pool.submit(_train_sources, spec, sizes, tmp_path / "shared", start) for _ in range(2)]
        first, second = (future.result(timeout=300) for future in futures)
    assert first == second and len(first) == 3000
    assert not (tmp_path / "shared" / "data.new").exists()


def _train_sources(spec, sizes, cache_dir, start):
    start.wait()
    return list(generate_listops(spec, sizes, seed=1, cache_dir=cache_dir)["train"]["source"])


def test_tokenizer_saves_loads_and_pads(tmp_path):
    tokenizer = build_listops_tokenizer(61)
    encoded = tokenizer("[MAX 2 [MED 1 4 ] ]")
    expected = ["[CLS]", "[MAX", "2", "[MED", "1", "4", "]", "]"]
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"]) == expected
    assert max(encoded["input_ids"]) < len(VOCAB) and tokenizer.pad_token_id == 0
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded("[SM 3 9 ]")["input_ids"] == tokenizer("[SM 3 9 ]")["input_ids"]
    data = generate_listops(ListOpsSpec(20, 40), {"train": 4}, seed=0, cache_dir=tmp_path / "data")
    padded = tokenize_listops(data, tokenizer, pad_to=61)["train"]
    assert {len(ids) for ids in padded["input_ids"]} == {61} and "source" not in padded.column_names
    assert [sum(mask) for mask in padded["attention_mask"]] == [n + 1 for n in list(data["train"]["length"])]


def test_every_text_attention_type_has_valid_listops_settings_or_its_defaults():
    settings = script_settings("listops")
    assert set(hf_efficient.list_attention_types("text")) - set(settings) == {"full", "linear"}
    for name, entry in settings.items():
        validate_attention_config(name, entry["attention_config"])


def test_train_listops_script_two_types(tmp_path):
    script = train_listops
    tiny = ["--min_length", "20", "--max_length", "60", "--num_train", "32", "--num_validation", "8"]
    tiny += ["--num_test", "16", "--max_steps", "2", "--per_device_train_batch_size", "8"]
    tiny += ["--eval_strategy", "steps", "--eval_steps", "1"]
    tiny += ["--config_overrides", "max_position_embeddings=61,hidden_size=32,intermediate_size=64"]
    runs = {"full": "{}", "linformer": '{"projected_length": 8}'}
    for attention_type, attention_config in runs.items():
        result = script.main(
            [*tiny, "--attention_type", attention_type, "--attention_config", attention_config]
            + ["--output_dir", str(tmp_path / attention_type), *COMMON]
        )
        saved = json.loads((tmp_path / attention_type / "listops_results.json").read_text())
        # accuracies count whole sequences: 0..16 of the 16 test ones, 0..8 of the 8 validation ones
        assert saved["attention_type"] == attention_type and saved["test_accuracy"] * 16 in range(17)
        assert saved["eval_accuracy"] * 8 in range(9)
        assert saved["steps"] == 2 and saved["seconds_per_step"] > 0
        assert saved["test_outer_operator_baseline"] * 16 in range(17)
        assert [step for step, _ in saved["eval_curve"]] == [1, 2]  # --eval_steps 1, then the final model
        assert saved["eval_curve"][-1][1] == saved["eval_accuracy"]
        assert saved["padded_to"] == (61 if attention_type == "linformer" else None)  # fixed length: padded
        assert result["test_accuracy"] == saved["test_accuracy"]
        assert (tmp_path / attention_type / "tokenizer.json").exists()
        assert "listops" in (tmp_path / attention_type / "README.md").read_text()
    assert len(list((tmp_path / "listops_data").iterdir())) == 1  # both runs read the same cached data
