"""Registry-wide contract tests: every registered attention type is checked the moment it registers.

The checks themselves are plain functions of a type name in tests/attention/contract.py; these tests run them
over ``list_attention_types()`` (read at collection time).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hf_efficient
from hf_efficient.attention import AttentionInputs, AttentionSpec, build_attention, get_attention_class

from . import contract
from .helpers import make_core, make_qkv, reference_attention

ALL_TYPES = hf_efficient.list_attention_types()
EQUIVARIANT_TYPES = [t for t in ALL_TYPES if get_attention_class(t).capabilities.permutation_equivariant]


def test_registry_lists_types():
    assert "full" in ALL_TYPES
    assert ALL_TYPES == sorted(ALL_TYPES)
    assert set(hf_efficient.list_attention_types("text")) <= set(ALL_TYPES)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_shapes_finite_forward_backward(attention_type):
    contract.check_shapes_finite_forward_backward(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
@pytest.mark.parametrize("n", contract.STRIDED_LENGTHS)
def test_strided_inputs_same_outputs_and_gradients(attention_type, n):
    contract.check_strided_inputs_same_outputs_and_gradients(attention_type, n)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
@pytest.mark.parametrize("n_real", contract.PADDED_LENGTHS)
def test_padding_invariance_with_poisoned_pads(attention_type, n_real):
    contract.check_padding_invariance_with_poisoned_pads(attention_type, n_real)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_batch_independence(attention_type):
    contract.check_batch_independence(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
@pytest.mark.parametrize("lengths", contract.PACKED_LENGTHS, ids=["short", "long"])
def test_packed_equals_each_sequence_alone(attention_type, lengths):
    contract.check_packed_equals_each_sequence_alone(attention_type, lengths)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_eval_is_deterministic(attention_type):
    contract.check_eval_is_deterministic(attention_type)


@pytest.mark.parametrize("attention_type", EQUIVARIANT_TYPES)
def test_permutation_equivariance(attention_type):
    contract.check_permutation_equivariance(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_save_load_identical_outputs(attention_type, tmp_path):
    contract.check_save_load_identical_outputs(attention_type, tmp_path)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_unsupported_inputs_raise(attention_type):
    contract.check_unsupported_inputs_raise(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_causal_decoding_matches_parallel(attention_type):
    contract.check_causal_decoding_matches_parallel(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_relative_positions_exact_in_the_limit_or_refused(attention_type):
    contract.check_relative_positions(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_rotary_positions_carried_or_refused(attention_type):
    contract.check_rotary_positions_carried_or_refused(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_unknown_config_key_lists_valid_keys(attention_type):
    contract.check_unknown_config_key_lists_valid_keys(attention_type)


def test_unknown_attention_type_lists_registered():
    with pytest.raises(ValueError, match="Registered types: .*full"):
        build_attention("flash_magic", AttentionSpec(2, 8))


def test_shared_query_key_enforced():
    assert any(get_attention_class(t).capabilities.shared_query_key for t in ALL_TYPES)  # reformer_lsh
    for attention_type in ALL_TYPES:
        contract.check_shared_query_key_enforced(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_no_weight_decay_names_own_parameters(attention_type):
    contract.check_no_weight_decay_names_own_parameters(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_facts_for_the_table_and_the_benchmarks(attention_type):
    contract.check_facts(attention_type)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_traced_form_matches_eager(attention_type):
    contract.check_traced_form_matches_eager(attention_type)


@pytest.mark.slow
@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_compiles_fullgraph(attention_type):
    contract.check_compiles_fullgraph(attention_type)


@pytest.mark.gpu
@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_same_outputs_and_gradients_on_cuda(attention_type):
    contract.check_same_outputs_and_gradients_on(attention_type, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_packed_equals_each_sequence_alone_on_cuda(attention_type):
    for lengths in contract.PACKED_LENGTHS:  # one padded call, and one call per sequence
        contract.check_packed_equals_each_sequence_alone(attention_type, lengths, "cuda")


def test_inputs_as_object_or_keywords_and_clear_errors():
    core = make_core("full")
    q, k, v = make_qkv(b=2, n=10)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 7:] = False
    by_object = core(q, k, v, AttentionInputs(attention_mask=mask, is_causal=True)).output
    torch.testing.assert_close(core(q, k, v, attention_mask=mask, is_causal=True).output, by_object)
    with pytest.raises(TypeError, match="attention_mask=mask"):
        core(q, k, v, mask)  # the v1 positional padding mask
    with pytest.raises(TypeError, match="unknown attention input.*padding_mask.*valid: attention_mask"):
        core(q, k, v, padding_mask=mask)
    with pytest.raises(TypeError, match="not both"):
        core(q, k, v, AttentionInputs(), attention_mask=mask)


def test_prepare_checks_once_and_replace_keeps_what_needs_no_check():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    inputs = AttentionInputs(attention_mask=mask).prepare(2, 3)
    assert inputs.prepared_for == (2, 3) and inputs.attention_mask.dtype == torch.bool
    assert inputs.prepare(2, 3) is inputs  # no second check for the same shape
    assert inputs.replace(edges=None, output_attentions=True).prepared_for == (2, 3)
    assert inputs.replace(attention_mask=torch.ones(2, 3)).prepared_for is None  # a new tensor: check again
    assert AttentionInputs(attention_mask=torch.ones(2, 3)).prepare(2, 3).attention_mask is None  # unpadded


@pytest.mark.parametrize("page", ["README.md", "docs/attention.md"])
def test_docs_attention_table_is_the_registry_table(page):
    """The attention table of the README and docs/attention.md is generated (python -m hf_efficient.attention
    --update README.md docs/attention.md): it lists exactly the registered types with each core's facts."""
    from hf_efficient.attention.__main__ import with_table

    text = (Path(__file__).parents[2] / page).read_text(encoding="utf-8")
    assert with_table(text, hf_efficient.attention_table()) == text
    for name in ALL_TYPES:
        cls = get_attention_class(name)
        assert cls.paper and cls.cost and cls.summary, f"{name} lacks a fact the table shows"
        assert f"| `{name}` | {cls.paper} | {cls.cost} |" in text


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_a_covered_length_is_exact_attention(attention_type, causal):
    """A core that declares ``covered_length()`` computes exact softmax attention on inputs of that length
    (what the scripts tell a run whose inputs are all that short); one declaring none is not checked."""
    cls = get_attention_class(attention_type)
    if causal and not cls.capabilities.causal or "text" not in cls.capabilities.modalities:
        pytest.skip(f"{attention_type} has no {'causal' if causal else 'text'} form")
    core = make_core(attention_type, causal=causal)
    n = core.covered_length()
    if n is None:
        return
    q, k, v = make_qkv(n=n)
    expected = reference_attention(q, k, v, causal=causal).float()
    torch.testing.assert_close(core(q, k, v, is_causal=causal).output, expected, atol=1e-5, rtol=1e-5)


def test_covered_lengths_of_windows_and_blocks():
    """Longformer covers w/2 + 1 tokens (w + 1 causal, none dilated), one token more is no longer exact;
    BigBird covers its global blocks."""
    assert make_core("longformer", attention_window=512).covered_length() == 257
    assert make_core("longformer", causal=True, attention_window=8).covered_length() == 9
    assert make_core("longformer", attention_window=8, attention_dilation=2).covered_length() is None
    assert make_core("bigbird", block_size=16).covered_length() == 32
    assert make_core("full").covered_length() is None and make_core("performer").covered_length() is None
    core = make_core("longformer", attention_window=8, global_token_indices=[])
    q, k, v = make_qkv(n=6)
    assert not torch.allclose(core(q, k, v).output, reference_attention(q, k, v).float(), atol=1e-3)
