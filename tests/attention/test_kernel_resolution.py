"""A core's kernels are resolved once per device and configuration (``resolve_kernels``): what
``implementation`` allows there, checked against the kernels the core declares; a call only asks the
kernels what the call itself decides. Models resolve every core at load, after ``.to()`` and when their
config changes."""

import pytest
import torch

from hf_efficient import EfficientBertForCausalLM
from hf_efficient.attention import AttentionInputs
from hf_efficient.attention.kernels import fla, kernelized, kernelized_parallel

from ..models.text.helpers import tiny_causal_config
from .helpers import make_core, make_qkv


def test_auto_resolves_the_kernels_declared_for_the_device():
    core = make_core("linear")
    assert core.resolve_kernels("cpu") == (kernelized.CHUNKED,)  # the parallel engine: CUDA only
    # fla (the gpu extra) last: "auto" reaches it only where the package's own kernels cannot serve
    on_cuda = (kernelized_parallel.PARALLEL, kernelized.CHUNKED, fla.KERNELIZED_FLA)
    assert core.resolve_kernels(torch.device("cuda", 0)) == on_cuda
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


def test_attn_implementation_is_the_one_knob_for_kernels_and_exact_softmax():
    config = tiny_causal_config(
        "linear",
        layer_attention_types=["linear", "full"],
        attention_config={"implementation": "reference", "block_size": 4},
    )
    model = EfficientBertForCausalLM(config).eval()
    linear, full = model.attention_cores()
    ids = torch.randint(5, 99, (1, 12), generator=torch.Generator().manual_seed(0))
    expected = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert (linear.config.implementation, full.config.implementation) == ("reference", "auto")  # as saved
    model.set_attn_implementation("parallel")  # a kernel of linear's: full keeps its own choice
    assert (linear.config.implementation, full.config.implementation) == ("parallel", "auto")
    q = torch.randn(1, 2, 5, 8)
    assert linear.kernel_for(q, AttentionInputs(), carried=True) is kernelized_parallel.PARALLEL
    assert model.attention_inputs(1, 5).attn_implementation is None  # exact softmax: sdpa, the default
    torch.testing.assert_close(model.generate(ids, max_new_tokens=4, do_sample=False), expected)
    model.set_attn_implementation("reference")  # every core
    assert (linear.config.implementation, full.config.implementation) == ("reference", "reference")
    model.set_attn_implementation("eager")  # transformers' function for full; the saved choices again
    assert (linear.config.implementation, full.config.implementation) == ("reference", "auto")
    assert model.attention_inputs(1, 5).attn_implementation == "eager"
    choices = "kernel choices: auto, chunked, fla, flex, hf, parallel, reference\\."  # of linear and full
    with pytest.raises(ValueError, match=f"'native' is neither .* {choices}"):
        model.set_attn_implementation("native")  # longformer's or bigbird's, none of this model's
    assert model.config._attn_implementation == "eager"  # refused before anything changed


def test_from_pretrained_takes_a_kernel_choice_and_keeps_the_saved_one_otherwise(tmp_path):
    EfficientBertForCausalLM(tiny_causal_config("linear")).save_pretrained(tmp_path)
    loaded = EfficientBertForCausalLM.from_pretrained(tmp_path, attn_implementation="chunked")
    assert {core.config.implementation for core in loaded.attention_cores()} == {"chunked"}
    assert all(core._resolved[1] == (kernelized.CHUNKED,) for core in loaded.attention_cores())
    loaded = EfficientBertForCausalLM.from_pretrained(tmp_path)
    assert {core.config.implementation for core in loaded.attention_cores()} == {"auto"}
