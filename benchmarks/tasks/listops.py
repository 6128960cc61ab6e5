"""ListOps (Nangia & Bowman 2018) as the Long Range Arena uses it (Tay et al. 2020), regenerated locally.

An example is a nested prefix expression over the digits 0-9, written as space-separated tokens::

    [MAX 2 9 [MIN 4 7 ] 0 ]        -> 9
    [SM 3 [MED 1 8 2 9 ] 7 ]       -> (3 + 5 + 7) mod 10 = 5

Operators: ``[MIN`` and ``[MAX``; ``[MED`` (median; for an even count the two middle values are averaged and
rounded down, ``floor((a + b) / 2)``, which is ``int(numpy.median(values))`` on digits, as LRA's generator
computes it: ``[MED 1 4 ]`` is 2); ``[SM`` (sum modulo 10). ``]`` closes an operator. The label is the value
of the whole expression, a digit: 10 classes.

Generation (:func:`generate_expression`) follows LRA's generator: a node above the last level is an
operator with probability ``operator_probability`` (LRA: 0.25), otherwise a digit; an operator takes
``min_args..max_args`` arguments (LRA: 2-10), each a node one level down; the root is level 1 and level
``max_depth`` holds digits only (LRA: 10, so operators nest at most 9 deep). Trees outside
``[min_length, max_length]`` are drawn again, as LRA does (a tree is abandoned as soon as it outgrows
``max_length``, which saves time and leaves the accepted trees' distribution as it is). Most operator
arguments are therefore digits, and the lengths pile up at the low end of the range. This matters for what
the numbers mean: in LRA's data the outermost operator alone predicts about a third of the labels (0 and 9
are the most frequent, from MIN and MAX over several digits), which is about where LRA's Transformer ends
(36%), and the majority class is about 17%, where its Linear Transformer and Performer end.

The vocabulary is fixed (18 tokens: ``[PAD]`` ``[CLS]`` ``[UNK]``, 10 digits, 4 operators, ``]``);
:func:`build_listops_tokenizer` makes a ``tokenizers`` WordLevel tokenizer wrapped in
``PreTrainedTokenizerFast``, so it saves next to the model and loads with ``AutoTokenizer``. It prepends
``[CLS]`` (the classifier's token and the natural global token of Longformer / BigBird).
"""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value, load_from_disk
from filelock import FileLock
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from hf_efficient.errors import InputError

MIN, MAX, MED, SUM_MOD, CLOSE = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
DIGITS = tuple(str(d) for d in range(10))
PAD, CLS, UNK = "[PAD]", "[CLS]", "[UNK]"
VOCAB = (PAD, CLS, UNK, *DIGITS, *OPERATORS, CLOSE)
NUM_CLASSES = 10
LABEL_NAMES = DIGITS
SPLITS = ("train", "validation", "test")
_SPEC_FILE = "listops_spec.json"


def _median(values: Sequence[int]) -> int:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) // 2  # even count: mean of the two middle, rounded down


_APPLY = {
    MIN: min,
    MAX: max,
    MED: _median,
    SUM_MOD: lambda values: sum(values) % 10,
}


def _tokens(expression: str | Sequence[str]) -> list[str]:
    return expression.split() if isinstance(expression, str) else list(expression)


def evaluate_listops(expression: str | Sequence[str]) -> int:
    """The value (0-9) of a ListOps expression, by a stack evaluator.

    Args:
        expression: space-separated tokens (``"[MAX 2 [SM 4 7 ] ]"``) or the token list.

    Raises:
        ValueError: an unknown token, an unbalanced ``]``, an operator without arguments, or not exactly one
            value at the top level.
    """
    stack: list[tuple[str, list[int]]] = []  # open operators with the values of their arguments so far
    top: list[int] = []  # values at the top level (one, for a well-formed expression)
    for position, token in enumerate(_tokens(expression)):
        if token in _APPLY:
            stack.append((token, []))
        elif token == CLOSE:
            if not stack:
                raise ValueError(f"Unbalanced '{CLOSE}' at token {position}.")
            operator, values = stack.pop()
            if not values:
                raise ValueError(f"{operator} closed without arguments at token {position}.")
            (stack[-1][1] if stack else top).append(_APPLY[operator](values))
        elif token in DIGITS:
            (stack[-1][1] if stack else top).append(int(token))
        else:
            raise ValueError(f"Unknown ListOps token {token!r} at position {position}.")
    if stack:
        raise ValueError(f"{len(stack)} operator(s) left open at the end of the expression.")
    if len(top) != 1:
        raise ValueError(f"A ListOps expression has one value at the top level; this one has {len(top)}.")
    return top[0]


