"""Fixtures of the script tests: real text (IMDB, Rotten Tomatoes) written as the files the scripts read;
scripts/build_checkpoint.py's training stages in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_efficient.data import load_movie_reviews, rotten_tomatoes_splits

from ..data.helpers import write_csv
from ..script_loader import load_script


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    """A small IMDB corpus and Rotten Tomatoes CSVs: sentences (train / dev / test) and scored pairs."""
    root = tmp_path_factory.mktemp("text_data")
    (root / "imdb.txt").write_text("\n".join(load_movie_reviews("imdb").select(range(60))["text"]))
    rt = rotten_tomatoes_splits()
    train, dev = rt["train"].select(range(48)), rt["validation"].select(range(24))
    pairs = [(a, b, float(len(a) % 5)) for a, b in zip(train["text"][:24], train["text"][24:], strict=True)]
    sentence_label = ["sentence", "label"]
    return {
        "corpus": str(root / "imdb.txt"),
        "train": write_csv(root / "train.csv", sentence_label, zip(*train[:].values(), strict=True)),
        "dev": write_csv(root / "dev.csv", sentence_label, zip(*dev[:].values(), strict=True)),
        "test": write_csv(root / "test.csv", ["sentence"], [[t] for t in dev["text"][:10]]),
        "pairs": write_csv(root / "pairs.csv", ["sentence1", "sentence2", "label"], pairs),
    }


@pytest.fixture(scope="module")
def stages_in_process():
    """scripts/build_checkpoint.py's training stages run by their scripts' ``main`` in this process instead
    of a fresh interpreter each (two per build, ~10 s of imports): the same code and flags.
    test_build_checkpoint.py's ``test_minilm_smoke_build`` keeps the subprocesses, as users run them."""
    builder = load_script("build_checkpoint")
    original = builder.run_training

    def run_training(command: list[str]) -> dict:
        print("  " + " ".join(command), flush=True)
        load_script(Path(command[1]).stem).main(command[2:])
        return {}

    builder.run_training = run_training
    yield
    builder.run_training = original
