"""What the script tests share: tiny text-model sizes, the common flags, the pretraining command line, the
logged losses of a run, the user errors every training script answers in one line, and a script run
in-process as the command line runs it (status and stderr)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hf_efficient.cli import run_script

from ..script_loader import QUIET, load_script

TINY_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
TINY_SIZES["max_position_embeddings"] = 64
TINY = ",".join(f"{key}={value}" for key, value in TINY_SIZES.items())
COMMON = [*QUIET, "--logging_steps", "1", "--dataloader_pin_memory", "false"]
# The scripts that parse TrainingArguments (every flag of transformers' Trainer).
HF_TRAINING_SCRIPTS = (
    "distill_attention",
    "finetune_glue",
    "finetune_image_classification",
    "finetune_qa",
    "pretrain_clm",
    "pretrain_mae",
    "pretrain_mlm",
    "train_graph",
)
# Flags a script requires, checked before the others ("{tmp}": the test's folder).
REQUIRED = {"distill_attention": ["--model_name_or_path", "{tmp}"]}


def pretrain_args(data, output_dir, attention_type, attention_config, *extra) -> list[str]:
    """pretrain_mlm.py's command line for a tiny model on ``data["corpus"]`` (the ``data`` fixture)."""
    return [
        *("--train_files", data["corpus"], "--output_dir", str(output_dir), "--vocab_size", "500"),
        *("--block_size", "64", "--config_overrides", TINY, "--per_device_train_batch_size", "4"),
        *("--attention_type", attention_type, "--attention_config", json.dumps(attention_config)),
        *COMMON,
        *extra,
    ]


def logged_losses(output_dir) -> dict[int, float]:
    """{step: training loss} of the run in ``output_dir`` (its trainer_state.json)."""
    history = json.loads((Path(output_dir) / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def trainer_progress_bars(stderr: str) -> list[int]:
    """The totals of ``Trainer``'s progress bars in a run's ``stderr``, one per bar drawn: tqdm renders a new
    bar first as ``  0%|...| 0/N``, after a carriage return or a line break; bars with a description
    (``Loading weights:``, ``Writing model shards:``, datasets' ``Map:``) are not Trainer's."""
    starts = (re.match(r"\s*0%\|[^|]*\| 0/(\d+) ", segment) for segment in re.split(r"[\r\n]", stderr))
    return [int(start.group(1)) for start in starts if start]


def recording(trainer_class: type, trainers: list) -> type:
    """A subclass of ``trainer_class`` that appends every instance to ``trainers``, so a test that patches a
    script's trainer with it can read the datasets the script built (``trainers[0].train_dataset``)."""

    class Recording(trainer_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trainers.append(self)

    return Recording


def training_script_errors(required: list[str]) -> dict[str, tuple[list[str], str]]:
    """{case: (command line, what the error line must say)} of the user errors every training program over
    ``Trainer`` answers (the scripts' and the lab's); ``required``: flags checked before unknown ones;
    "{tmp}" stands for the test's folder."""
    return {
        "bad flag": ([*required, "--no_such_flag", "1"], "unknown flag --no_such_flag"),
        "bad value": (
            ["--output_dir", "{tmp}/out", "--max_steps", "many"],
            "error: --max_steps: invalid int value: 'many'",
        ),
        "missing file": (
            ["--output_dir", "{tmp}/out", "--config", "{tmp}/no.json"],
            "--config {tmp}/no.json",
        ),
    }


def run_in_process(name: str, args: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of ``scripts/<name>.py args`` through :func:`run_script`, in this process."""
    return exit_status_and_stderr(load_script(name).main, args, capsys)


def exit_status_and_stderr(main, args: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of ``main(args)`` through :func:`run_script`, in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_script(main, args)
    return exit_info.value.code, capsys.readouterr().err


def check_user_error(main, args: list[str], expected: str, tmp_path, capsys) -> None:
    """``main(args)`` ("{tmp}": ``tmp_path``) answers with one ``error: ...`` line saying ``expected``, exit
    status 2 and no traceback."""
    status, stderr = exit_status_and_stderr(
        main, [arg.replace("{tmp}", str(tmp_path)) for arg in args], capsys
    )
    assert status == 2, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert expected.replace("{tmp}", str(tmp_path)) in stderr
    assert "Traceback" not in stderr
