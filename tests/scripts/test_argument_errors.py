"""The scripts, given what an adversarial user gives them, stop with an error naming the flag, the value and
the fix before any training starts; and no fault loses saved work: a run killed with ``kill -9`` while it
writes a checkpoint resumes from the last complete one and continues the same loss curve, and a second run
cannot write into the folder of a first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM
from hf_efficient.data.packaged_bert import packaged_tokenizer
from hf_efficient.training import OutputDirNotEmptyError
from hf_efficient.training.checkpoints import COMPLETE_MARKER, checkpoint_problem

from ..data.helpers import write_csv
from ..models.text.helpers import TINY_BERT
from ..processes import ROOT, child_env
from ..script_loader import CONFIGS, QUIET
from .helpers import COMMON, logged_losses, pretrain_args


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A tiny BERT checkpoint with all-MiniLM-L6-v2's WordPiece tokenizer (the real text of the tests is
    English): what --model_name_or_path reads."""
    folder = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = packaged_tokenizer()
    tokenizer.save_pretrained(folder)
    sizes = {**TINY_BERT, "vocab_size": len(tokenizer), "num_attention_heads": 2}
    EfficientBertForMaskedLM(EfficientBertConfig(**sizes)).save_pretrained(folder)
    return folder


def finetune_args(tiny_checkpoint, data, output_dir, *extra) -> list[str]:
    return [
        *("--model_name_or_path", str(tiny_checkpoint), "--train_file", data["train"]),
        *("--output_dir", str(output_dir), "--max_steps", "1", "--max_seq_length", "32"),
        *("--save_strategy", "no", *COMMON, *extra),
    ]


def test_finetune_flags(finetune_glue, tiny_checkpoint, data, tmp_path):
    def fails(error, message, *extra, **replace):
        args = finetune_args(tiny_checkpoint, data, tmp_path / "out", *extra)
        for flag, value in replace.items():
            args[args.index(f"--{flag}") + 1] = value
        with pytest.raises(error, match=message):
            finetune_glue.main(args)

    fails(
        FileNotFoundError,
        r"--train_file .*missing.csv: no such file",
        train_file=str(tmp_path / "missing.csv"),
    )
    (tmp_path / "empty.csv").write_text("")
    fails(
        ValueError, r"--train_file .*empty.csv is empty \(0 bytes\)", train_file=str(tmp_path / "empty.csv")
    )
    header = write_csv(tmp_path / "header.csv", ["sentence", "label"], [])
    fails(ValueError, r"--train_file .*header.csv holds no rows \(a header only\?\)", train_file=header)
    no_label = write_csv(tmp_path / "no_label.csv", ["sentence", "target"], [["a film", 1]])
    message = r"no column\(s\) \['label'\]; its columns are \['sentence', 'target'\]: .* --label_column_name"
    fails(ValueError, message, train_file=no_label)
    fails(
        FileNotFoundError,
        r"--model_name_or_path: no such folder '/no/such/model'",
        model_name_or_path="/no/such/model",
    )
    fails(
        ValueError,
        r"--attention_config '\{window: 4\}' is not valid JSON .*'\{\"attention_window\": 64\}'",
        "--attention_type",
        "longformer",
        "--attention_config",
        "{window: 4}",
    )
    fails(
        ValueError,
        r"--attention_config must be a JSON object of hyperparameters .*got list: \[4\]",
        "--attention_type",
        "longformer",
        "--attention_config",
        "[4]",
    )
    fails(
        ValueError,
        r"Unknown attention_config key\(s\) \['window'\] for attention_type='longformer'",
        "--attention_type",
        "longformer",
        "--attention_config",
        '{"window": 4}',
    )
    fails(FileNotFoundError, r"--config .*none.json: no such file", "--config", str(tmp_path / "none.json"))
    (tmp_path / "broken.json").write_text('{"model": {"hidden_size": 32,}}')
    fails(
        ValueError,
        r"broken.json is not valid JSON: .* at line 1, column 30",
        "--config",
        str(tmp_path / "broken.json"),
    )
    fails(
        ValueError,
        r"(?s)--config_overrides.* set a field of the bert model config \(.*tiny_bert.*'s\) wrongly: .*"
        r"'num_hidden_layers' expected int, got str \(value: 'two'\)",
        "--config_overrides",
        "num_hidden_layers=two",
    )
    fails(ValueError, r"No valid checkpoint found in output directory", "--resume_from_checkpoint", "last")
    fails(
        ValueError,
        r"--max_train_samples must be at least 1, got 0; leave it out to use every example",
        "--max_train_samples",
        "0",
    )


