"""A checkpoint folder with a damaged or missing file other than the weights: the error names the file.

(Truncated weights are tests/training/test_checkpoint_safety.py's.)"""

from __future__ import annotations

import re
import shutil

import pytest

from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM, EfficientViTImageProcessor
from hf_efficient.data.text import load_or_train_tokenizer
from hf_efficient.modeling.checkpoint_files import load_tokenizer

from ..models.text.helpers import tiny_config, write_vocab


@pytest.fixture
def saved(tmp_path):
    """A tiny model with its (WordPiece) tokenizer saved together, as the scripts save them."""
    from transformers import BertTokenizerFast

    folder = tmp_path / "model"
    EfficientBertForMaskedLM(tiny_config()).save_pretrained(folder)
    BertTokenizerFast(vocab=str(write_vocab(tmp_path))).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_truncated_tokenizer_file_is_named(saved, name):
    path = saved / name
    path.write_text(path.read_text()[: len(path.read_text()) // 2])
    message = rf"{re.escape(str(path))} is not valid JSON .*tokenizer.save_pretrained"
    with pytest.raises(OSError, match=message):
        load_tokenizer(saved)
    with pytest.raises(OSError, match=message):  # the scripts' path (--tokenizer_name / the checkpoint's)
        load_or_train_tokenizer(str(saved), dataset=None, save_dir=saved / "unused")


def test_an_invalid_config_file_is_named(saved):
    (saved / "config.json").write_text('{"hidden_size": 32,,}')
    for load in (EfficientBertConfig.from_pretrained, EfficientBertForMaskedLM.from_pretrained):
        with pytest.raises(OSError, match=rf"{re.escape(str(saved / 'config.json'))}.* not a valid JSON"):
            load(saved)


def test_a_missing_image_processor_file_is_named(saved):
    shutil.rmtree(saved)
    saved.mkdir()
    with pytest.raises(OSError, match="preprocessor_config.json"):
        EfficientViTImageProcessor.from_pretrained(saved)
