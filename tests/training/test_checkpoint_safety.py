"""Paths and checkpoints: ``from_pretrained`` of a folder that is not there or of weights cut short says what
is wrong with which file; a checkpoint a run was killed while writing is never resumed from (``last`` skips
it, rotation never counts it); two runs cannot write one output folder; an earlier run's model is not
overwritten unless asked.

The kill -9 of a real training run in the middle of a checkpoint is tests/scripts/test_argument_errors.py's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForMaskedLM, Trainer, TrainingArguments

from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM, EfficientBertForSequenceClassification
from hf_efficient.training import (
    EfficientTrainer,
    OutputDirInUseError,
    OutputDirNotEmptyError,
    last_checkpoint,
    resolve_resume_checkpoint,
    train_and_save,
)
from hf_efficient.training.checkpoints import COMPLETE_MARKER, checkpoint_problem, mark_checkpoint_complete
from hf_efficient.training.output_dir import (
    LOCK_FILE,
    check_output_dir_free,
    lock_output_dir,
    release_output_dirs,
)

from ..models.text.helpers import batch, tiny_config
from ..processes import ROOT, child_env, free_port, launch
from .helpers import classification_examples

# ---------------------------------------------------------------------------------------------------------
# from_pretrained: missing folders, weights cut short
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/no/such/model", "./runs/no-such-model", "runs/a/b/no-such-model"])
@pytest.mark.parametrize(
    "loader", [EfficientBertForMaskedLM.from_pretrained, EfficientBertConfig.from_pretrained]
)
def test_a_local_path_that_does_not_exist_says_so(path, loader):
    with pytest.raises(
        FileNotFoundError, match=rf"from_pretrained: no such folder '{path}' \(.* does not exist\)"
    ):
        loader(path)


def test_a_relative_name_that_is_neither_a_folder_nor_on_the_hub_says_both():
    """``runs/model`` may be a hub id (namespace/name): the hub is asked; the error says it is no folder."""
    with pytest.raises(
        OSError, match=r"'runs/no-such-model' is not a local folder \(.* does not exist\), so the hub"
    ):
        EfficientBertForMaskedLM.from_pretrained("runs/no-such-model")


@pytest.fixture
def saved_model(tmp_path):
    EfficientBertForMaskedLM(tiny_config()).save_pretrained(tmp_path)
    return tmp_path


CORRUPTIONS = {
    "cut in half": (
        lambda data: data[: len(data) // 2],
        r"its tensors need [\d,]+ bytes but the file has [\d,]+",
    ),
    "10 bytes short": (lambda data: data[:-10], r"its tensors need [\d,]+ bytes but the file has [\d,]+"),
    "only the length of the header": (
        lambda data: data[:8],
        r"its header says [\d,]+ bytes of metadata follow",
    ),
    "empty": (lambda data: b"", r"it has 0 bytes, too few for the 8-byte header length"),
    "zeros": (lambda data: bytes(len(data)), r"its header is not valid safetensors metadata"),
}


@pytest.mark.parametrize(
    "loader", [EfficientBertForMaskedLM.from_pretrained, AutoModelForMaskedLM.from_pretrained]
)
@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_corrupt_weights_file_is_named_with_what_to_do(saved_model, case, loader):
    corrupt, problem = CORRUPTIONS[case]
    weights = saved_model / "model.safetensors"
    weights.write_bytes(corrupt(weights.read_bytes()))
    with pytest.raises(OSError, match=rf"{weights} is truncated or corrupt: {problem}.*save the model again"):
        loader(saved_model)


def test_a_missing_weight_shard_is_named(tmp_path):
    EfficientBertForMaskedLM(tiny_config()).save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    (tmp_path / shards[-1]).unlink()
    with pytest.raises(OSError, match=rf"names weight shards that are not in .*\['{shards[-1]}'\]"):
        EfficientBertForMaskedLM.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: marked complete once written; `last` and rotation use complete ones only
# ---------------------------------------------------------------------------------------------------------


def _trainer(output_dir, trainer_class=EfficientTrainer, **overrides) -> Trainer:
    arguments = dict(max_steps=4, save_steps=2, per_device_train_batch_size=2, report_to=[], use_cpu=True)
    args = TrainingArguments(output_dir=str(output_dir), **{**arguments, **overrides})
    model = EfficientBertForSequenceClassification(tiny_config(num_labels=2))
    return trainer_class(model=model, args=args, train_dataset=classification_examples())


@pytest.fixture
def trained(tmp_path):
    """An output folder with checkpoint-2 and checkpoint-4 written by EfficientTrainer."""
    _trainer(tmp_path).train()
    return tmp_path


def test_every_checkpoint_is_marked_complete_with_its_files(trained):
    for step in (2, 4):
        marker = json.loads((trained / f"checkpoint-{step}" / COMPLETE_MARKER).read_text())
        assert marker["global_step"] == step
        assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= set(
            marker["files"]
        )
        assert checkpoint_problem(trained / f"checkpoint-{step}") is None
    assert last_checkpoint(trained) == trained / "checkpoint-4"


INCOMPLETE = {
    # killed before the optimizer: model written, nothing else (no marker, no trainer_state.json)
    "killed after the weights": (
        lambda c: [p.unlink() for p in c.iterdir() if p.name != "model.safetensors"],
        r"no trainer_state.json",
    ),
    "weights cut short later": (
        lambda c: (c / "model.safetensors").write_bytes(b"\0" * 100),
        r"model.safetensors has 100 bytes, not the [\d,]+",
    ),
    "optimizer lost": (lambda c: (c / "optimizer.pt").unlink(), r"optimizer.pt is missing"),
}


@pytest.mark.parametrize("case", list(INCOMPLETE))
def test_last_skips_an_incomplete_checkpoint(trained, case, caplog):
    spoil, problem = INCOMPLETE[case]
    spoil(trained / "checkpoint-4")
    assert last_checkpoint(trained) == trained / "checkpoint-2"
    assert "skipped incomplete checkpoints: checkpoint-4" in caplog.text
    assert resolve_resume_checkpoint("last", trained) == str(trained / "checkpoint-2")
    assert resolve_resume_checkpoint(True, trained) == str(trained / "checkpoint-2")
    with pytest.raises(
        ValueError, match=rf"Cannot resume from .*checkpoint-4: .*{problem}.*last picks the newest complete"
    ):
        resolve_resume_checkpoint(str(trained / "checkpoint-4"), trained)
    spoil(trained / "checkpoint-2")
    with pytest.raises(
        ValueError, match=r"No valid checkpoint found in output directory .*Incomplete .*checkpoint-2"
    ):
        resolve_resume_checkpoint("last", trained)


@pytest.mark.parametrize("resume", [True, "last"])
def test_resuming_without_any_checkpoint_raises_as_transformers_does(tmp_path, resume):
    """transformers raises for resume_from_checkpoint=True with no checkpoint; `last` does too (it used to
    start from scratch silently)."""
    trainer = _trainer(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match=rf"No valid checkpoint found in output directory \({tmp_path}\)"):
        trainer.train(resume_from_checkpoint=resume)
    trainer.args.resume_from_checkpoint = resume
    with pytest.raises(ValueError, match=r"No valid checkpoint found in output directory"):
        train_and_save(trainer)


def test_a_stale_folder_of_the_same_step_is_replaced_and_rotation_counts_complete_ones(tmp_path):
    """A killed run left checkpoint-2 half written (a stray file, no marker): the new checkpoint-2 holds none
    of it; with save_total_limit=1 only the newest complete checkpoint stays."""
    stale = tmp_path / "checkpoint-2"
    stale.mkdir(parents=True)
    (stale / "stray.bin").write_bytes(b"from the killed run")
    _trainer(tmp_path, save_total_limit=1).train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4"]
    assert checkpoint_problem(tmp_path / "checkpoint-4") is None
    _trainer(tmp_path / "again", max_steps=2).train()
    (tmp_path / "again" / "checkpoint-2" / "stray.bin").write_bytes(b"x")  # after the marker: not listed
    assert checkpoint_problem(tmp_path / "again" / "checkpoint-2") is None


def test_checkpoints_of_plain_trainer_count_when_their_state_is_whole(tmp_path):
    _trainer(tmp_path, Trainer).train()
    assert not (tmp_path / "checkpoint-4" / COMPLETE_MARKER).exists()
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    state = tmp_path / "checkpoint-4" / "trainer_state.json"
    state.write_text(state.read_text()[:50])  # killed while writing the last file
    assert (
        checkpoint_problem(tmp_path / "checkpoint-4")
        == "its trainer_state.json is cut short: the save was interrupted"
    )
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-2"


# ---------------------------------------------------------------------------------------------------------
# One run per output folder
# ---------------------------------------------------------------------------------------------------------

HOLD_LOCK = """
import sys, time
from hf_efficient.training.output_dir import lock_output_dir
lock_output_dir(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


@pytest.mark.slow  # a fresh interpreter holds the lock
def test_a_second_run_on_a_locked_output_dir_is_refused_until_the_first_dies(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD_LOCK), str(tmp_path)],
        env=child_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            OutputDirInUseError, match=rf"in use by another run \(pid {holder.pid} on .*-c {tmp_path}"
        ):
            lock_output_dir(tmp_path)
    finally:
        holder.send_signal(
            signal.SIGKILL
        )  # as a killed run: the kernel drops its lock, no stale lock remains
        holder.wait()
    assert lock_output_dir(tmp_path) == tmp_path / LOCK_FILE
    assert lock_output_dir(tmp_path) == tmp_path / LOCK_FILE  # this process again: fine
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    release_output_dirs()
    assert not (tmp_path / LOCK_FILE).exists()


