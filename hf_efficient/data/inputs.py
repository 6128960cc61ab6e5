"""What the scripts' inputs must be, checked (or said, in one line) where they enter: one function per kind of
input, which every script that reads that kind calls.

* :func:`check_tokenizer`: a tokenizer against the model's vocabulary (its size, its special tokens) and the
  run's text. transformers loads a folder holding only ``tokenizer_config.json`` as a tokenizer of its 5
  special tokens, which turns every word into ``[UNK]``: a run then trains and evaluates on nothing, with
  exit status 0.
* :func:`say_label_task`: what a label column holds (its type and classes) and the task that follows from it,
  so a float column that becomes a regression, or numbers that become classes, is never a surprise.
* :func:`say_image_conversions`: the modes and sizes of the images that the image processor converts to the
  model's, and every image file whose header cannot be read, named.

The records of the data files are checked where they are read: :mod:`hf_efficient.data.files` (a record a
file cannot parse, columns of another type in each file), :mod:`hf_efficient.data.glue` (text cells, labels)
and :mod:`hf_efficient.data.question_answering` (every question).
"""

from __future__ import annotations

import collections
import io
import logging
from collections.abc import Sequence
from pathlib import Path

from datasets import IterableDataset
from transformers import PreTrainedTokenizerBase

from ..errors import InputError

logger = logging.getLogger(__name__)

# How many texts of a run's data the tokenizer is tried on, and the share of [UNK] that cannot be its own.
SAMPLED_TEXTS = 32
MOST_UNKNOWN = 0.5
# At most this many images have their header read (mode, size): the first ones of each split.
SAMPLED_IMAGES = 10_000


def check_tokenizer(
    tokenizer: PreTrainedTokenizerBase,
    config,
    where: str,
    texts: Sequence[str] = (),
    texts_from: str = "the data",
    needs: Sequence[str] = (),
    saved: tuple[str, PreTrainedTokenizerBase] | None = None,
) -> None:
    """``tokenizer`` is the model's: no more tokens than the model's word embeddings have rows, more than
    half as many (else half the rows could never be read: another model's tokenizer), its special tokens
    inside the vocabulary and its padding id the model's, the special tokens the task ``needs``
    (``"mask_token"`` for masked LM), ``texts`` (the run's first texts) mostly known words, not ``[UNK]``,
    and the vocabulary of the tokenizer ``saved`` with the checkpoint, if any (a cased BERT tokenizer over an
    uncased model fits every other check and reads other tokens' embeddings).

    Args:
        where: the tokenizer as the command line named it (``--tokenizer_name tok/``).
        texts_from: where ``texts`` come from (``--train_file reviews.csv``).
        saved: (the checkpoint as the command line names it, the tokenizer saved in it).

    Raises:
        InputError: naming the tokenizer, what does not fit and the fix.
    """
    fix = (
        "Use the model's own tokenizer (without --tokenizer_name, the checkpoint's), or a folder holding the "
        "tokenizer's files (tokenizer.json, or vocab.txt with its tokenizer_config.json)"
    )
    size, rows = len(tokenizer), getattr(config, "vocab_size", None)
    if rows is not None and size > rows:
        raise InputError(
            f"{where}: the tokenizer has {size:,} tokens but the model's word embeddings have {rows:,} rows "
            f"(vocab_size), so the ids from {rows:,} up have none. {fix}."
        )
    missing = [name for name in needs if getattr(tokenizer, name, None) is None]
    if missing:
        raise InputError(f"{where}: the tokenizer has no {', '.join(missing)}, which this task needs. {fix}.")
    specials = {token: tokenizer.convert_tokens_to_ids(token) for token in tokenizer.all_special_tokens}
    pad, model_pad = tokenizer.pad_token_id, getattr(config, "pad_token_id", None)
    if pad is not None and model_pad is not None and pad != model_pad:
        raise InputError(
            f"{where}: the tokenizer pads with id {pad} ({tokenizer.pad_token}) but the model's pad_token_id "
            f"is {model_pad}: it is not the model's tokenizer. {fix}."
        )
    unknown = _unknown_share(tokenizer, texts)
    if unknown is not None and unknown > MOST_UNKNOWN:
        raise InputError(
            f"{where}: the tokenizer turns {unknown:.0%} of the tokens of the first "
            f"{min(len(texts), SAMPLED_TEXTS)} texts of {texts_from} into {tokenizer.unk_token}: it knows "
            f"only {size:,} tokens{_only_specials(size, specials)}, not the words of this text. {fix}."
        )
    if saved is not None and saved[1].get_vocab() != tokenizer.get_vocab():
        theirs, ours = saved[1].get_vocab(), tokenizer.get_vocab()
        other = sorted(token for token, index in theirs.items() if ours.get(token) != index)
        example = f"{other[0]!r} is {theirs[other[0]]} there and {ours.get(other[0], 'absent')} here"
        raise InputError(
            f"{where}: its vocabulary is not the one saved with the model ({saved[0]}): {len(other):,} of "
            f"that one's {len(theirs):,} tokens have another id here ({example}), so the model would read "
            "other tokens' embeddings. Leave --tokenizer_name out to use the checkpoint's own tokenizer."
        )
    if rows is not None and size < rows / 2:
        raise InputError(
            f"{where}: the tokenizer has {size:,} tokens{_only_specials(size, specials)} but the model's "
            f"word embeddings have {rows:,} rows (vocab_size): more than half of them could never be read, "
            f"so it is not the model's tokenizer. {fix}."
        )


