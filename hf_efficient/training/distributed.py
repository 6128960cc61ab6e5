"""Multi-process training on machines without an accelerator.

``accelerate launch --multi_gpu --num_processes 2 ...`` starts two processes on a CPU-only machine too
(``--cpu --num_processes 2`` silently starts one), but ``TrainingArguments`` then builds a non-CPU
``PartialState``, which reports ``distributed_type == NO``: each process trains alone on all the data and
writes the same files. Setting ``ACCELERATE_USE_CPU`` before ``TrainingArguments`` is built makes them one
gloo DDP group.
"""

from __future__ import annotations

import os

import torch


def has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def enable_cpu_ddp_if_launched() -> bool:
    """Under a multi-process launch with no accelerator, make ``Trainer`` use CPU DDP (gloo).

    Call before ``TrainingArguments`` is created. Returns whether it changed anything.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not has_accelerator():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
        return True
    return False


def end_distributed_run() -> None:
    """Wait for every process, then destroy the process group, before the interpreter exits.

    A process that exits with a gloo group alive leaves gloo's worker threads to be destroyed during
    interpreter shutdown, where they can call ``std::terminate`` ("terminate called without an active
    exception", SIGABRT): a two-process fine-tuning run failed that way after both ranks had finished
    (pytorch/pytorch#190489). :func:`hf_efficient.cli.run_script` calls it after a script's ``main``; a
    no-op in a single process.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # rank 0 may still be writing the model card
        torch.distributed.destroy_process_group()