def test_an_earlier_runs_model_is_not_overwritten_unless_asked(tmp_path):
    check_output_dir_free(tmp_path, resuming=False, overwrite=False)  # empty: fine
    EfficientBertForMaskedLM(tiny_config()).save_pretrained(tmp_path)
    # no checkpoint to continue from: --resume_from_checkpoint is not offered
    model_only = r"already holds a saved model \(config.json and its weights\) of an earlier run. "
    model_only += r"It holds no checkpoint \(--save_strategy no\?\), so it cannot be continued: "
    model_only += r"replace it with --overwrite_output_dir, or give this run another --output_dir.$"
    with pytest.raises(OutputDirNotEmptyError, match=model_only):
        check_output_dir_free(tmp_path, resuming=False, overwrite=False)
    (tmp_path / "checkpoint-7").mkdir()  # cut short: no trainer_state.json, no marker
    with pytest.raises(OutputDirNotEmptyError, match=r"It holds incomplete checkpoints only, so it cannot"):
        check_output_dir_free(tmp_path, resuming=False, overwrite=False)
    mark_checkpoint_complete(tmp_path / "checkpoint-7", 7)
    message = r"already holds a saved model \(config.json and its weights\) and checkpoints checkpoint-7 "
    message += r".*Continue that run with --resume_from_checkpoint last.*--overwrite_output_dir"
    with pytest.raises(OutputDirNotEmptyError, match=message):
        check_output_dir_free(tmp_path, resuming=False, overwrite=False)
    check_output_dir_free(tmp_path, resuming=True, overwrite=False)  # continuing that run: fine
    check_output_dir_free(tmp_path, resuming=False, overwrite=True)  # replacing it: its checkpoints go
    assert not (tmp_path / "checkpoint-7").exists() and (tmp_path / "model.safetensors").exists()


