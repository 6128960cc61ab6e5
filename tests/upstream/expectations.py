"""Every transformers common test that is skipped, expected to fail or left to `make test`, with its reason.

The one place that decides it (tests/upstream/common.py applies it to every family's test classes): an entry
names the test (a shell pattern, ``*`` and ``[...]``: the mixin's parametrized cases), the groups it applies
to (a family: ``bert``, ``roberta``, ``xlm-roberta``, ``vision`` (ViT), ``mae``, ``deit``, ``dinov2``; or a
modality: ``text``, ``vision``) and attention types, and why. ``skip``: the test does not apply (it needs
the Hub, a GPU, or checks something our models by design do not have); ``xfail``: a known difference, run
strictly so that a fix shows up as a failure here; ``slow``: it runs in `make test` (CI) but not in the edit
loop (`make test-fast`), as a second layer of a check the fast loop keeps (the other attention types than
``full``, and the vision families, are slow as a whole: tests/upstream/common.py).

The mixin also skips tests by its own conditions, with its own reasons (``pytest -rs`` lists them): a GPU,
several accelerators, MPS, Flash Attention, DeepSpeed or the kernels library; ``RUN_SLOW``; features our
models do not have (RoPE, mixture of experts, a tensor-parallel plan, composite sub-configs, a cache in an
encoder's forward, ``_keep_in_fp32_modules``, weight conversions). The sdist ships no generate() or export
tests (``GenerationTesterMixin`` / ``ExportTesterMixin`` are stand-ins: see tests/upstream/sdist.py).
"""

from __future__ import annotations

import fnmatch
import functools
import unittest
from dataclasses import dataclass

import pytest

from hf_efficient.attention.registry import get_attention_class, list_attention_types

ALL = None  # every group / every attention type
# The groups of text families (tests/upstream/test_<family>.py; "text" names every family that
# tests/upstream/common.py builds with modality="text"): what the fast loop leaves to `make test` applies
# to each.
TEXT_GROUPS = ("text", "bert", "roberta", "xlm-roberta", "electra", "distilbert", "modernbert")


@dataclass(frozen=True)
class Expectation:
    test: str
    kind: str  # "skip", "xfail" or "slow"
    reason: str
    groups: tuple[str, ...] | None = ALL
    types: tuple[str, ...] | None = ALL

    def applies(self, group: str, attention_type: str, modality: str | None = None) -> bool:
        """Whether the entry covers this family (by its group, or its modality when given) and type."""
        named = (
            self.groups is ALL or group in self.groups or (modality is not None and modality in self.groups)
        )
        return named and (self.types is ALL or attention_type in self.types)


# Types whose core cannot return attention weights (linear, longformer, bigbird among those tested).
WITHOUT_WEIGHTS = tuple(
    name for name in list_attention_types() if not get_attention_class(name).capabilities.output_attentions
)
NO_WEIGHTS = (
    "attention weights: this type never forms the (n, n) attention matrix, so it cannot return it "
    "(capabilities.output_attentions=False; output_attentions=True raises saying so)"
)

TEXT_TYPES = list_attention_types("text")
WITHOUT_RELATIVE = tuple(t for t in TEXT_TYPES if not get_attention_class(t).capabilities.relative_positions)
NO_RELATIVE = (
    "BERT's relative positions (position_embedding_type relative_key / relative_key_query): this type's core "
    "never adds per-pair scores (capabilities.relative_positions=False), so the config refuses them, naming "
    "why and the types that can (hf_efficient.relative_position_types(): full, longformer)"
)
WITHOUT_CAUSAL = tuple(t for t in TEXT_TYPES if not get_attention_class(t).capabilities.causal)
NO_CAUSAL = (
    "a decoder (is_decoder=True, BERT's BertLMHeadModel): this type has no causal form "
    "(capabilities.causal=False), so the config refuses it, listing the causal types"
)

