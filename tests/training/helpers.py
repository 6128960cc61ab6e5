"""What the training tests share: a tiny labelled text dataset, the arguments of a run that saves every
step, and the output-folder locks a process holds open."""

from __future__ import annotations

import os
from pathlib import Path

from hf_efficient.training.output_dir import LOCK_FILE

from ..models.text.helpers import batch


def classification_examples(count: int = 8, n: int = 12) -> list[dict]:
    """``count`` examples of ``n`` random tokens (no padding) with alternating labels 0 / 1."""
    ids, mask = batch(b=count, n=n, lengths=(n,) * count)
    rows = enumerate(zip(ids, mask, strict=True))
    return [{"input_ids": i, "attention_mask": m, "labels": k % 2} for k, (i, m) in rows]


def every_step_arguments(output_dir, max_steps: int, **overrides):
    """EfficientTrainingArguments of a CPU run over batches of 2 that saves a checkpoint at every step, with
    no progress bar and no reporting."""
    from hf_efficient.training.run import EfficientTrainingArguments

    values = dict(save_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True, disable_tqdm=True)
    return EfficientTrainingArguments(
        output_dir=str(output_dir), max_steps=max_steps, **{**values, **overrides}
    )


def open_lock_files() -> list[str]:
    """The output-folder lock files this process holds open (its descriptors, as /proc lists them)."""
    targets = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:  # the descriptor listdir itself used, closed meanwhile
            continue
    return sorted(target for target in targets if LOCK_FILE in target)


def script_dataclasses(module) -> tuple:
    """The argument dataclasses of a language-model script (``pretrain_mlm``, ``pretrain_clm``), in the order
    its parser takes them."""
    from hf_efficient.data import TextCorpusArguments
    from hf_efficient.training import ConfigArguments, LanguageModelArguments

    data_arguments = getattr(module, "DataArguments", TextCorpusArguments)  # pretrain_clm: the corpus flags
    return (LanguageModelArguments, data_arguments, ConfigArguments, module.EfficientTrainingArguments)
