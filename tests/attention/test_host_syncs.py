"""No host-device sync in a training step of any sequence type, checked on the CPU.

On a GPU every read of a tensor's values on the host (``.tolist()``, ``.item()``, ``nonzero``, ``bool(t)``,
a Python list copied to the device with ``torch.tensor(..., device=...)``) waits for the queued kernels: it
stalls the pipeline and breaks CUDA graphs. The device check counts them with
``torch.cuda.set_sync_debug_mode`` (benchmarks.gpu's "host syncs" column); this test finds the same reads on
a CPU with a TorchFunctionMode, while ``host_reads_are_cheap`` is patched to False so that every core takes
the branches it takes on an accelerator. An unpadded call (a padding mask's values are checked once at the
entry point, by design) with dropout off (its seed is drawn on the CPU's generator, no device read).
"""

from __future__ import annotations

import sys
import traceback

import pytest
import torch
from torch.overrides import TorchFunctionMode

from hf_efficient.attention import ATTENTION_REGISTRY, utils

from .contract import run
from .helpers import make_core, make_qkv, padding_mask

# torch functions that read values on the host, or copy host data to the tensors' device
READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere", "unique"}
READS |= {"masked_select", "cpu", "numpy"}
FROM_HOST = {"tensor", "as_tensor"}  # with a device argument: a host-to-device copy on a GPU

SEQUENCE_TYPES = sorted(
    name for name, cls in ATTENTION_REGISTRY.items() if not cls.capabilities.requires_edges
)
CASES = [(name, False) for name in SEQUENCE_TYPES] + [
    (name, True) for name in SEQUENCE_TYPES if ATTENTION_REGISTRY[name].capabilities.causal
]


class HostReads(TorchFunctionMode):
    """Records each host read made from hf_efficient's code as (function, file:line)."""

    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS or (name in FROM_HOST and kwargs.get("device") is not None):
            ours = [f for f in traceback.extract_stack()[:-1] if "/hf_efficient/" in f.filename]
            if ours:
                self.found.append(
                    (name, f"{ours[-1].filename.split('/hf_efficient/')[-1]}:{ours[-1].lineno}")
                )
        return func(*args, **kwargs)


@pytest.fixture
def accelerator_branches(monkeypatch):
    """Every module that imported ``host_reads_are_cheap`` sees False, as on a GPU."""
    original = utils.host_reads_are_cheap
    for module in list(sys.modules.values()):
        if getattr(module, "host_reads_are_cheap", None) is original:
            monkeypatch.setattr(module, "host_reads_are_cheap", lambda x: False)


@pytest.mark.parametrize(("attention_type", "causal"), CASES)
def test_a_training_step_reads_nothing_on_the_host(attention_type, causal, accelerator_branches):
    """Forward + backward at a length of several blocks / chunks / segments, in training mode."""
    core = make_core(attention_type, causal=causal, max_seq_len=512).train()
    q, k, v = make_qkv(b=2, n=300, requires_grad=True)
    reads = HostReads()
    with reads:
        out = run(core, q, q if core.capabilities.shared_query_key else k, v)
        out.output.square().sum().backward()
    assert not reads.found, f"{attention_type}: host reads (GPU syncs) at {sorted(set(reads.found))}"


def test_the_probe_sees_a_host_read(accelerator_branches):
    """The check can fail: a padded call, whose mask values the entry point checks on the host, is caught."""
    core = make_core("linear")
    q, k, v = make_qkv(b=2, n=37)
    reads = HostReads()
    with reads:
        run(core, q, k, v, padding_mask([37, 30], 37), [37, 30])
    assert reads.found and all(path.startswith("attention/") for _, path in reads.found)


# full: its sdpa call goes through transformers' attention integration, which synced once per step in the
# H100 reference run (benchmarks/results/reference/gpu_h100, "host syncs"), outside this package's code
CUDA_CASES = [case for case in CASES if case[0] != "full"]


@pytest.mark.gpu
@pytest.mark.parametrize(("attention_type", "causal"), CUDA_CASES)
def test_a_training_step_syncs_nothing_on_cuda(attention_type, causal):
    """The same step on a GPU under ``torch.cuda.set_sync_debug_mode("error")``: any sync raises, those of
    the CUDA-only paths (FlexAttention, the parallel kernelised engine) included. Head size 64 (flex needs
    16 or more)."""
    core = make_core(attention_type, causal=causal, head_dim=64, max_seq_len=512).train().cuda()
    q, k, v = (t.cuda().requires_grad_() for t in make_qkv(b=2, n=300, d=64))
    run(core, q, k, v).output.sum().backward()  # first call: compiles, builds and caches masks / layouts
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(core, q, k, v).output.square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
