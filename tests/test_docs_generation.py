"""Every command of docs/generation.md runs, in the page's order, at tiny sizes.

The page's code blocks are read from the file itself: each ``bash`` command (continuation lines joined) and
each ``python`` block. Paths under ``runs/`` and ``benchmarks/results/`` move into a temporary folder, and
flags for tiny sizes are appended to the training and benchmark commands (a later flag wins over the page's):
a few IMDB texts and training steps on a tiny model, the generation benchmark's smoke preset. What the
commands produce is checked: a perplexity table with full as its reference row, a pipeline that generates.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .processes import ROOT, child_env

PAGE = ROOT / "docs" / "generation.md"
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", flags=re.MULTILINE | re.DOTALL)
TINY_MODEL = "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64"
SMALL = {  # appended to a command whose program it names
    "pretrain_clm.py": f"--max_train_texts 150 --max_steps 2 --block_size 32 --config_overrides {TINY_MODEL} "
    "--per_device_train_batch_size 4 --save_strategy no --report_to none",
    "benchmarks.generation": "--preset smoke --types full_sdpa linear --lengths 16 32",
}


def page_commands(page: Path = PAGE) -> list[tuple[str, str]]:
    """(language, code) of every command of the page, in order: one per bash line, one per python block."""
    commands = []
    for language, code in BLOCK.findall(page.read_text()):
        if language == "python":
            commands.append((language, code))
            continue
        for line in code.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append((language, line))
    return commands


def tiny(command: str, scratch: Path) -> str:
    """The command with its outputs in ``scratch`` and, for training and benchmarks, tiny sizes."""
    command = command.replace("runs/", f"{scratch}/runs/").replace(
        "benchmarks/results/", f"{scratch}/results/"
    )
    command = command.replace("load_movie_reviews('imdb')", "load_movie_reviews('imdb').select(range(300))")
    command = command.replace("'text', 8000, 128)", "'text', 600, 128)")  # the tokenizer: a small vocabulary
    return " ".join([command, *(extra for program, extra in SMALL.items() if program in command)])


def test_the_page_has_the_commands_this_test_expects():
    commands = page_commands()
    bash = [code for language, code in commands if language == "bash"]
    assert sum("scripts/pretrain_clm.py" in line for line in bash) == 5  # one run per causal type
    assert any("benchmarks.clm_perplexity" in line for line in bash)
    assert any("benchmarks.generation" in line for line in bash)
    assert sum(language == "python" for language, _ in commands) == 2
    assert "PERPLEXITY_TABLE" not in PAGE.read_text() and "GENERATION_TABLE" not in PAGE.read_text()


@pytest.mark.slow  # five tiny training runs, two benchmarks (minutes on a loaded 2-core machine)
def test_every_command_of_the_page_runs(tmp_path):
    for language, code in page_commands():
        command = tiny(code, tmp_path)
        if language == "python":
            args = [sys.executable, "-c", command]
        else:
            args = ["bash", "-c", command.replace(".venv/bin/python", shlex.quote(sys.executable))]
        result = subprocess.run(args, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        if language == "python" and "pipeline" in command:
            assert result.stdout.startswith("this movie was")
    summary = (tmp_path / "results" / "reference" / "clm_perplexity" / "summary.md").read_text()
    assert "`full` (reference)" in summary and "Warning" not in summary  # one budget for the five runs
    for attention_type in ("linear", "performer", "rfa", "longformer"):
        assert f"| `{attention_type}` |" in summary
    assert (tmp_path / "results" / "reference" / "generation" / "generation.png").exists()
