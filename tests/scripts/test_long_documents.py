"""A long document from checkpoint to prediction, as a new user meets it (issue 57): the saved tokenizer
says the model's length, data mistakes stop before training with the row, the column and the file, and the
whole path (a zoo build, a fine-tune at 2,048 tokens on a CSV of one's own, a pipeline with remote code in a
process without hf_efficient) reads every token of a long input."""

from __future__ import annotations

import json
import re

import pytest
from transformers import AutoTokenizer

from hf_efficient.data import load_movie_reviews
from hf_efficient.errors import InputError

from ..data.helpers import write_csv
from ..processes import BLOCK_HF_EFFICIENT, run_python
from ..script_loader import load_script
from .helpers import COMMON
from .test_argument_errors import tiny_checkpoint  # noqa: F401 (a fixture)
from .test_build_checkpoint import NAME, small_budget, tiny_bert  # noqa: F401 (tiny_bert: a fixture)


def reviews_csv(path, rows) -> str:
    return write_csv(path, ["review", "verdict"], rows)


def finetune_command(checkpoint, train: str, output_dir, *extra) -> list[str]:
    """finetune_glue.py on a CSV of one's own (columns review, verdict), one step."""
    return [
        *("--model_name_or_path", str(checkpoint), "--train_file", train, "--validation_file", train),
        *("--text_column_names", "review", "--label_column_name", "verdict", "--output_dir", str(output_dir)),
        *("--max_seq_length", "32", "--max_steps", "1", "--save_strategy", "no", *COMMON, *extra),
    ]


ROWS = [["a gripping film", "good"], ["two hours lost", "bad"], ["fine acting", "good"], ["dull", "bad"]]


def test_resized_positions_are_what_the_saved_tokenizer_says(finetune_glue, tiny_checkpoint, tmp_path):  # noqa: F811
    """--resize_position_embeddings to 96 tokens: the saved tokenizer truncates at 96, not at the 64 it was
    loaded with (so pipeline(..., truncation=True) reads what the model reads)."""
    train = reviews_csv(tmp_path / "reviews.csv", ROWS)
    extra = ("--max_seq_length", "96", "--resize_position_embeddings", "True")
    finetune_glue.main(finetune_command(tiny_checkpoint, train, tmp_path / "run", *extra))
    assert AutoTokenizer.from_pretrained(tiny_checkpoint).model_max_length != 96
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["max_position_embeddings"] == 96
    assert AutoTokenizer.from_pretrained(tmp_path / "run").model_max_length == 96


def test_a_label_column_of_one_class_is_refused(finetune_glue, tiny_checkpoint, tmp_path):  # noqa: F811
    train = reviews_csv(tmp_path / "reviews.csv", [[text, "good"] for text, _ in ROWS])
    expected = r"--train_file .*reviews.csv: the label column 'verdict' holds one class, 'good', in all 4"
    with pytest.raises(InputError, match=expected + " rows; a classifier needs two classes or more"):
        finetune_glue.main(finetune_command(tiny_checkpoint, train, tmp_path / "run"))


def test_an_empty_text_cell_is_refused_with_its_row_column_and_file(finetune_glue, tiny_checkpoint, tmp_path):  # noqa: F811
    train = reviews_csv(tmp_path / "reviews.csv", ROWS)
    dev = reviews_csv(tmp_path / "dev.csv", [*ROWS[:2], ["", "good"], ROWS[3]])  # row 3's review is empty
    command = finetune_command(tiny_checkpoint, train, tmp_path / "run")
    command[command.index("--validation_file") + 1] = dev
    expected = r"--validation_file .*dev.csv, column 'review': row 3 \(counting data rows from 1\) holds"
    with pytest.raises(InputError, match=expected + r" no text \(empty\); 1 of the 4 rows hold none"):
        finetune_glue.main(command)


def test_a_window_covering_every_input_is_said_once(finetune_glue, tiny_checkpoint, tmp_path, caplog):  # noqa: F811
    """attention_window 512 over texts of a few tokens trains (the model takes short inputs), and the run's
    info log says once that this is exact attention at extra cost; a window shorter than the texts says
    nothing."""
    train = reviews_csv(tmp_path / "reviews.csv", ROWS)
    for window, run in ((512, "wide"), (2, "narrow")):
        config = json.dumps({"attention_window": window, "global_token_indices": [0]})
        attention = ("--attention_type", "longformer", "--attention_config", config)
        finetune_glue.main(finetune_command(tiny_checkpoint, train, tmp_path / run, *attention))
        said = [r.getMessage() for r in caplog.records if "covers every input" in r.getMessage()]
        if window == 512:
            (message,) = said
            assert message.startswith("longformer attention covers every input: each query sees every key")
            assert re.search(r"to 257 tokens and the longest here has [0-9]+, so this run is exact", message)
        else:
            assert said == []
        caplog.clear()


