"""A full disk while a checkpoint is written: the run stops with an error that says so, the partial
checkpoint is removed, and the last complete one is kept for --resume_from_checkpoint last. The output folder
is a 3 MiB tmpfs mounted by the test (root only), which a tiny model's checkpoints fill within a few steps."""

from __future__ import annotations

import os
import subprocess

import pytest

from hf_efficient import EfficientBertForSequenceClassification
from hf_efficient.training import EfficientTrainer, last_checkpoint, resolve_resume_checkpoint
from hf_efficient.training.checkpoints import checkpoint_folders, checkpoint_problem

from ..models.text.helpers import tiny_config
from .helpers import classification_examples, every_step_arguments

# A mount changes the machine's mount table, which no other test should see change under it.
pytestmark = pytest.mark.one_at_a_time


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_during_a_checkpoint_keeps_the_last_complete_one(small_disk):
    data = classification_examples()
    model = EfficientBertForSequenceClassification(tiny_config(num_labels=2))
    output = small_disk / "run"
    args = every_step_arguments(output, max_steps=40)
    with pytest.raises(
        OSError, match=r"No space left on the device while writing .*checkpoint-\d+.* is kept"
    ):
        EfficientTrainer(model=model, args=args, train_dataset=data).train()
    folders = checkpoint_folders(output)
    assert folders and all(checkpoint_problem(folder) is None for _, folder in folders), (
        "a partial one is left"
    )
    assert resolve_resume_checkpoint("last", output) == str(last_checkpoint(output))