def expression_depth(expression: str | Sequence[str]) -> int:
    """The deepest nesting of operators (``[MAX 1 2 ]``: 1; ``[MAX 1 [MIN 2 3 ] ]``: 2; a digit: 0)."""
    depth = deepest = 0
    for token in _tokens(expression):
        if token in _APPLY:
            depth += 1
            deepest = max(deepest, depth)
        elif token == CLOSE:
            depth -= 1
    return deepest


@dataclass(frozen=True)
class ListOpsSpec:
    """What :func:`generate_expression` draws (module docs); the defaults are LRA's.

    Args:
        min_length, max_length: the range of expression lengths in tokens ([CLS] not counted).
        max_depth: LRA's tree depth: the root is level 1 and level ``max_depth`` holds only digits, so
            operators nest at most ``max_depth - 1`` deep (:func:`expression_depth`).
        min_args, max_args: how many arguments an operator takes (uniform).
        operator_probability: how often a node above the last level is an operator rather than a digit.
    """

    min_length: int = 500
    max_length: int = 2000
    max_depth: int = 10
    min_args: int = 2
    max_args: int = 10
    operator_probability: float = 0.25

    def __post_init__(self):
        if not 2 <= self.min_args <= self.max_args:
            raise InputError(f"Need 2 <= min_args <= max_args; got {self.min_args}, {self.max_args}.")
        if self.max_depth < 2:
            raise InputError(f"max_depth={self.max_depth}: level 1 must hold an operator, so at least 2.")
        if not 0 < self.operator_probability <= 1:
            raise InputError(f"operator_probability={self.operator_probability} must lie in (0, 1].")
        if not self.min_args + 2 <= self.min_length <= self.max_length:
            raise InputError(
                f"Need min_args + 2 = {self.min_args + 2} <= min_length <= max_length (an operator with its "
                f"arguments and '{CLOSE}'); got {self.min_length}, {self.max_length}."
            )
        if self.min_length > self.longest():
            raise InputError(
                f"min_length={self.min_length} is out of reach: depth {self.max_depth} with at most "
                f"{self.max_args} arguments gives at most {self.longest()} tokens."
            )

    def longest(self) -> int:
        """Tokens of the largest tree: every node above the last level an operator with max_args arguments."""
        length = 1
        for _ in range(self.max_depth - 1):
            length = 2 + self.max_args * length
        return length


MAX_DRAWS = 100_000  # trees drawn for one expression before giving up (LRA's range accepts about 1 in 12)


def generate_expression(rng: random.Random, spec: ListOpsSpec) -> list[str]:
    """One expression drawn with ``rng`` as LRA draws them, redrawn until its length is in range."""
    for _ in range(MAX_DRAWS):
        tokens: list[str] = []
        if _draw_node(rng, spec, 1, tokens) and spec.min_length <= len(tokens) <= spec.max_length:
            return tokens
    raise RuntimeError(
        f"No expression of {spec.min_length}-{spec.max_length} tokens in {MAX_DRAWS:,} draws with {spec}: "
        "such lengths are too rare under these settings; widen the length range or change "
        "operator_probability / max_args."
    )