def test_weights_loaded_from_a_complete_checkpoint_equal_the_trained_ones(trained):
    """The marker changes nothing in what a checkpoint holds: its weights load as saved."""
    model = EfficientBertForSequenceClassification.from_pretrained(trained / "checkpoint-4")
    ids, mask = batch()
    with torch.no_grad():
        logits = model.eval()(ids, attention_mask=mask).logits
    assert torch.isfinite(logits).all() and logits.shape == (3, 2)


CLAIM_ON_EVERY_RANK = """
import sys, torch.distributed as dist
from transformers import HfArgumentParser
from hf_efficient import EfficientBertConfig
from hf_efficient.training import ConfigArguments, EfficientTrainingArguments, setup_run
parser = HfArgumentParser((ConfigArguments, EfficientTrainingArguments))
try:
    setup_run(parser, EfficientBertConfig, None, ["--output_dir", sys.argv[1], "--report_to", "none"])
except Exception as error:
    sys.stdout.write(f"rank {dist.get_rank()}: {type(error).__name__}\\n")  # one write (print makes two)
    sys.stdout.flush()
dist.destroy_process_group()
"""


@pytest.mark.distributed
def test_every_rank_of_a_distributed_run_stops_with_the_main_process_verdict(tmp_path):
    """Only rank 0 takes the lock and looks at the folder; its verdict is broadcast, so rank 1 raises the
    same error instead of waiting at the next barrier for a rank that has stopped."""
    EfficientBertForMaskedLM(tiny_config()).save_pretrained(tmp_path / "out")
    script = tmp_path / "claim.py"
    script.write_text(CLAIM_ON_EVERY_RANK)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    result = launch(
        [*torchrun, "--master_port", str(free_port()), str(script), str(tmp_path / "out")], timeout=180
    )
    # both ranks share one stdout pipe: read the verdicts without relying on whole lines
    assert sorted(re.findall(r"rank \d: \w+", result.stdout)) == [
        "rank 0: OutputDirNotEmptyError",
        "rank 1: OutputDirNotEmptyError",
    ]
