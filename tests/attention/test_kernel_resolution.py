"""A core's kernels are resolved once per device and configuration (``resolve_kernels``): what
``implementation`` allows there, checked against the kernels the core declares; a call only asks the
kernels what the call itself decides. Models resolve every core at load, after ``.to()`` and when their
config changes."""

import pytest
import torch

from hf_efficient import EfficientBertForCausalLM
from hf_efficient.attention.kernels import kernelized, kernelized_parallel

from ..models.text.helpers import tiny_causal_config
from .helpers import make_core, make_qkv


def test_auto_resolves_the_kernels_declared_for_the_device():
    core = make_core("linear")
    assert core.resolve_kernels("cpu") == (kernelized.CHUNKED,)  # the parallel engine: CUDA only
    assert core.resolve_kernels(torch.device("cuda", 0)) == (kernelized_parallel.PARALLEL, kernelized.CHUNKED)
    assert make_core("linear", implementation="parallel").resolve_kernels("cpu") == (
        kernelized_parallel.PARALLEL,
    )
    assert make_core("linear", implementation="reference").resolve_kernels("cpu") == ()


def test_resolved_once_per_device_and_again_when_the_configuration_changes():
    core = make_core("linear")
    first = core.resolve_kernels("cpu")
    assert core.resolve_kernels("cpu") is first  # kept, not filtered again
    q, k, v = make_qkv(n=6)
    core(q, k, v)
    assert core.resolve_kernels("cpu") is first
    core.config.implementation = "reference"
    assert core.resolve_kernels("cpu") == ()
    core.config.implementation = "not_a_kernel"  # checked against the declared kernels when resolved
    with pytest.raises(ValueError, match="implementation must be one of 'auto', 'reference', 'parallel'"):
        core(q, k, v)


def test_models_resolve_at_load_after_to_and_when_the_config_changes(tmp_path):
    model = EfficientBertForCausalLM(tiny_causal_config("linear")).eval()
    cores = model.attention_cores()
    assert all(core._resolved[0][0] == "cpu" for core in cores)  # at construction (post_init)
    for core in cores:
        core._resolved = None
    model.to(torch.float64)  # every _apply resolves again (.to("cuda") too)
    assert all(core._resolved[0][0] == "cpu" for core in cores)
    model.to("meta")
    assert all(core._resolved[0][0] == "meta" for core in cores)
    model.to_empty(device="cpu")
    assert all(core._resolved[0][0] == "cpu" for core in cores)
    for core in cores:
        core._resolved = None
    model.set_attn_implementation("eager")
    assert all(core._resolved[0][0] == "cpu" for core in cores)
    model = EfficientBertForCausalLM(
        tiny_causal_config("linear", attention_config={"implementation": "reference"})
    )
    model.save_pretrained(tmp_path)
    loaded = EfficientBertForCausalLM.from_pretrained(tmp_path)
    assert all(core._resolved is not None and core._resolved[1] == () for core in loaded.attention_cores())
