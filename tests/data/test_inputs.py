"""hf_efficient.data.inputs: a tokenizer that is not the model's is refused before it tokenizes anything, the
task a label column leads to is said in one line, and so are the images the processor converts."""

from __future__ import annotations

import logging
import shutil

import pytest
from PIL import Image
from transformers import AutoTokenizer, BertTokenizer

from hf_efficient import EfficientBertConfig, EfficientViTConfig, EfficientViTImageProcessor
from hf_efficient.data import ImageDataArguments, load_image_splits, load_task_datasets
from hf_efficient.data.images import transformed_splits
from hf_efficient.data.inputs import check_tokenizer

from ..models.text.helpers import SPECIAL_TOKENS, WORD_PIECES, WORDS, write_vocab
from .helpers import write_csv

TEXTS = ["the cat sat on the mat", "a big dog ran under the tree"]
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(WORDS) + len(WORD_PIECES)  # write_vocab's tokens


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict:
    """The tests' WordPiece tokenizer, and what transformers loads from a copy of its folder that holds only
    tokenizer_config.json: a tokenizer of its 5 special tokens."""
    folder = tmp_path_factory.mktemp("tokenizer")
    good = BertTokenizer(vocab=str(write_vocab(folder)))
    good.save_pretrained(folder)
    config_only = tmp_path_factory.mktemp("config_only")
    shutil.copy(folder / "tokenizer_config.json", config_only)
    config_only = AutoTokenizer.from_pretrained(config_only)
    return {"good": good, "config only": config_only, "vocab": str(folder / "vocab.txt")}


def model_config(**overrides) -> EfficientBertConfig:
    sizes = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    return EfficientBertConfig(**{**sizes, "vocab_size": VOCAB_SIZE, **overrides})


def test_the_models_tokenizer_passes(tokenizers):
    check_tokenizer(
        tokenizers["good"], model_config(), "--tokenizer_name t", TEXTS, "--train_file f", ["mask_token"]
    )


def test_checking_a_tokenizer_on_texts_longer_than_the_model_warns_of_nothing(tokenizers):
    """The check tokenizes a few texts only to count [UNK]s: a text longer than the model's positions (it is
    grouped into blocks or cut later) gave transformers' "Token indices sequence length is longer than the
    specified maximum ... indexing errors" in every long-text run's log (make demo's first lines)."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    tokenizer = BertTokenizer(vocab=tokenizers["vocab"], model_max_length=8)  # its once-only warnings unsaid
    with CaptureLogger(hf_logging.get_logger("transformers.tokenization_utils_base")) as captured:
        check_tokenizer(tokenizer, model_config(), "t", [" ".join(TEXTS * 3)])
    assert "Token indices sequence length" not in captured.out


MISFITS = {  # {case: (tokenizer, config overrides, texts, needs, what the error says)}
    "every word [UNK]": (
        "config only", {}, TEXTS, (),
        r"the tokenizer turns 100% of the tokens of the first 2 texts of --train_file f into \[UNK\]: it "
        r"knows only 5 tokens \(its special tokens only, .*: a folder without tokenizer.json or vocab.txt "
        r"loads so\)",
    ),
    "fewer tokens than half the rows": (
        "config only", {}, (), (),
        r"the tokenizer has 5 tokens \(its special tokens only.*\) but the model's word embeddings have 48 "
        r"rows \(vocab_size\): more than half of them could never be read",
    ),
    "more tokens than rows": (
        "good", {"vocab_size": 40}, TEXTS, (),
        r"the tokenizer has 48 tokens but the model's word embeddings have 40 rows \(vocab_size\), so the "
        r"ids from 40 up have none",
    ),
    "another padding id": (
        "good", {"pad_token_id": 3}, TEXTS, (),
        r"the tokenizer pads with id 0 \(\[PAD\]\) but the model's pad_token_id is 3",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MISFITS))
def test_a_tokenizer_that_is_not_the_models_is_refused(tokenizers, case):
    """transformers loads a folder without tokenizer.json or vocab.txt as 5 special tokens; a run with it
    trained and evaluated on [UNK] alone, with exit status 0."""
    name, overrides, texts, needs, message = MISFITS[case]
    with pytest.raises(ValueError, match=rf"^--tokenizer_name t: {message}.*Use the model's own tokenizer"):
        check_tokenizer(
            tokenizers[name], model_config(**overrides), "--tokenizer_name t", texts, "--train_file f"
        )


def test_another_vocabulary_than_the_checkpoints_is_refused(tokenizers, tmp_path):
    """Two tokens swapped: every other check passes (a cased BERT tokenizer over an uncased model would too),
    and each id would read the other token's embedding."""
    words = open(tokenizers["vocab"]).read().split("\n")
    words[5], words[6] = words[6], words[5]
    (tmp_path / "vocab.txt").write_text("\n".join(words))
    swapped = BertTokenizer(vocab=str(tmp_path / "vocab.txt"))
    saved = ("--model_name_or_path m", tokenizers["good"])
    check_tokenizer(tokenizers["good"], model_config(), "t", TEXTS, saved=saved)
    message = (
        r"^t: its vocabulary is not the one saved with the model \(--model_name_or_path m\): 2 of that "
        rf"one's 48 tokens have another id here \('{words[5]}' is 6 there and 5 here\)"
    )
    with pytest.raises(ValueError, match=message):
        check_tokenizer(swapped, model_config(), "t", TEXTS, saved=saved)


