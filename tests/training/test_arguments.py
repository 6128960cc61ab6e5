"""The arguments the scripts share: hub options reach from_pretrained, phases, sample limits."""

from __future__ import annotations

import logging

import pytest
import torch
from datasets import Dataset
from transformers import TrainingArguments

from hf_efficient.training import ModelArguments, decide_phases, first_examples
from hf_efficient.training.run import check_device_flags


def test_model_arguments_give_from_pretrained_kwargs():
    args = ModelArguments(cache_dir="c", model_revision="v1", token="t", trust_remote_code=True)
    hub = {"cache_dir": "c", "revision": "v1", "token": "t", "trust_remote_code": True}
    assert args.hub_kwargs() == hub and args.model_kwargs() == {**hub, "ignore_mismatched_sizes": False}
    assert ModelArguments(torch_dtype="bfloat16").model_kwargs()["dtype"] is torch.bfloat16
    assert ModelArguments(torch_dtype="auto").model_kwargs()["dtype"] == "auto"


@pytest.mark.parametrize(
    ("given", "phases"),
    [
        ([], (True, True, False)),
        (["--do_eval"], (False, True, False)),
        (["--do_predict"], (False, False, True)),
    ],
)
def test_phases_run_as_given_or_train_and_evaluate_by_default(tmp_path, given, phases):
    flags = {flag.removeprefix("--"): True for flag in given}
    training_args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **flags)
    decide_phases(training_args, ["--output_dir", str(tmp_path), *given])
    assert (training_args.do_train, training_args.do_eval, training_args.do_predict) == phases


def test_first_examples():
    data = Dataset.from_dict({"x": list(range(5))})
    assert first_examples(data, 3, "max_train_samples")["x"] == [0, 1, 2]
    assert len(first_examples(data, 50, "max_train_samples")) == 5 and first_examples(None, 3, "x") is None
    with pytest.raises(ValueError, match="--max_eval_samples must be at least 1, got 0"):
        first_examples(data, 0, "max_eval_samples")


def test_flags_that_need_an_accelerator_are_refused_or_said_on_a_cpu(tmp_path, caplog, monkeypatch):
    """transformers trains an --fp16 run in float32 on a CPU without a word, and compiles a --torch_compile
    run for minutes before its first step."""
    monkeypatch.setattr("hf_efficient.training.run.has_accelerator", lambda: False)
    fp16 = TrainingArguments(output_dir=str(tmp_path), report_to=[], fp16=True)
    with pytest.raises(ValueError, match=r"^--fp16 computes in float16 on a GPU, and this machine has none"):
        check_device_flags(fp16)
    compiled = TrainingArguments(output_dir=str(tmp_path), report_to=[], torch_compile=True)
    with caplog.at_level(logging.INFO, logger="hf_efficient"):
        check_device_flags(compiled)
    said = [record.getMessage() for record in caplog.records if record.name.startswith("hf_efficient")]
    assert len(said) == 1 and said[0].startswith("--torch_compile on the CPU: the model compiles for minutes")
    monkeypatch.setattr("hf_efficient.training.run.has_accelerator", lambda: True)
    caplog.clear()
    check_device_flags(fp16)
    check_device_flags(compiled)
    assert not [record for record in caplog.records if record.name.startswith("hf_efficient")]