EXPECTATIONS: tuple[Expectation, ...] = (
    *(
        Expectation(test, "xfail", NO_RELATIVE, groups=("text",), types=WITHOUT_RELATIVE)
        for test in (
            "test_model_various_embeddings",
            "test_decoder_model_past_with_large_inputs_relative_pos_emb",
        )
    ),
    *(
        Expectation(test, "xfail", NO_CAUSAL, groups=("text",), types=WITHOUT_CAUSAL)
        for test in (
            "test_model_as_decoder",
            "test_model_as_decoder_with_default_input_mask",
            "test_for_causal_lm",
            "test_decoder_model_past_with_large_inputs",
        )
    ),
    Expectation("test_for_causal_lm_decoder", "xfail", NO_CAUSAL, groups=("bert",), types=WITHOUT_CAUSAL),
    *(
        Expectation(test, "skip", NO_WEIGHTS + why, types=WITHOUT_WEIGHTS)
        for test, why in (
            ("test_attention_outputs", ""),
            ("test_eager_matches_sdpa_inference_24_fp32_pad_left_output_attentions", ""),
            ("test_model_outputs_equivalence", "; the test asks for them in every call"),
            ("test_retain_grad_hidden_states_attentions", "; the test asks for them in every call"),
        )
    ),
    Expectation(
        "test_sdpa_can_dispatch_non_composite_models",
        "xfail",
        "harness clash: the test reads config._attn_implementation from every module whose class name ends "
        "in 'Attention' and has a .config; our cores' (FullAttention, LinearAttention...) .config is the "
        "mechanism's hyperparameters (an AttentionConfig), not a PreTrainedConfig. The kernel switch itself "
        "passes test_can_set_attention_dynamically and test_eager_matches_sdpa_inference_*.",
    ),
    Expectation(
        "test_model_get_set_embeddings",
        "skip",
        "written for token embeddings (an nn.Embedding in, set_input_embeddings); a ViT's input embedding is "
        "its patch projection (transformers' ViT tests replace this test too)",
        groups=("vision", "mae"),
    ),
    Expectation(
        "test_resize_tokens_embeddings",
        "skip",
        "no token vocabulary in a vision model (transformers' ViT tester sets test_resize_embeddings=False)",
        groups=("vision", "mae"),
    ),
    Expectation(
        "test_eager_matches_sdpa_inference_*",
        "skip",
        "compares the model with itself for this type: attn_implementation picks among transformers' softmax "
        "functions, which only `full` cores call (hf_efficient/attention/kernels/full.py), so eager and sdpa "
        "run the same kernels here; its 25 cases run for full",
        types=("linear", "longformer", "bigbird"),
    ),
    Expectation(
        "test_bc_torch_dtype",
        "skip",
        "time (the module's heaviest test, 28 from_pretrained calls per class): it checks the deprecated "
        "torch_dtype alias of from_pretrained, code no attention type touches; it runs for full",
        groups=("bert", "vision"),
        types=("linear", "longformer", "bigbird"),
    ),
    Expectation(
        "test_bc_torch_dtype",
        "skip",
        "time (12 s per class): the deprecated torch_dtype alias goes through the from_pretrained every "
        "family shares (EfficientPreTrainedModel); BERT's and ViT's full classes run it",
        groups=("roberta", "xlm-roberta", "electra", "distilbert", "modernbert", "mae", "deit", "dinov2"),
    ),
    Expectation(
        "test_eager_matches_sdpa_inference_*",
        "skip",
        "time (10-25 s per class, 90 s over these six): attn_implementation reaches the attention only "
        "through code every family shares (the full core's kernels, hf_efficient/attention/kernels/full.py; "
        "modeling/blocks.py's CoreAttention, which DistilBERT's attention subclasses under its own names; "
        "the text and vision encoders' masks), so these families' cases repeat BERT's and ViT's; BERT's, "
        "ViT's, ViT-MAE's and ModernBERT's (its window layers) full classes run its 25 cases",
        groups=("roberta", "xlm-roberta", "electra", "distilbert", "deit", "dinov2"),
        types=("full",),
    ),
    Expectation(
        "test_resize_position_vector_embeddings",
        "xfail",
        "its second half shrinks the position table (max_position_embeddings - 5), which transformers' "
        "DistilBERT allows and hf_efficient refuses: resize_position_embeddings serves longer inputs only (a "
        "shorter table would drop trained positions; a ValueError names the current length). Extending, the "
        "first half, passes here and is checked row by row in tests/models/text/test_distilbert.py",
        groups=("distilbert",),
    ),
    # --- left to `make test`: the fast loop runs the mixin on text x `full` without these
    Expectation(
        "test_bc_torch_dtype",
        "slow",
        "time (the heaviest common test, 28 from_pretrained calls per class: a fifth of the fast loop's "
        "common tests): it compares the deprecated torch_dtype alias with dtype=, which our from_pretrained "
        "(hf_efficient/modeling/pretrained.py) passes on to transformers' untouched; the fast loop keeps "
        "the other loading tests (test_save_load, test_from_pretrained_no_checkpoint, ...)",
        groups=TEXT_GROUPS,
        types=("full",),
    ),
    Expectation(
        "test_eager_matches_sdpa_inference_*_[bf][fp]16_*",
        "slow",
        "time (two thirds of the eager-vs-sdpa cases' time): the half-precision cases run the same dispatch "
        "to transformers' softmax functions as the float32 ones the fast loop keeps on text; what differs "
        "is transformers' kernels' half-precision arithmetic, which no code of ours touches",
        groups=TEXT_GROUPS,
        types=("full",),
    ),
    Expectation(
        "test_eager_matches_sdpa_inference_*_sdpa_kernels",
        "slow",
        "time: the same cases as the float32 ones the fast loop keeps, with torch's choice of SDPA backends "
        "narrowed (torch.nn.attention.sdpa_kernel), which no code of ours touches",
        groups=TEXT_GROUPS,
        types=("full",),
    ),
)