def _draw_node(rng: random.Random, spec: ListOpsSpec, level: int, tokens: list[str]) -> bool:
    """Append one node (a digit, or an operator with its arguments and ``]``) drawn at ``level`` to
    ``tokens``; False as soon as the expression outgrows ``max_length`` (it would be rejected anyway)."""
    if level < spec.max_depth and rng.random() < spec.operator_probability:
        tokens.append(rng.choice(OPERATORS))
        for _ in range(rng.randint(spec.min_args, spec.max_args)):
            if not _draw_node(rng, spec, level + 1, tokens):
                return False
        tokens.append(CLOSE)
    else:
        tokens.append(DIGITS[rng.randrange(10)])
    return len(tokens) <= spec.max_length


def _split_examples(spec: dict, seed: int, split: str, size: int) -> Iterator[dict]:
    rng = random.Random(f"listops/{seed}/{split}")  # one stream per split: each split stands alone
    listops_spec = ListOpsSpec(**spec)
    for _ in tqdm(range(size), desc=f"ListOps {split}", unit="ex", mininterval=1.0):
        tokens = generate_expression(rng, listops_spec)
        yield {
            "source": " ".join(tokens),
            "label": evaluate_listops(tokens),
            "length": len(tokens),
            "depth": expression_depth(tokens),
        }


FEATURES = Features(
    {
        "source": Value("string"),
        "label": ClassLabel(names=list(LABEL_NAMES)),
        "length": Value("int32"),
        "depth": Value("int32"),
    }
)


def generate_listops(
    spec: ListOpsSpec,
    sizes: dict[str, int],
    seed: int = 0,
    cache_dir: str | Path | None = None,
) -> DatasetDict:
    """A ListOps ``DatasetDict``: columns ``source`` (the expression), ``label`` (``ClassLabel`` 0-9),
    ``length`` (tokens) and ``depth``.

    Args:
        spec: lengths, depth and argument counts.
        sizes: examples per split, e.g. ``{"train": 2000, "validation": 200, "test": 500}``.
        seed: the same seed, spec and sizes give the same data (each split has its own random stream).
        cache_dir: a folder to save the data to (``save_to_disk``) and load it from on the next call when
            the spec, sizes and seed agree (they are stored beside it); mismatching data is regenerated.
    """
    settings = {"spec": asdict(spec), "sizes": dict(sizes), "seed": seed}
    if cache_dir is None:
        return _generate(spec, sizes, seed, None)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    # Runs of several attention types share one data folder and may start together: the first generates and
    # saves under the lock, the others wait for it and load (without it one read half-written Arrow files).
    with FileLock(str(cache / ".lock")):
        stored = cache / _SPEC_FILE
        if stored.exists() and json.loads(stored.read_text()) == settings:
            return load_from_disk(str(cache / "data"))
        stored.unlink(missing_ok=True)  # written again once the new data is saved
        data = _generate(spec, sizes, seed, cache)
        # Save beside, then swap: data of an earlier call may still be memory-mapped from the old files.
        staging = cache / "data.new"
        shutil.rmtree(staging, ignore_errors=True)
        data.save_to_disk(str(staging))
        shutil.rmtree(cache / "data", ignore_errors=True)
        staging.rename(cache / "data")
        (cache / _SPEC_FILE).write_text(json.dumps(settings, indent=2))
        data = load_from_disk(str(cache / "data"))
        shutil.rmtree(cache / "generator", ignore_errors=True)  # from_generator's copy: keep one
    return data


def _generate(spec: ListOpsSpec, sizes: dict[str, int], seed: int, cache: Path | None) -> DatasetDict:
    return DatasetDict(
        {split: _generate_split(spec, seed, split, size, cache) for split, size in sizes.items() if size}
    )


