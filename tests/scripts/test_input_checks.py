"""Every script stops on an input that does not fit, where it enters, with one ``error:`` line naming what,
where and the fix, and exit status 2: a flag the machine cannot honour (here: one without a GPU), ... Nothing
trains on a broken input."""

from __future__ import annotations

import pytest
import torch

from .helpers import HF_TRAINING_SCRIPTS, REQUIRED, run_in_process

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