# In a process where hf_efficient cannot be imported: the user's pipeline on the fine-tuned folder, the tokens
# it feeds the model, and the model run on every token of the document.
PREDICT = """
import json, sys
import torch
from transformers import pipeline

folder, document, out = sys.argv[1:]
text = open(document).read()
classifier = pipeline("text-classification", model=folder, trust_remote_code=True, top_k=None)
tokenizer, model = classifier.tokenizer, classifier.model
fed = []  # the length of every input_ids the pipeline gives the model
model.register_forward_pre_hook(lambda _, args, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True)
scores = {row["label"]: row["score"] for row in classifier([text], truncation=True)[0]}
fed_by_pipeline = list(fed)
every_token = tokenizer(text, return_tensors="pt")
with torch.no_grad():
    probs = model(**every_token).logits.softmax(-1)[0].tolist()
json.dump({
    "pipeline": [scores[model.config.id2label[i]] for i in range(model.config.num_labels)], "all": probs,
    "tokens": every_token["input_ids"].shape[1], "fed": fed_by_pipeline,
    "model_max_length": tokenizer.model_max_length,
    "labels": sorted(model.config.id2label.values()), "module": type(model).__module__,
    "hf_efficient_imported": any(name.split(".")[0] == "hf_efficient" for name in sys.modules),
}, open(out, "w"))
"""


@pytest.mark.slow  # a zoo build, a fine-tune and a pipeline in a fresh interpreter
def test_long_document_from_zoo_build_to_pipeline(finetune_glue, stages_in_process, tiny_bert, tmp_path):  # noqa: F811
    """The path of docs/long_documents.md: build a 2,048-position zoo checkpoint (tiny budget, a tiny BERT
    in MiniLM's place), fine-tune it at 2,048 tokens on a CSV of one's own (string labels, own column
    names), then pipeline(..., trust_remote_code=True) where hf_efficient is not installed reads every token
    of a 1,000-plus-token review, not its first 512. The build command, its training stages and the
    fine-tune run in this process (the scripts' main on their command lines' arguments; the stages by
    tests/scripts/conftest.py's stages_in_process): an interpreter start for each checked nothing more;
    only the pipeline, which must not see hf_efficient, starts one. Four documents, two per label."""
    zoo = tmp_path / "minilm-l6-longformer-2048"
    budget = [*small_budget(tiny_bert, 128, 32), "max_position_embeddings=2048"]
    build_command = ["build", NAME, "--output_dir", str(zoo), *(f"--set={value}" for value in budget)]
    load_script("build_checkpoint").main(build_command)

    reviews = load_movie_reviews("imdb")
    texts = [" ".join(reviews[i : i + 6]["text"]) for i in range(0, 24, 6)]  # 4 documents of 6 reviews
    rows = [[text, verdict] for text, verdict in zip(texts, ["loved it", "walked out"] * 2, strict=True)]
    train = reviews_csv(tmp_path / "reviews.csv", rows)
    tuned = tmp_path / "tuned"
    finetune_glue.main(["--model_name_or_path", str(zoo / "final"),
            "--train_file", train, "--validation_file", train, "--text_column_names", "review",
            "--label_column_name", "verdict", "--max_seq_length", "2048", "--max_steps", "1",
            "--per_device_train_batch_size", "4", "--save_strategy", "no", "--output_dir", str(tuned),
            *COMMON])  # fmt: skip

    document = tmp_path / "document.txt"
    document.write_text(texts[0])
    run_python(
        BLOCK_HF_EFFICIENT + PREDICT, tuned, document, tmp_path / "out.json", env={"HF_HOME": str(tmp_path)}
    )
    result = json.loads((tmp_path / "out.json").read_text())
    assert not result["hf_efficient_imported"] and result["module"].startswith("transformers_modules.")
    assert result["labels"] == ["loved it", "walked out"]
    assert result["model_max_length"] == 2048 and 512 < result["tokens"] <= 2048
    # the pipeline fed every token (not the first 512), and its scores are the model's on the whole document
    assert result["fed"] == [result["tokens"]]
    assert result["pipeline"] == pytest.approx(result["all"], abs=1e-6)
