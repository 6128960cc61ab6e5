"""Multi-query associative recall (MQAR; Zoology, Arora et al. 2023, arXiv 2312.04927), generated locally.

An example is ``num_kv_pairs`` key-value pairs followed by queries: every key is asked once, later in the
sequence, and the model must answer with the value stored with it::

    position:  0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15
    input:     2   8   4   7   0   0   4   0   0   0   0   0   2   0   0   0     (vocab 12, 2 pairs)
    label:     -   -   -   -   -   -   7   -   -   -   -   -   8   -   -   -     (- is -100)

Keys come from the lower half of the vocabulary (ids ``1 .. vocab_size // 2 - 1``; 0 is the filler token)
and values from the upper half (``vocab_size // 2 .. vocab_size - 1``); the keys of an example are distinct
(each is stored once), and so are its values. The context takes the first ``2 * num_kv_pairs`` positions.
The queries follow it at even offsets: the query of pair i sits at ``context + 2 * gap_i``, the gaps drawn
without replacement from ``0 .. (seq_len - context) // 2 - 1`` with Zoology's power law,
``p(gap = g) ~ a * (g + 1) ** (a - 1)`` (``power_a`` = a; Zoology: 0.01, which puts most queries close to
the context; 1.0 is uniform). The first pairs of the context tend to get the smallest gaps, as in Zoology's
generator, which fills the gaps in the order it draws them. ``random_non_queries`` replaces every filler
0 by a token drawn uniformly from the whole vocabulary (Zoology's generator does the same).

Labels follow Zoology's convention: the value stands at the query's own position (what the model must
output there), -100 elsewhere. A masked-LM encoder reads them as they are; a causal LM that shifts labels by
one inside its loss (``EfficientBertForCausalLM``: position i predicts ``labels[i + 1]``) needs them moved
one position right first: :func:`causal_labels`. :func:`recall_accuracy` scores predictions in either
layout.

Zoology's settings (``multiquery_ar`` of ``zoology/data/associative_recall.py`` and the config that
reproduces the paper's Figure 2, ``zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py``):
vocabulary 8,192, 100,000 training and 3,000 test examples (the test set drawn with ``seed + 10``),
``power_a`` 0.01, and (sequence length, pairs) = (64, 4), (128, 8), (256, 16), i.e. ``seq_len // 16`` pairs;
Figure 2's config sets ``random_non_queries=False`` (the function's own default is True). Our defaults
(:class:`MQARSpec`) are Figure 2's; the CPU-sized choices of vocabulary and example count are the training
script's (``benchmarks/configs/mqar/base.json``).

Generation is vectorised numpy (no Python loop over examples): 100k examples of 256 tokens take under a
second as arrays (0.8 s measured on one thread), about 3 s as a ``Dataset``. Distinct keys and values come
from drawing and redrawing the rows that repeat one; the gaps from the Gumbel-top-k trick (the k largest of
``log p + Gumbel noise`` are a draw without replacement proportional to p, in draw order).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from datasets import Dataset

from hf_efficient.errors import InputError

IGNORE_INDEX = -100
FILLER = 0  # the token between queries (with random_non_queries=False); never a key or a value
ZOOLOGY_VOCAB_SIZE = 8_192
ZOOLOGY_NUM_TRAIN, ZOOLOGY_NUM_TEST = 100_000, 3_000
ZOOLOGY_POWER_A = 0.01
ZOOLOGY_TEST_SEED_OFFSET = 10  # Zoology draws its test set with seed + 10
_ROWS_PER_CHUNK = 8_192  # rows of the (rows, gap choices) noise matrix drawn at once


def zoology_num_kv_pairs(seq_len: int) -> int:
    """Pairs per example in Zoology's Figure 2 sweep: (64, 4), (128, 8), (256, 16), i.e. ``seq_len // 16``."""
    return max(1, seq_len // 16)


@dataclass(frozen=True)
class MQARSpec:
    """What one MQAR example looks like; checks itself (a clear error names the argument and the fix)."""

    seq_len: int = 64
    num_kv_pairs: int = 4
    vocab_size: int = ZOOLOGY_VOCAB_SIZE
    power_a: float = ZOOLOGY_POWER_A
    random_non_queries: bool = False

    def __post_init__(self):
        if self.seq_len < 4 or self.seq_len % 2:
            raise InputError(
                f"seq_len must be an even number >= 4 (Zoology requires it even), got {self.seq_len}."
            )
        if self.num_kv_pairs < 1:
            raise InputError(f"num_kv_pairs must be >= 1, got {self.num_kv_pairs}.")
        if self.num_kv_pairs * 4 > self.seq_len:
            raise InputError(
                f"num_kv_pairs={self.num_kv_pairs} does not fit seq_len={self.seq_len}: the context takes "
                f"2 * num_kv_pairs positions and the queries need as many pairs of positions after it, so "
                f"num_kv_pairs * 4 <= seq_len (at most {self.seq_len // 4} pairs; Zoology: seq_len // 16)."
            )
        needed = 2 * (self.num_kv_pairs + 1)  # keys 1..K-1 of the lower half, K distinct values in the upper
        if self.vocab_size < needed:
            raise InputError(
                f"vocab_size={self.vocab_size} is too small for num_kv_pairs={self.num_kv_pairs}: keys come "
                f"from ids 1 .. vocab_size // 2 - 1 and values from the upper half, each distinct within an "
                f"example, so vocab_size >= 2 * (num_kv_pairs + 1) = {needed} (Zoology: 8,192)."
            )
        if not self.power_a > 0:
            raise InputError(
                f"power_a must be > 0 (Zoology: {ZOOLOGY_POWER_A}; 1.0 places queries uniformly), got "
                f"{self.power_a}."
            )

    @property
    def context_size(self) -> int:
        return 2 * self.num_kv_pairs

    @property
    def num_gaps(self) -> int:
        """How many query slots (even offsets after the context) there are to choose from."""
        return (self.seq_len - self.context_size) // 2

    def gap_probabilities(self) -> np.ndarray:
        """(num_gaps,) Zoology's power law over the gaps 0, 1, ...: ``a * (g + 1) ** (a - 1)``, normalised."""
        a = self.power_a
        weights = a * np.arange(1, self.num_gaps + 1, dtype=np.float64) ** (a - 1)
        return weights / weights.sum()


def _distinct_rows(rng: np.random.Generator, num_rows: int, width: int, low: int, high: int) -> np.ndarray:
    """(num_rows, width) ints from [low, high), distinct within each row, uniform over such rows.

    Rows are drawn with replacement and the rows that repeat a number are drawn again (few, when width is
    small against the range); a range barely wider than ``width`` uses a random permutation per row instead.
    """
    span = high - low
    if span < 4 * width:  # redrawing would rarely succeed: permute, in chunks to bound the memory
        rows = [
            np.argsort(rng.random((min(_ROWS_PER_CHUNK, num_rows - start), span)), axis=1)[:, :width]
            for start in range(0, num_rows, _ROWS_PER_CHUNK)
        ]
        return (np.concatenate(rows) if rows else np.empty((0, width), np.int64)) + low
    out = rng.integers(low, high, size=(num_rows, width))
    redo = np.arange(num_rows)
    while redo.size:
        ordered = np.sort(out[redo], axis=1)
        redo = redo[(ordered[:, 1:] == ordered[:, :-1]).any(axis=1)]
        out[redo] = rng.integers(low, high, size=(redo.size, width))
    return out


def _power_law_gaps(rng: np.random.Generator, spec: MQARSpec, num_rows: int) -> np.ndarray:
    """(num_rows, num_kv_pairs) distinct gaps per row, drawn without replacement with the power law, in draw
    order (Gumbel-top-k: sorting ``log p + Gumbel noise`` in decreasing order is sequential sampling)."""
    log_p = np.log(spec.gap_probabilities())
    chunks = []
    for start in range(0, num_rows, _ROWS_PER_CHUNK):
        scores = log_p + rng.gumbel(size=(min(_ROWS_PER_CHUNK, num_rows - start), spec.num_gaps))
        top = np.argpartition(-scores, spec.num_kv_pairs - 1, axis=1)[:, : spec.num_kv_pairs]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        chunks.append(np.take_along_axis(top, order, axis=1))
    return np.concatenate(chunks) if chunks else np.empty((0, spec.num_kv_pairs), np.int64)


def generate_mqar_arrays(spec: MQARSpec, num_examples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels), each (num_examples, seq_len) int64: labels hold the value at each query position and
    -100 elsewhere (Zoology's layout; see the module docs). The same (spec, num_examples, seed) gives the
    same arrays."""
    if num_examples < 0:
        raise InputError(f"num_examples must be >= 0, got {num_examples}.")
    rng = np.random.default_rng(seed)
    n, pairs, half = num_examples, spec.num_kv_pairs, spec.vocab_size // 2
    keys = _distinct_rows(rng, n, pairs, 1, half)  # (n, K)
    values = _distinct_rows(rng, n, pairs, half, spec.vocab_size)  # (n, K)
    gaps = _power_law_gaps(rng, spec, n)  # (n, K): pair i is asked at context + 2 * gaps[:, i]

    inputs = np.full((n, spec.seq_len), FILLER, dtype=np.int64)
    inputs[:, 0 : spec.context_size : 2] = keys
    inputs[:, 1 : spec.context_size : 2] = values
    query_positions = spec.context_size + 2 * gaps  # (n, K)
    np.put_along_axis(inputs, query_positions, keys, axis=1)
    labels = np.full((n, spec.seq_len), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(labels, query_positions, values, axis=1)
    if spec.random_non_queries:
        filler = inputs == FILLER
        inputs[filler] = rng.integers(0, spec.vocab_size, size=int(filler.sum()))
    return inputs, labels


def generate_mqar(spec: MQARSpec, num_examples: int, seed: int) -> Dataset:
    """MQAR as a ``datasets.Dataset``: ``input_ids``, ``labels`` (values at the query positions, -100
    elsewhere; :func:`causal_labels` for a causal LM) and ``attention_mask`` (all ones: no padding)."""
    inputs, labels = generate_mqar_arrays(spec, num_examples, seed)
    return Dataset.from_dict(
        {"input_ids": inputs, "labels": labels, "attention_mask": np.ones_like(inputs, dtype=np.int8)}
    )


def causal_labels(labels: np.ndarray) -> np.ndarray:
    """(b, n) labels at the query positions -> the same moved one position right, for a causal LM whose loss
    shifts them back (position i predicts ``labels[i + 1]``). The last position never holds a query (queries
    sit at even offsets before the last pair of positions), so nothing is lost."""
    labels = np.asarray(labels)
    if (labels[:, -1] != IGNORE_INDEX).any():
        raise ValueError("labels has a target at the last position: not MQAR labels (queries end earlier).")
    shifted = np.full_like(labels, IGNORE_INDEX)
    shifted[:, 1:] = labels[:, :-1]
    return shifted


def recall_accuracy(predictions: np.ndarray, labels: np.ndarray, causal: bool) -> float:
    """The fraction of queries whose value is predicted exactly.

    Args:
        predictions: (b, n) predicted token id at every position (argmax of the logits).
        labels: (b, n) the labels the model was given: values at the query positions (``causal=False``), or
            moved one right (:func:`causal_labels`; ``causal=True``), where position i's prediction is
            scored against ``labels[i + 1]``; -100 elsewhere.
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape:
        raise ValueError(
            f"predictions {predictions.shape} and labels {labels.shape} must have the same shape."
        )
    if causal:
        predictions, labels = predictions[:, :-1], labels[:, 1:]
    scored = labels != IGNORE_INDEX
    if not scored.any():
        raise ValueError("no query position in labels (every label is -100).")
    return float((predictions[scored] == labels[scored]).mean())


def describe_spec(spec: MQARSpec) -> dict:
    """The spec as a JSON-able dict, with the context size and number of gap slots."""
    return {**asdict(spec), "context_size": spec.context_size, "num_gaps": spec.num_gaps}