def check_saved_tokenizer(
    folder, flag: str, texts: Sequence[str] = (), needs: Sequence[str] = ()
) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved in the model ``folder`` (as the command line named it: ``flag``), checked against
    the folder's config and ``texts`` (:func:`check_tokenizer`); a folder without tokenizer files: None."""
    from transformers import AutoConfig

    from ..modeling.checkpoint_files import TOKENIZER_FILES, load_tokenizer

    if Path(folder).is_dir() and not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        return None
    tokenizer = load_tokenizer(folder)
    config = AutoConfig.from_pretrained(folder)
    check_tokenizer(tokenizer, config, f"{flag} {folder}'s tokenizer", texts, "the texts", needs)
    return tokenizer


def first_texts(dataset, *columns: str | None) -> list[str]:
    """The texts in ``columns`` of the first :data:`SAMPLED_TEXTS` rows of ``dataset`` (a ``Dataset``, or a
    stream), which :func:`check_tokenizer` tries the tokenizer on."""
    if isinstance(dataset, IterableDataset):
        rows = dataset.take(SAMPLED_TEXTS)
    else:
        rows = dataset.select(range(min(len(dataset), SAMPLED_TEXTS)))
    return [row[column] for row in rows for column in columns if column and isinstance(row.get(column), str)]


def _unknown_share(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> float | None:
    """The share of ``[UNK]`` among the tokens of the first texts, or None (no unk token, no text)."""
    texts = [text for text in list(texts)[:SAMPLED_TEXTS] if isinstance(text, str) and text.strip()]
    if tokenizer.unk_token_id is None or not texts:
        return None
    # verbose=False: a text longer than the model's positions is only counted here (the training data is cut
    # or grouped later), so transformers' "Token indices sequence length is longer than the specified maximum
    # ... will result in indexing errors" would be a false alarm in every long-text run's log
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)
    ids = [i for row in encoded["input_ids"] for i in row]
    return sum(i == tokenizer.unk_token_id for i in ids) / len(ids) if ids else None


def _only_specials(size: int, specials: dict) -> str:
    """`` (its special tokens only: ...)`` when the tokenizer holds nothing else."""
    if size > len(specials):
        return ""
    return (
        f" (its special tokens only, {', '.join(specials)}: a folder without tokenizer.json or vocab.txt "
        "loads so)"
    )


def label_values(values: Sequence, class_names: Sequence[str] | None = None) -> str:
    """What a label column holds, for :func:`say_label_task`: ``2 classes ('neg', 'pos')``, ``floats from
    0.0 to 1.0 (all whole numbers)``, ``integers from 1 to 5``."""
    if class_names is not None:
        shown = ", ".join(repr(str(name)) for name in list(class_names)[:8])
        more = ", ..." if len(class_names) > 8 else ""
        return f"{len(class_names)} classes ({shown}{more})"
    numbers = [value for value in values if value is not None]
    if not numbers:
        return "no values"
    kind = "floats" if any(isinstance(value, float) for value in numbers) else "integers"
    whole = kind == "floats" and all(float(value).is_integer() for value in numbers)
    return f"{kind} from {min(numbers)} to {max(numbers)}" + (" (all whole numbers)" if whole else "")


def say_label_task(where: str, column: str, holds: str, task: str, instead: str | None = None) -> None:
    """One line, in the run's log, of what the label column holds and the task that follows from it
    (``instead``: the flag that makes it the other task)."""
    logger.info(
        "%s: the label column %r holds %s, so this run trains %s%s",
        where, column, holds, task, f"; {instead}" if instead else "",
    )  # fmt: skip


def say_image_conversions(images, column: str, where: str, mode: str, size: tuple[int, int]) -> None:
    """Read the header of each image of ``images`` (a ``Dataset``; the first :data:`SAMPLED_IMAGES`) and say
    in one line the modes and sizes that are converted to the model's ``mode`` and ``size`` (width, height),
    if any are; an image file whose header cannot be read is named.

    Raises:
        InputError: an image that is no image (a file of another kind, or cut short in its header).
    """
    import datasets
    from PIL import Image, UnidentifiedImageError

    if not isinstance(images.features.get(column), datasets.Image):
        return  # arrays of one shape: nothing to convert per image
    sample = images.select(range(min(len(images), SAMPLED_IMAGES)))
    stored = sample.cast_column(column, datasets.Image(decode=False))
    found: collections.Counter = collections.Counter()
    for row, item in enumerate(stored[column]):
        source = item.get("path") or f"row {row}"
        try:
            with Image.open(io.BytesIO(item["bytes"]) if item.get("bytes") else item["path"]) as image:
                found[(image.mode, image.size)] += 1
        except (UnidentifiedImageError, OSError) as error:
            raise InputError(
                f"{where}: {source} is not an image that Pillow can read ({error}); remove it or replace it."
            ) from None
    modes = collections.Counter({m: 0 for m, _ in found})
    sizes = collections.Counter({s: 0 for _, s in found})
    for (m, s), count in found.items():
        modes[m] += count
        sizes[s] += count
    if set(modes) <= {mode} and set(sizes) <= {size}:
        return
    counted = f" (the first {len(sample):,})" if len(sample) < len(images) else ""
    logger.info(
        "%s%s: modes %s, sizes %s; the image processor converts each image to %s and resizes it to %dx%d, "
        "the model's input",
        where, counted, _counts(modes, str), _counts(sizes, lambda s: f"{s[0]}x{s[1]}"), mode, *size,
    )  # fmt: skip


def _counts(counter: collections.Counter, name) -> str:
    """``RGB (7), L (2)``: the values of ``counter``, most common first."""
    return ", ".join(f"{name(value)} ({count:,})" for value, count in counter.most_common())
