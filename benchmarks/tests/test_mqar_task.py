"""benchmarks.tasks.mqar: MQAR examples as Zoology builds them (each query's label is the value stored with
its key, keys distinct, queries after the context at power-law gaps), determinism, argument checks, the
causal label shift and the recall accuracy on crafted predictions."""

from __future__ import annotations

import time

import numpy as np
import pytest

from benchmarks.tasks.mqar import (
    FILLER,
    IGNORE_INDEX,
    MQARSpec,
    causal_labels,
    generate_mqar,
    generate_mqar_arrays,
    recall_accuracy,
    zoology_num_kv_pairs,
)

SPEC = MQARSpec(seq_len=64, num_kv_pairs=8, vocab_size=256)


def _queries(inputs: np.ndarray, labels: np.ndarray):
    """Per example: the {key: value} of its context and its [(position, key, label)] queries."""
    context = 2 * SPEC.num_kv_pairs
    for row, label_row in zip(inputs, labels, strict=True):
        stored = dict(zip(row[0:context:2].tolist(), row[1:context:2].tolist(), strict=True))
        positions = np.flatnonzero(label_row != IGNORE_INDEX)
        yield stored, [(int(p), int(row[p]), int(label_row[p])) for p in positions]


def test_every_query_is_labelled_with_the_value_stored_with_its_key():
    inputs, labels = generate_mqar_arrays(SPEC, 200, seed=0)
    assert inputs.shape == labels.shape == (200, 64)
    half = SPEC.vocab_size // 2
    for stored, queries in _queries(inputs, labels):
        assert len(stored) == SPEC.num_kv_pairs  # keys distinct within the example
        assert all(1 <= key < half <= value < SPEC.vocab_size for key, value in stored.items())
        assert len(set(stored.values())) == SPEC.num_kv_pairs
        assert sorted(key for _, key, _ in queries) == sorted(stored)  # every key asked exactly once
        for position, key, label in queries:
            assert label == stored[key]
            assert position >= 2 * SPEC.num_kv_pairs and (position - 2 * SPEC.num_kv_pairs) % 2 == 0


def test_values_appear_only_in_the_context_so_reading_both_ways_cannot_leak_them():
    inputs, labels = generate_mqar_arrays(SPEC, 200, seed=1)
    after_context = inputs[:, 2 * SPEC.num_kv_pairs :]
    assert not (after_context >= SPEC.vocab_size // 2).any()  # only keys and the filler after the context
    assert set(np.unique(after_context[labels[:, 2 * SPEC.num_kv_pairs :] == IGNORE_INDEX])) == {FILLER}


def test_power_law_puts_most_queries_right_after_the_context():
    spec = MQARSpec(seq_len=256, num_kv_pairs=4, vocab_size=256)
    _, labels = generate_mqar_arrays(spec, 2000, seed=0)
    gaps = (np.nonzero(labels != IGNORE_INDEX)[1] - spec.context_size) // 2
    uniform = MQARSpec(seq_len=256, num_kv_pairs=4, vocab_size=256, power_a=1.0)
    _, uniform_labels = generate_mqar_arrays(uniform, 2000, seed=0)
    uniform_gaps = (np.nonzero(uniform_labels != IGNORE_INDEX)[1] - spec.context_size) // 2
    assert gaps.min() >= 0 and gaps.max() < spec.num_gaps
    assert np.median(gaps) < 20 < np.median(uniform_gaps)  # 124 slots: uniform's median is about 62
    assert (gaps == 0).mean() > 0.1  # Zoology's a = 0.01: p(gap 0) is the largest, about 0.15 of draws here


def test_same_seed_same_data_other_seed_other_data():
    first, again = generate_mqar(SPEC, 50, seed=3), generate_mqar(SPEC, 50, seed=3)
    assert first["input_ids"] == again["input_ids"] and first["labels"] == again["labels"]
    assert generate_mqar(SPEC, 50, seed=4)["input_ids"] != first["input_ids"]
    assert set(first.column_names) == {"input_ids", "labels", "attention_mask"}
    assert np.asarray(first["attention_mask"]).min() == 1


def test_random_non_queries_fills_the_gaps_with_random_tokens():
    spec = MQARSpec(seq_len=64, num_kv_pairs=4, vocab_size=256, random_non_queries=True)
    inputs, labels = generate_mqar_arrays(spec, 100, seed=0)
    assert (inputs == FILLER).mean() < 0.02  # 0 only where drawn at random (1 in 256)
    assert len(np.unique(inputs[:, spec.context_size :])) > 100


@pytest.mark.one_at_a_time  # timed: not beside a multi-process launch, which takes every core
def test_100k_examples_generate_in_seconds():
    start = time.perf_counter()
    inputs, _ = generate_mqar_arrays(MQARSpec(seq_len=256, num_kv_pairs=16), 100_000, seed=0)
    assert inputs.shape == (100_000, 256)
    assert time.perf_counter() - start < 10


def test_small_key_range_still_gives_distinct_keys():
    spec = MQARSpec(seq_len=16, num_kv_pairs=4, vocab_size=10)  # keys 1-4: every key in every example
    inputs, _ = generate_mqar_arrays(spec, 100, seed=0)
    assert (np.sort(inputs[:, 0:8:2], axis=1) == [1, 2, 3, 4]).all()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"seq_len": 64, "num_kv_pairs": 17}, "num_kv_pairs"),  # 17 * 4 > 64
        ({"seq_len": 63, "num_kv_pairs": 4}, "seq_len"),
        ({"seq_len": 64, "num_kv_pairs": 0}, "num_kv_pairs"),
        ({"seq_len": 64, "num_kv_pairs": 8, "vocab_size": 16}, "vocab_size"),
        ({"seq_len": 64, "num_kv_pairs": 4, "power_a": 0.0}, "power_a"),
    ],
)
def test_impossible_settings_raise_naming_the_argument(kwargs, named):
    with pytest.raises(ValueError, match=named):
        MQARSpec(**kwargs)


def test_zoology_pairs_per_length():
    assert [zoology_num_kv_pairs(n) for n in (64, 128, 256)] == [4, 8, 16]


def test_causal_labels_move_one_right_and_the_accuracy_reads_either_layout():
    inputs, labels = generate_mqar_arrays(SPEC, 20, seed=0)
    shifted = causal_labels(labels)
    assert (shifted[:, 1:] == labels[:, :-1]).all() and (shifted[:, 0] == IGNORE_INDEX).all()
    # A model handed the answer: the encoder predicts the value at the query, the causal LM one step before
    # the shifted label (its position i predicts labels[i + 1]), i.e. also at the query.
    oracle = np.where(labels != IGNORE_INDEX, labels, 0)
    assert recall_accuracy(oracle, labels, causal=False) == 1.0
    assert recall_accuracy(oracle, shifted, causal=True) == 1.0
    # Off by one position, the other way round, scores nothing: the alignment matters.
    assert recall_accuracy(oracle, shifted, causal=False) == 0.0
    assert recall_accuracy(np.roll(oracle, 1, axis=1), shifted, causal=True) == 0.0
    half_right = oracle.copy()
    half_right[:10] = 0
    assert recall_accuracy(half_right, labels, causal=False) == pytest.approx(0.5)
