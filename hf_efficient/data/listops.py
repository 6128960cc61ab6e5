"""ListOps (Nangia & Bowman 2018) as the Long Range Arena uses it (Tay et al. 2020), regenerated locally.

An example is a nested prefix expression over the digits 0-9, written as space-separated tokens::

    [MAX 2 9 [MIN 4 7 ] 0 ]        -> 9
    [SM 3 [MED 1 8 2 9 ] 7 ]       -> (3 + 5 + 7) mod 10 = 5

Operators: ``[MIN`` and ``[MAX``; ``[MED`` (median; for an even count the two middle values are averaged and
rounded down, ``floor((a + b) / 2)``, which is ``int(numpy.median(values))`` on digits, as LRA's generator
computes it: ``[MED 1 4 ]`` is 2); ``[SM`` (sum modulo 10). ``]`` closes an operator. The label is the value
of the whole expression, a digit: 10 classes.

Generation (:func:`generate_expression`) grows a tree towards a target length drawn uniformly from
``[min_length, max_length]`` (tokens, ``[CLS]`` not counted): it starts with one operator and repeatedly
turns a random digit into an operator with ``min_args..max_args`` fresh digit arguments, never nesting
operators deeper than ``max_depth``; the last few tokens are placed by adding single arguments to operators
that have room. LRA instead samples trees with a fixed leaf probability (and up to 10 arguments) and rejects
those outside the length range; growing gives the same kind of expressions at any argument count, with
lengths spread evenly over the range instead of piled up at its low end, and never wastes a draw.

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
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

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
    """What :func:`generate_expression` draws: lengths in tokens ([CLS] not counted), depth, arguments.

    LRA: lengths 500-2000, depth <= 10, 2-10 arguments, 96,000 / 2,000 / 2,000 examples.
    """

    min_length: int = 500
    max_length: int = 2000
    max_depth: int = 10
    min_args: int = 2
    max_args: int = 5

    def __post_init__(self):
        if not 2 <= self.min_args <= self.max_args:
            raise ValueError(f"Need 2 <= min_args <= max_args; got {self.min_args}, {self.max_args}.")
        if self.max_depth < 1:
            raise ValueError(f"max_depth={self.max_depth}: at least one operator is needed.")
        if not self.min_args + 2 <= self.min_length <= self.max_length:
            raise ValueError(
                f"Need min_args + 2 = {self.min_args + 2} <= min_length <= max_length (an operator with its "
                f"arguments and '{CLOSE}'); got {self.min_length}, {self.max_length}."
            )
        if self.max_length > self.longest():
            raise ValueError(
                f"max_length={self.max_length} is out of reach: depth {self.max_depth} with at most "
                f"{self.max_args} arguments gives at most {self.longest()} tokens."
            )

    def longest(self) -> int:
        """Tokens of the largest tree: every operator full, nested max_depth deep."""
        length = 1
        for _ in range(self.max_depth):
            length = 2 + self.max_args * length
        return length


def generate_expression(rng: random.Random, spec: ListOpsSpec) -> list[str]:
    """One expression of ``spec``'s length, depth and argument bounds, drawn with ``rng`` (module docs)."""
    for _ in range(100):
        tokens = _grow(rng, spec, rng.randint(spec.min_length, spec.max_length))
        if tokens is not None:
            return tokens
    raise RuntimeError(f"Could not grow an expression within {spec}; widen the length range.")


def _grow(rng: random.Random, spec: ListOpsSpec, target: int) -> list[str] | None:
    # A node is [operator or None, children, depth (operators above it, itself included), digit].
    def new_leaf(depth: int) -> list:
        leaf = [None, [], depth, rng.randrange(10)]
        if depth < spec.max_depth:
            expandable.append(leaf)
        return leaf

    def make_operator(node: list, num_args: int) -> None:
        node[0], node[2] = rng.choice(OPERATORS), node[2] + 1
        node[1] = [new_leaf(node[2]) for _ in range(num_args)]
        if num_args < spec.max_args:
            with_room.append(node)

    expandable: list[list] = []  # leaves that may become operators (not at max_depth)
    with_room: list[list] = []  # operators with fewer than max_args arguments (entries may go stale)
    root = [None, [], 0, 0]
    make_operator(root, rng.randint(spec.min_args, min(spec.max_args, target - 2)))
    length = 2 + len(root[1])
    while length < target:
        remaining = target - length
        if expandable and remaining >= spec.min_args + 1:  # a leaf becomes an operator: +num_args + 1
            index = rng.randrange(len(expandable))
            expandable[index], expandable[-1] = expandable[-1], expandable[index]
            leaf = expandable.pop()
            num_args = rng.randint(spec.min_args, min(spec.max_args, remaining - 1))
            make_operator(leaf, num_args)
            length += num_args + 1
            continue
        while with_room and len(with_room[-1][1]) >= spec.max_args:
            with_room.pop()
        if not with_room:
            return None  # every operator is full and no leaf can grow within the target: draw again
        index = rng.randrange(len(with_room))
        node = with_room[index]
        if len(node[1]) >= spec.max_args:  # stale: drop it and pick again
            with_room[index] = with_room[-1]
            with_room.pop()
            continue
        node[1].append(new_leaf(node[2]))  # one more argument: +1
        length += 1
    tokens: list[str] = []
    _write(root, tokens)
    return tokens


def _write(node: list, tokens: list[str]) -> None:
    if node[0] is None:
        tokens.append(DIGITS[node[3]])
        return
    tokens.append(node[0])
    for child in node[1]:
        _write(child, tokens)
    tokens.append(CLOSE)


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
    if cache_dir is not None:
        cache = Path(cache_dir)
        stored = cache / _SPEC_FILE
        if stored.exists() and json.loads(stored.read_text()) == settings:
            return load_from_disk(str(cache / "data"))
        stored.unlink(missing_ok=True)  # written again once the new data is saved
    data = DatasetDict(
        {split: _generate_split(spec, seed, split, size, cache_dir) for split, size in sizes.items() if size}
    )
    if cache_dir is not None:
        cache.mkdir(parents=True, exist_ok=True)
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