def test_a_special_token_the_task_needs(tokenizers):
    tokenizer = BertTokenizer(vocab=tokenizers["vocab"], mask_token=None)
    with pytest.raises(ValueError, match=r"^t: the tokenizer has no mask_token, which this task needs"):
        check_tokenizer(tokenizer, model_config(), "t", TEXTS, needs=["mask_token"])


def said(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name.startswith("hf_efficient")]


@pytest.mark.parametrize(
    ("labels", "flags", "line"),
    [
        (
            [1.0, 0.0, 1.0],
            {},
            "the label column 'label' holds floats from 0.0 to 1.0 (all whole numbers), so this run trains a "
            "regression (one output, mean squared error); --do_regression False makes each value a class",
        ),
        (
            [5, 1, 3],
            {},
            "holds 3 classes ('1', '3', '5'), so this run trains a 3-class classifier (accuracy); "
            "--do_regression True regresses them as numbers",
        ),
        (
            ["pos", "neg", "pos"],
            {},
            "holds 2 classes ('neg', 'pos'), so this run trains a 2-class classifier",
        ),
        (
            [1.0, 0.0, 1.0],
            {"do_regression": False},
            "holds 2 classes ('0', '1'), so this run trains a 2-class",
        ),
    ],
)
def test_the_task_a_label_column_leads_to_is_said(labels, flags, line, tmp_path, caplog):
    """A float label column (0.0 / 1.0) became a regression without a word."""
    rows = zip(["a fine film", "a bore", "fun"], labels, strict=True)
    path = write_csv(tmp_path / "train.csv", ["sentence", "label"], rows)
    with caplog.at_level(logging.INFO, logger="hf_efficient"):
        load_task_datasets(train_file=path, **flags)
    lines = said(caplog)
    assert len(lines) == 1 and lines[0].startswith(f"--train_file {path}: ") and line in lines[0], lines
    if flags:
        assert "--do_regression" not in lines[0]  # asked for: no alternative offered


def test_the_images_the_processor_converts_are_said_and_a_broken_one_named(tmp_path, caplog):
    """Images of mixed modes (RGB, L, RGBA) and sizes were converted and resized without a line."""
    for label, (mode, size) in enumerate([("RGB", (8, 8)), ("L", (10, 6)), ("RGBA", (8, 8))]):
        (tmp_path / f"c{label}").mkdir()
        for i in range(2):
            Image.new(mode, size).save(tmp_path / f"c{label}" / f"{i}.png")
    args = ImageDataArguments(train_dir=str(tmp_path), validation_split_percentage=0)
    config = EfficientViTConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=1
    )
    processor = EfficientViTImageProcessor.for_config(config)
    with caplog.at_level(logging.INFO, logger="hf_efficient"):
        train, _ = transformed_splits(load_image_splits(args, seed=0), processor)
    assert train[0]["pixel_values"].shape == (1, 8, 8)
    assert said(caplog)[1] == (
        f"{tmp_path} (training images): modes RGB (2), L (2), RGBA (2), sizes 8x8 (4), 10x6 (2); the image "
        "processor converts each image to L and resizes it to 8x8, the model's input"
    )
    caplog.clear()
    (tmp_path / "c0" / "2.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"c0/2.png is not an image that Pillow can read .*; remove it"):
        transformed_splits(load_image_splits(args, seed=0), processor)
    Image.new("L", (8, 8)).save(tmp_path / "c0" / "2.png")
    for label in (1, 2):
        for i in range(2):
            Image.new("L", (8, 8)).save(tmp_path / f"c{label}" / f"{i}.png")
    Image.new("L", (8, 8)).save(tmp_path / "c0" / "0.png")
    Image.new("L", (8, 8)).save(tmp_path / "c0" / "1.png")
    with caplog.at_level(logging.INFO, logger="hf_efficient"):
        transformed_splits(load_image_splits(args, seed=0), processor)
    assert not [line for line in said(caplog) if "image processor converts" in line]  # nothing to convert