def _generate_split(spec: ListOpsSpec, seed: int, split: str, size: int, cache_dir) -> Dataset:
    """One split through ``Dataset.from_generator`` (written to Arrow as it goes), with our own progress bar
    (it knows the total; the one of ``datasets`` is silenced meanwhile)."""
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        return Dataset.from_generator(
            _split_examples,
            features=FEATURES,
            gen_kwargs={"spec": asdict(spec), "seed": seed, "split": split, "size": size},
            cache_dir=str(Path(cache_dir) / "generator") if cache_dir is not None else None,
            split=datasets.NamedSplit(split),
        )
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def describe_listops(dataset: Dataset) -> dict:
    """Length, depth and label statistics of a ListOps split (for logs and checks)."""
    lengths, depths, labels = dataset["length"], dataset["depth"], dataset["label"]
    counts = Counter(labels)
    return {
        "examples": len(dataset),
        "length_min": min(lengths),
        "length_max": max(lengths),
        "length_mean": sum(lengths) / len(lengths),
        "depth_max": max(depths),
        "depth_mean": sum(depths) / len(depths),
        "label_counts": {str(label): counts.get(label, 0) for label in range(NUM_CLASSES)},
        "majority_fraction": max(counts.values()) / len(labels),
    }


def outer_operator_guesses(train: Dataset) -> dict[str, int]:
    """Each outermost operator's most frequent training label (``{"[MAX": 9, "[MIN": 0, ...}``)."""
    by_operator: dict[str, Counter] = {}
    for source, label in zip(train["source"], train["label"], strict=True):
        by_operator.setdefault(_outer_operator(source), Counter())[label] += 1
    return {operator: counts.most_common(1)[0][0] for operator, counts in by_operator.items()}


def outer_operator_agreement(
    answers: Sequence[int], sources: Sequence[str], guesses: dict[str, int]
) -> float:
    """The fraction of ``answers`` (labels or a model's predictions, one per source expression) that equal
    the guess for the expression's outermost operator. For a model: 1.0 means it answers from the first
    token alone, whatever its accuracy."""
    if len(answers) != len(sources) or not sources:
        raise ValueError(f"Need one answer per expression; got {len(answers)} for {len(sources)}.")
    pairs = zip(answers, sources, strict=True)
    hits = [guesses.get(_outer_operator(source)) == answer for answer, source in pairs]
    return sum(hits) / len(hits)


def outer_operator_baseline(train: Dataset, test: Dataset) -> float:
    """Test accuracy of predicting, for each outermost operator, its most frequent training label.

    What a model gets from the expression's first token alone: the floor a model that learned anything
    about ListOps should pass, and about where LRA's Transformer ends (module docs). An operator never
    outermost in training gets the most frequent training label.
    """
    guesses = outer_operator_guesses(train)
    overall = Counter(train["label"]).most_common(1)[0][0]
    guesses.update({_outer_operator(s): overall for s in test["source"] if _outer_operator(s) not in guesses})
    return outer_operator_agreement(list(test["label"]), list(test["source"]), guesses)


def _outer_operator(source: str) -> str:
    return source.split(maxsplit=1)[0]


def build_listops_tokenizer(model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """The fixed-vocabulary tokenizer: whitespace split, WordLevel ids, ``[CLS]`` prepended.

    Args:
        model_max_length: the longest input the model takes ([CLS] included), saved with the tokenizer.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: index for index, token in enumerate(VOCAB)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A", special_tokens=[(CLS, vocab[CLS])]
    )
    kwargs = {"model_max_length": model_max_length} if model_max_length else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        cls_token=CLS,
        unk_token=UNK,
        model_input_names=["input_ids", "attention_mask"],
        **kwargs,
    )


def tokenize_listops(
    data: DatasetDict | Dataset, tokenizer: PreTrainedTokenizerFast, pad_to: int | None = None
) -> DatasetDict | Dataset:
    """``input_ids`` / ``attention_mask`` for every example ([CLS] + the expression; ``label`` kept).

    Args:
        pad_to: pad every example to this many tokens (for attention with a fixed maximum length,
            e.g. Linformer, as LRA does); ``None``: leave padding to the data collator (per batch).
    """
    padding = {"padding": "max_length", "max_length": pad_to} if pad_to else {}

    def encode(batch):
        return tokenizer(batch["source"], **padding)

    return data.map(encode, batched=True, remove_columns=["source", "depth"], desc="Tokenizing ListOps")
