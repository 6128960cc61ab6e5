"""Every script stops on an input that does not fit, where it enters, with one ``error:`` line naming what,
where and the fix, and exit status 2: a tokenizer that is not the model's, a mistyped label (or text, or
answers) column, a malformed record of each file format the script reads, and a flag the machine cannot
honour (here: one without a GPU). Nothing trains on a broken input."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from PIL import Image

from hf_efficient import EfficientBertForMaskedLM, EfficientBertForQuestionAnswering
from hf_efficient.data.packaged_bert import packaged_tokenizer

from ..data.helpers import write_csv
from ..models.graph.helpers import base_records
from ..script_loader import CONFIGS
from .helpers import COMMON, HF_TRAINING_SCRIPTS, REQUIRED, TINY, run_in_process

DEVICE_FLAGS = {  # {flag: what the error line starts with}
    "--bf16": "error: --bf16 (or --bf16_full_eval) computes in bfloat16 on a GPU, and this machine has none",
    "--fp16": "error: --fp16 computes in float16 on a GPU, and this machine has none",
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the flags fit a machine with a GPU")
@pytest.mark.parametrize("flag", sorted(DEVICE_FLAGS))
@pytest.mark.parametrize("name", HF_TRAINING_SCRIPTS)
def test_a_flag_the_device_cannot_honour(name, flag, tmp_path, capsys):
    """transformers raises on --bf16 after 27 lines of traceback, and trains an --fp16 run in float32."""
    required = [arg.replace("{tmp}", str(tmp_path)) for arg in REQUIRED.get(name, [])]
    status, stderr = run_in_process(name, [*required, "--output_dir", str(tmp_path / "out"), flag], capsys)
    assert status == 2 and stderr.startswith(DEVICE_FLAGS[flag]) and stderr.count("\n") == 1, stderr
    assert "--use_cpu" in stderr and not (tmp_path / "out").exists()


REVIEWS = [("a gripping, funny film", "pos"), ("two hours I will not get back", "neg")] * 4
CONTEXT = "the film was directed by maria lopez in madrid ."
QUESTION = {"id": "a", "question": "who directed the film ?", "context": CONTEXT}
QUESTION["answers"] = {"text": ["maria lopez"], "answer_start": [CONTEXT.index("maria lopez")]}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """The inputs of the cases: a tiny checkpoint with all-MiniLM-L6-v2's tokenizer (and copies of it whose
    tokenizer folder holds only tokenizer_config.json: 5 special tokens), and each file format the scripts
    read, well formed and with one malformed record."""
    root = tmp_path_factory.mktemp("inputs")
    tokenizer, paths = packaged_tokenizer(), {}
    sizes = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    for name, head in (
        ("checkpoint", EfficientBertForMaskedLM),
        ("qa_checkpoint", EfficientBertForQuestionAnswering),
    ):
        model = head(head.config_class(vocab_size=tokenizer.vocab_size, max_position_embeddings=64, **sizes))
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    (root / "bad_tokenizer").mkdir()
    shutil.copy(root / "checkpoint" / "tokenizer_config.json", root / "bad_tokenizer")
    shutil.copytree(
        root / "checkpoint", root / "bad_checkpoint", ignore=shutil.ignore_patterns("tokenizer.json")
    )
    paths.update(
        {
            name: str(root / name)
            for name in ("checkpoint", "qa_checkpoint", "bad_tokenizer", "bad_checkpoint")
        }
    )
    rows = [list(row) for row in REVIEWS]
    paths["reviews.csv"] = write_csv(root / "reviews.csv", ["sentence", "label"], rows)
    (root / "corpus.txt").write_text("\n".join(text for text, _ in REVIEWS * 8))
    paths["corpus.txt"] = str(root / "corpus.txt")
    malformed = {
        "bad.csv": "sentence,label\na fine film,pos\na bore, really,neg\n",
        "bad.jsonl": '{"sentence": "a fine film", "label": "pos"}\n{"sentence": "a bore", "label": "neg"\n',
        "bad.json": '[{"sentence": "a fine film", "label": "pos"},\n {"sentence": "a bore" "label": "neg"}]',
        "questions.jsonl": json.dumps(QUESTION) + "\n" + json.dumps({**QUESTION, "question": None}) + "\n",
        "questions.json": json.dumps(
            {"data": [QUESTION, {**QUESTION, "id": "b", "answers": {"text": "x", "answer_start": 0}}]}
        ),
        "graphs.jsonl": json.dumps(base_records()[0]) + "\n{'edge_index': [[0, 1], [1, 0]]}\n",
    }
    for name, content in malformed.items():
        (root / name).write_text(content)
        paths[name] = str(root / name)
    (root / "bad.txt").write_bytes(b"a fine film\n\xff\xfe a bore\n")
    paths["bad.txt"] = str(root / "bad.txt")
    paths["good_questions.jsonl"] = str(root / "good_questions.jsonl")
    (root / "good_questions.jsonl").write_text(json.dumps(QUESTION) + "\n")
    for label in ("cat", "dog"):
        (root / "images" / label).mkdir(parents=True)
        for i in range(2):
            Image.new("L", (8, 8), color=40 * i).save(root / "images" / label / f"{i}.png")
    (root / "images" / "dog" / "2.png").write_bytes(b"not an image")
    paths["images"] = str(root / "images")
    (root / "graphs").mkdir()
    paths["good_graphs.jsonl"] = str(root / "graphs" / "train.jsonl")
    (root / "graphs" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in base_records()) + "\n")
    return paths


LM = ["--block_size", "32", "--config_overrides", TINY, "--max_steps", "1"]
TOKENS = "the tokenizer turns 100% of the tokens of the first"
VISION = ["--config", str(CONFIGS / "vision" / "base_tiny.json"), "--max_steps", "1"]
GRAPH = ["--config", str(CONFIGS / "graph" / "base_tiny.json"), "--max_steps", "1"]
DISTIL = ["--attention_type", "linear", "--block_size", "32", "--model_name_or_path"]  # then the checkpoint
GLUE = ["--model_name_or_path", "{checkpoint}", "--max_seq_length", "64"]
QA = ["--model_name_or_path", "{qa_checkpoint}", "--max_seq_length", "64"]
MALFORMED = {  # {file: what the error line says of its malformed record}
    "bad.txt": "bad.txt cannot be read: UnicodeDecodeError",
    "bad.csv": "bad.csv cannot be read: ParserError: Error tokenizing data. C error: Expected 2 fields",
    "bad.jsonl": "bad.jsonl, line 2: not a JSON record (Expecting ',' delimiter at column 38)",
    "bad.json": "bad.json, line 2, column 24: not valid JSON (Expecting ',' delimiter)",
}


def malformed(args: list[str], flag: str, files=tuple(MALFORMED)) -> dict:
    """The case of each malformed file of ``files``, read with ``flag`` after ``args``."""
    return {f"malformed {file}": ([*args, flag, f"{{{file}}}"], MALFORMED[file]) for file in files}


def bad_tokenizer(args: list[str], named: str) -> dict:
    """The case of the tokenizer of 5 special tokens, given by ``args``, as the error names it."""
    return {"bad tokenizer": (args, f"error: {named}: {TOKENS}")}


# {script: {case: (arguments, what the one error line says)}}; "{name}" is the path of inputs()'s "name"
CASES = {
    **{
        name: {
            **bad_tokenizer(
                [*LM, "--train_files", "{corpus.txt}", "--tokenizer_name", "{bad_tokenizer}"],
                "--tokenizer_name {bad_tokenizer}",
            ),
            "mistyped text column": (
                [*LM, "--train_files", "{reviews.csv}", "--text_column", "sentense"],
                "error: The corpus has no column 'sentense'. Its columns are ['sentence', 'label']",
            ),
            **malformed(LM, "--train_files"),
        }
        for name in ("pretrain_mlm", "pretrain_clm")
    },
    "distill_attention": {
        **bad_tokenizer(
            [*DISTIL, "{bad_checkpoint}", "--train_files", "{corpus.txt}"],
            "--model_name_or_path {bad_checkpoint}'s tokenizer",
        ),
        "mistyped text column": (
            [*DISTIL, "{checkpoint}", "--train_files", "{reviews.csv}", "--text_column", "txt"],
            "error: The corpus has no column 'txt'",
        ),
        **malformed([*DISTIL, "{checkpoint}"], "--train_files"),
    },
    "finetune_glue": {
        **bad_tokenizer(
            [*GLUE, "--train_file", "{reviews.csv}", "--tokenizer_name", "{bad_tokenizer}"],
            "--tokenizer_name {bad_tokenizer}",
        ),
        "mistyped label column": (
            [*GLUE, "--train_file", "{reviews.csv}", "--label_column_name", "lable"],
            "has no column(s) ['lable']; its columns are ['sentence', 'label']: name yours with",
        ),
        **malformed(GLUE, "--train_file", ("bad.csv", "bad.jsonl", "bad.json")),
    },
    "finetune_qa": {
        **bad_tokenizer(
            [*QA, "--train_file", "{good_questions.jsonl}", "--tokenizer_name", "{bad_tokenizer}"],
            "--tokenizer_name {bad_tokenizer}",
        ),
        "mistyped answers column": (
            [*QA, "--train_file", "{good_questions.jsonl}", "--answer_column_name", "answer"],
            "error: The training questions have no 'answer' column",
        ),
        "malformed .jsonl": (
            [*QA, "--train_file", "{questions.jsonl}"],
            "questions.jsonl, record 2 (id 'a'): 'question' holds no question (no such key)",
        ),
        "malformed .json": (
            [*QA, "--train_file", "{questions.json}"],
            "questions.json, record 2 (id 'b'): 'answers' must be {'text': [...], 'answer_start': [...]}",
        ),
    },
    "finetune_image_classification": {
        "mistyped label column": (
            [*VISION, "--train_dir", "{images}", "--label_column_name", "lable"],
            "error: The dataset has no label column 'lable'",
        ),
        "malformed image": (
            [*VISION, "--train_dir", "{images}", "--validation_split_percentage", "0"],
            "dog/2.png is not an image that Pillow can read",
        ),
    },
    "pretrain_mae": {
        "malformed image": (
            [*VISION, "--train_dir", "{images}", "--validation_split_percentage", "0"],
            "dog/2.png is not an image that Pillow can read",
        ),
    },
    "train_graph": {
        "mistyped label column": (
            [*GRAPH, "--train_file", "{good_graphs.jsonl}", "--label_column_name", "lable"],
            "error: The dataset has no label column 'lable'",
        ),
        "malformed .jsonl": (
            [*GRAPH, "--train_file", "{graphs.jsonl}"],
            "graphs.jsonl, line 2: not a JSON record",
        ),
    },
    "fill_mask": {
        "bad tokenizer": (
            ["--model", "{bad_checkpoint}", "a [MASK] film ."],
            "error: --model {bad_checkpoint}'s tokenizer: the tokenizer turns 75% of the tokens",
        ),
    },
    "export": {
        "bad tokenizer": (
            ["--model_name_or_path", "{bad_checkpoint}", "--output_dir", "{out}"],
            "error: --model_name_or_path {bad_checkpoint}'s tokenizer: the tokenizer has 5 tokens",
        ),
    },
    "serve_onnx": bad_tokenizer(
        ["--model_dir", "{bad_checkpoint}", "a fine film"], "--model_dir {bad_checkpoint}'s tokenizer"
    ),
}


def fill(text: str, inputs: dict, out) -> str:
    """``text`` with each ``{name}`` of ``inputs`` (and ``{out}``) replaced by its path."""
    paths = {**inputs, "out": str(out)}
    return re.sub(r"\{([\w.]+)\}", lambda match: paths.get(match[1], match[0]), text)


@pytest.mark.parametrize(
    ("name", "case"),
    [(name, case) for name, cases in CASES.items() for case in cases],
    ids=[f"{name}-{case}" for name, cases in CASES.items() for case in cases],
)
def test_a_broken_input_is_one_line_and_nothing_trains(name, case, inputs, tmp_path, capsys):
    """The bad tokenizer trained and evaluated on [UNK] alone (exit status 0); a record without its question
    failed in the tokenizer, a malformed JSON line or CSV row in datasets (21-47 lines of traceback)."""
    args, expected = CASES[name][case]
    out = tmp_path / "out"
    args = [fill(arg, inputs, out) for arg in args]
    if name not in ("fill_mask", "export", "serve_onnx"):
        args += ["--output_dir", str(out), *COMMON]
    status, stderr = run_in_process(name, args, capsys)
    expected = fill(expected, inputs, out)
    line = stderr.rstrip("\n").split("\n")[-1]  # after datasets' progress bars, if any
    assert status == 2 and line.startswith("error: ") and expected in line, stderr
    assert [line for line in stderr.split("\n") if line.startswith("error: ")] == [line]
    assert "Traceback" not in stderr
    assert not (out / "model.safetensors").exists()  # nothing trained, nothing saved