def test_pretrain_and_vision_flags(pretrain_mlm, finetune_image_classification, pretrain_mae, data, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    for corpus, error, message in [
        (tmp_path / "empty.txt", ValueError, r"--train_files .*empty.txt is empty \(0 bytes\)"),
        (tmp_path / "none.txt", FileNotFoundError, r"--train_files .*none.txt: no such file"),
    ]:
        args = pretrain_args({"corpus": str(corpus)}, tmp_path / "mlm", "full", {})
        with pytest.raises(error, match=message):
            pretrain_mlm.main(args)
    vision = ["--config", str(CONFIGS / "vision" / "base_tiny.json"), "--max_steps", "1", *QUIET]
    with pytest.raises(FileNotFoundError, match=r"--train_dir .*no_images: no such folder"):
        finetune_image_classification.main(
            [*vision, "--train_dir", str(tmp_path / "no_images"), "--output_dir", str(tmp_path / "a")]
        )
    mae = [*vision, "--dataset_name", "digits", "--output_dir", str(tmp_path / "mae")]
    mae += ["--config_overrides", "image_size=8,patch_size=4,mask_ratio=0.8,num_channels=1"]
    with pytest.raises(
        ValueError, match=r"mask_ratio=0.8 keeps int\(4 \* \(1 - 0.8\)\) = 0 of 4 patches.*<= 1 - 1/4"
    ):
        pretrain_mae.main(mae)


def test_an_earlier_runs_model_is_kept_unless_asked(finetune_glue, tiny_checkpoint, data, tmp_path):
    """A second run on a folder that holds a trained model is refused before it touches anything; with
    --overwrite_output_dir it replaces it; --resume_from_checkpoint continues it."""
    args = finetune_args(tiny_checkpoint, data, tmp_path)
    finetune_glue.main(args)
    weights = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(
        OutputDirNotEmptyError,
        match=rf"--output_dir {tmp_path} already holds a saved model .*--overwrite_output_dir",
    ):
        finetune_glue.main([*args, "--learning_rate", "0.1"])
    assert (tmp_path / "model.safetensors").read_bytes() == weights  # untouched
    finetune_glue.main([*args, "--learning_rate", "0.1", "--overwrite_output_dir"])
    assert (tmp_path / "model.safetensors").read_bytes() != weights


# ---------------------------------------------------------------------------------------------------------
# kill -9 in the middle of a checkpoint
# ---------------------------------------------------------------------------------------------------------

# A real pretrain_mlm.py run whose trainer stops inside checkpoint-6, after its weights are written and before
# its optimizer, scheduler, RNG states and trainer state: the test kills it there (deterministically, at a
# known point of the save), as the out-of-memory killer or a pre-empted node would.
PAUSE_IN_CHECKPOINT = """
import sys, time
from pathlib import Path
from hf_efficient.training import language_modeling
from tests.script_loader import load_script

script = load_script("pretrain_mlm")
signal_file, step = Path(sys.argv[1]), int(sys.argv[2])


class PausingTrainer(language_modeling.EfficientTrainer):  # the trainer the pretraining scripts share
    def _save_optimizer_and_scheduler(self, output_dir):
        if self.state.global_step == step:
            signal_file.write_text(output_dir)
            time.sleep(600)
        super()._save_optimizer_and_scheduler(output_dir)


language_modeling.EfficientTrainer = PausingTrainer
script.main(sys.argv[3:])
"""


def _kill_while_saving(args, step, signal_file, timeout=300):
    """Run pretrain_mlm.py with ``args`` in a new process; SIGKILL it while it writes checkpoint-``step``."""
    command = [sys.executable, "-c", textwrap.dedent(PAUSE_IN_CHECKPOINT), str(signal_file), str(step), *args]
    process = subprocess.Popen(
        command, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + timeout
    while not signal_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the run never reached checkpoint-{step}:\n{process.stdout.read().decode()[-3000:]}")
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


@pytest.mark.slow
def test_kill_9_while_writing_a_checkpoint_loses_nothing_and_resumes_the_same_loss_curve(
    pretrain_mlm, data, tmp_path
):
    """Killed inside checkpoint-6 with save_total_limit=1: checkpoint-3 (the last complete one) survives, the
    torn checkpoint-6 is never picked, and `--resume_from_checkpoint last` continues the loss curve of an
    uninterrupted run exactly (Performer features redrawn every 2 steps: the random state continues too)."""
    extra = (
        "--max_steps",
        "9",
        "--save_steps",
        "3",
        "--save_total_limit",
        "1",
        "--random_state_redraw_steps",
        "2",
    )
    features = {"num_features": 16}
    pretrain_mlm.main(pretrain_args(data, tmp_path / "whole", "performer", features, *extra))
    args = pretrain_args(
        data, tmp_path / "killed", "performer", features, *extra, "--tokenizer_name", str(tmp_path / "whole")
    )

    _kill_while_saving(args, 6, tmp_path / "paused")
    killed = tmp_path / "killed"
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert (killed / "checkpoint-6" / "model.safetensors").exists() and not (
        killed / "checkpoint-6" / COMPLETE_MARKER
    ).exists()
    assert (
        checkpoint_problem(killed / "checkpoint-6")
        == "it has no trainer_state.json: the save was interrupted"
    )
    assert checkpoint_problem(killed / "checkpoint-3") is None  # rotation never ran: the saved work is there

    pretrain_mlm.main([*args, "--resume_from_checkpoint", "last"])  # the killed run's lock died with it
    whole, resumed = logged_losses(tmp_path / "whole"), logged_losses(killed)
    assert sorted(resumed) == list(range(1, 10))
    assert resumed == pytest.approx(whole, rel=1e-6, abs=1e-6)
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == ["checkpoint-9"]
    assert json.loads((killed / "checkpoint-9" / COMPLETE_MARKER).read_text())["global_step"] == 9
    EfficientBertForMaskedLM.from_pretrained(killed)  # the final model loads
