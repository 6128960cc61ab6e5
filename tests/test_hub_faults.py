"""A push that fails halfway (the connection dies while the commit uploads) leaves the hub repository as it
was, says so, and pushing again completes it: the hub applies a push as one commit."""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .hub_server import LocalHub
from .processes import ROOT, child_env, run_python
from .script_loader import CONFIGS, SCRIPTS
from .scripts.test_hub_push import RUN_SCRIPT

PUSH_TWICE = """
import sys
from hf_efficient import EfficientBertForMaskedLM
from tests.models.text.helpers import tiny_config

model = EfficientBertForMaskedLM(tiny_config())
try:
    model.push_to_hub("user/interrupted")
except Exception as error:  # the first upload's connection is dropped by the server
    print("FIRST PUSH FAILED:", type(error).__name__, error)
else:
    print("FIRST PUSH COMPLETED")
model.push_to_hub("user/interrupted")
"""


@pytest.mark.slow  # a fresh interpreter and a local hub server
def test_a_push_cut_off_halfway_leaves_the_repo_as_it_was_and_a_retry_completes(tmp_path):
    with LocalHub() as hub:
        hub.commits_to_drop = 1
        run_python(PUSH_TWICE, env=hub.client_env(tmp_path / "hf_home"), cwd=ROOT)
        commits = [files for repo_id, _, files in hub.commits if repo_id == "user/interrupted"]
        assert len(commits) == 1, "the cut-off upload committed nothing; the retry committed once"
        assert {"config.json", "model.safetensors"} <= set(commits[0])
        assert hub.commits_to_drop == 0


@pytest.mark.slow  # a training script and the hf CLI in fresh processes, a local hub server
def test_a_scripts_failed_push_says_so_and_its_command_completes_it(tmp_path):
    output = tmp_path / "run"
    args = ["--config", str(CONFIGS / "graph" / "base_tiny.json"), "--dataset_name", "karate"]
    args += ["--output_dir", str(output), "--max_steps", "2", "--save_strategy", "no", "--report_to", "none"]
    args += ["--push_to_hub", "--hub_model_id", "user/cut-off"]
    with LocalHub() as hub:
        hub.commits_to_drop = 1
        env = {**child_env(), **hub.client_env(tmp_path / "hf_home")}
        script = [sys.executable, "-c", textwrap.dedent(RUN_SCRIPT), str(SCRIPTS / "train_graph.py"), *args]
        failed = subprocess.run(script, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert failed.returncode != 0
        assert "the repository is as it was before it" in failed.stderr, failed.stderr[-2000:]
        assert not [c for c in hub.commits if c[0] == "user/cut-off"], "nothing was committed"
        command = failed.stderr.split("Push it again with: ")[1].splitlines()[0]
        assert command.startswith("hf upload user/cut-off ")
        hf = str(Path(sys.executable).parent / "hf")  # the CLI of the huggingface_hub installed here
        subprocess.run(
            [hf, *shlex.split(command)[1:]],
            env=env,
            cwd=tmp_path,
            check=True,
            capture_output=True,
            timeout=300,
        )
        pushed = set(hub.repos["user/cut-off"].tree("main")[1])
        assert {"README.md", "config.json", "model.safetensors"} <= pushed
        assert not {name for name in pushed if name.startswith(("checkpoint-", "_"))}