# The vision families' testers (tests/upstream/test_deit.py, test_dinov2.py) run on full, linear and
# swin_window; what applies to swin_window there.
VISION_FAMILY_GROUPS = ("deit", "dinov2")
EXPECTATIONS += (
    Expectation(
        "test_eager_matches_sdpa_inference_*",
        "skip",
        "compares the model with itself for this type: attn_implementation picks among transformers' softmax "
        "functions, which only `full` cores call, so eager and sdpa run the same window kernels here; its 25 "
        "cases run for full",
        groups=VISION_FAMILY_GROUPS,
        types=("swin_window",),
    ),
    Expectation(
        "test_bc_torch_dtype",
        "skip",
        "time (28 from_pretrained calls per class): it checks the deprecated torch_dtype alias of "
        "from_pretrained, code no attention type touches; it runs for full",
        groups=VISION_FAMILY_GROUPS,
        types=("swin_window",),
    ),
    Expectation(
        "test_retain_grad_hidden_states_attentions",
        "xfail",
        "swin_window computes softmax within each window; the (n, n) weights it returns are those window "
        "probabilities scattered into a dense matrix beside the computation (hf_efficient/attention/"
        "window_2d.py, dense_weights), so the outputs do not depend on that tensor and it gets no gradient. "
        "The weights' values are tested (test_attention_outputs passes; tests/attention/test_window_2d.py)",
        groups=VISION_FAMILY_GROUPS,
        types=("swin_window",),
    ),
)

# --- ModernBERT (tests/upstream/test_modernbert.py): its window layers run the Longformer kernel whatever
# type the global layers take
WINDOW_LAYERS_NO_WEIGHTS = (
    "attention weights: ModernBERT's window layers run the Longformer window kernel (the checkpoint's "
    "pattern, in every test class), which never forms the (n, n) attention matrix; output_attentions=True "
    "raises saying so"
)
EXPECTATIONS += (
    *(
        Expectation(test, "skip", WINDOW_LAYERS_NO_WEIGHTS, groups=("modernbert",))
        for test in (
            "test_attention_outputs",
            "test_eager_matches_sdpa_inference_24_fp32_pad_left_output_attentions",
            "test_model_outputs_equivalence",
            "test_retain_grad_hidden_states_attentions",
        )
    ),
    Expectation(
        "test_model_rope_scaling_from_config_1_dynamic",
        "skip",
        "dynamic RoPE scaling changes the frequencies with the input's length (transformers' "
        "dynamic_rope_update); EfficientModernBertConfig refuses rope_type 'dynamic' and 'longrope' naming "
        "the types it takes (tests/models/text/test_modernbert.py); the linear and yarn cases run",
        groups=("modernbert",),
    ),
    Expectation(
        "test_model_forward_default_config_values",
        "xfail",
        "the test rebuilds the config without its special token ids, so with ModernBERT's defaults "
        "(pad_token_id=50283) and the tester's 99-token vocabulary, and only then sets them to 0; our "
        "configs refuse a pad_token_id outside the vocabulary when built (validate_architecture_sizes)",
        groups=("modernbert",),
    ),
)


# Attributes of a family's test class that narrow a mixin test instead of skipping it, with the reason:
# group -> {attribute: (value, reason)} (the family's module passes class_settings(group) as its body).
TESTER_SETTINGS: dict[str, dict[str, tuple[object, str]]] = {
    "dinov2": {
        "test_all_params_have_gradient": (
            False,
            "DINOv2's models have a mask token (use_mask_token, its default) that only bool_masked_pos uses, "
            "so a training step without it leaves that one parameter without a gradient; the gradient "
            "checkpointing tests still compare every other gradient with and without checkpointing "
            "(upstream's Dinov2ModelTest skips these tests altogether)",
        )
    }
}


def class_settings(group: str) -> dict:
    """The class attributes :data:`TESTER_SETTINGS` gives ``group``'s test classes."""
    return {name: value for name, (value, _reason) in TESTER_SETTINGS.get(group, {}).items()}


def _own_copy(test):
    """A new function running ``test``: a mark set on it stays on this class (the mixin's is shared)."""

    @functools.wraps(test)
    def run(self, *args, **kwargs):
        return test(self, *args, **kwargs)

    return run


def apply_expectations(cls: type, group: str, attention_type: str, modality: str | None = None) -> type:
    """Mark ``cls``'s tests listed in :data:`EXPECTATIONS` for this group (or modality) and type."""
    for entry in EXPECTATIONS:
        if not entry.applies(group, attention_type, modality):
            continue
        for name in _tests_named(cls, entry.test):
            test = getattr(cls, name)
            if entry.kind == "skip":
                marked = unittest.skip(entry.reason)(test)
            elif entry.kind == "slow":
                marked = pytest.mark.slow(_own_copy(test))
            else:
                marked = pytest.mark.xfail(reason=entry.reason, strict=True)(_own_copy(test))
            setattr(cls, name, marked)
    return cls


def _tests_named(cls: type, pattern: str) -> list[str]:
    """The test names ``pattern`` names: itself, or with a ``*`` every test it matches (the mixin's
    parametrized cases); naming none of the mixin's tests is an error, not a no-op."""
    names = fnmatch.filter(dir(cls), pattern) if "*" in pattern else [pattern]
    if not names or not all(hasattr(cls, name) for name in names):
        raise AttributeError(f"{cls.__name__} has no test {pattern!r}")
    return names
