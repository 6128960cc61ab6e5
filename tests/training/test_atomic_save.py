"""The final save of a run replaces the model at the top of output_dir only once the new one is whole: a
kill -9 while it is being written leaves the previous model as it was, and the next save completes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from hf_efficient import EfficientBertForSequenceClassification
from hf_efficient.training.trainer import SAVING_FOLDER

from ..processes import ROOT, child_env

CHILD = """
import os, shutil, signal, sys
from pathlib import Path

import torch
from transformers import TrainingArguments

import transformers.modeling_utils as modeling_utils
from hf_efficient import EfficientBertForSequenceClassification
from hf_efficient.training import EfficientTrainer
from tests.models.text.helpers import tiny_config

output_dir, when = Path(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = EfficientBertForSequenceClassification(tiny_config(num_labels=2))
args = TrainingArguments(output_dir=str(output_dir), report_to=[], use_cpu=True)
trainer = EfficientTrainer(model=model, args=args)
if not (output_dir / "model.safetensors").exists():
    trainer.save_model()  # the earlier model
    shutil.copy(output_dir / "model.safetensors", output_dir.parent / "earlier.safetensors")
with torch.no_grad():
    for p in model.parameters():
        p.add_(1.0)  # the new model differs in every weight

def killed_halfway(state_dict, filename, *args, **kwargs):  # half of the weights file, then kill -9
    written(state_dict, filename, *args, **kwargs)
    data = Path(filename).read_bytes()
    Path(filename).write_bytes(data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)

written = modeling_utils.safe_save_file
if when == "while_writing":
    modeling_utils.safe_save_file = killed_halfway
trainer.save_model()
"""


def _save(folder, when: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(folder), when],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # a fresh interpreter (killed by -9)
def test_a_kill_during_the_final_save_leaves_the_earlier_model(tmp_path, monkeypatch):
    """The killed save runs in a fresh interpreter (it dies); the save after it runs CHILD in this process
    (nothing kills it, so a second interpreter start checked nothing more)."""
    folder = tmp_path / "run"
    killed = _save(folder, "while_writing")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    earlier = load_file(tmp_path / "earlier.safetensors")
    assert (folder / SAVING_FOLDER / "model.safetensors").exists()  # the torn file stayed where written
    torch.testing.assert_close(load_file(folder / "model.safetensors"), earlier, atol=0, rtol=0)
    EfficientBertForSequenceClassification.from_pretrained(folder)  # whole and loadable

    monkeypatch.setattr(sys, "argv", ["-c", str(folder), "to_the_end"])
    exec(compile(textwrap.dedent(CHILD), "CHILD", "exec"), {"__name__": "child"})
    assert not (folder / SAVING_FOLDER).exists()
    newer = load_file(folder / "model.safetensors")
    assert all(torch.equal(newer[name], earlier[name] + 1.0) for name in earlier)
