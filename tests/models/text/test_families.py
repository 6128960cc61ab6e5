"""Every text family against transformers' own classes: a checkpoint of every head upstream has loads strictly
into ours with equal outputs (1e-5), loads under other attention types with only the type's own parameters
new, and what we save with exact attention loads back into transformers' class with equal outputs.

The families and their heads: tests/models/text/families.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForMaskedLM

from hf_efficient import list_attention_types
from hf_efficient.models.families import task_of

from ...attention.helpers import small_config
from ..helpers import CONFIG_ERRORS
from .families import HEAD_CASES, TEXT_FAMILIES
from .helpers import assert_close_real

CLOSE = dict(atol=1e-5, rtol=1e-5)
PER_TOKEN = ("last_hidden_state", "logits", "prediction_logits", "start_logits", "end_logits")


def case_id(case) -> str:
    family, upstream = case
    return f"{family.name}-{upstream.__name__}"


def assert_same_outputs(got, expected, mask: torch.Tensor, names=None) -> None:
    """Every output field transformers gives (per-token ones at real positions: transformers' padded
    positions are meaningless), the loss included."""
    skipped = ("hidden_states", "attentions", "cache", "past_key_values")
    for name in names or [name for name in expected.keys() if name not in skipped]:
        ours, theirs = got[name], expected[name]
        if name in PER_TOKEN and ours.dim() >= 2 and ours.shape[:2] == mask.shape:
            assert_close_real(ours, theirs, mask, **CLOSE)
        else:
            torch.testing.assert_close(ours, theirs, **CLOSE, msg=name)


def forward(model, inputs):
    with torch.no_grad():
        return model.eval()(**inputs)


@pytest.mark.parametrize("case", HEAD_CASES, ids=case_id)
def test_upstream_checkpoint_loads_strictly_with_equal_outputs(case, tmp_path):
    family, upstream = case
    reference = family.checkpoint(upstream, tmp_path)
    our_class = family.ours(upstream)
    ours, info = our_class.from_pretrained(tmp_path, output_loading_info=True)
    assert ours.config.attention_type == "full"
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    inputs, mask = family.inputs(our_class)
    expected, got = forward(reference, inputs), forward(ours, inputs)
    if "start_positions" in inputs:
        # transformers' span loss softmaxes over padded positions too (their logits are meaningless there):
        # the losses are compared on the batch without padding.
        full = {**inputs, "attention_mask": torch.ones_like(mask)}
        torch.testing.assert_close(forward(ours, full).loss, forward(reference, full).loss, **CLOSE)
        assert_same_outputs(got, expected, mask, names=["start_logits", "end_logits"])
        return
    assert_same_outputs(got, expected, mask)


@pytest.mark.parametrize("case", HEAD_CASES, ids=case_id)
def test_saved_with_exact_attention_loads_back_into_transformers(case, tmp_path):
    family, upstream = case
    family.checkpoint(upstream, tmp_path / "upstream")
    our_class = family.ours(upstream)
    ours = our_class.from_pretrained(tmp_path / "upstream")
    ours.save_pretrained(tmp_path / "ours")
    back, info = upstream.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    inputs, _ = family.inputs(our_class)
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])  # transformers' pads are its own
    expected = forward(back, inputs)
    assert_same_outputs(forward(ours, inputs), expected, inputs["attention_mask"].reshape(-1, 20))


@pytest.mark.parametrize("attention_type", ["longformer", "performer"])
@pytest.mark.parametrize("name", list(TEXT_FAMILIES))
def test_every_head_loads_with_another_attention(name, attention_type, tmp_path):
    """Every weight of every head's checkpoint loads under another type; only the core's own parameters are
    new; each head trains (a finite loss, a finite gradient)."""
    family = TEXT_FAMILIES[name]
    for index, upstream in enumerate(family.heads):
        if family.ours(upstream).__name__.endswith("ForCausalLM") and attention_type not in ("longformer",):
            continue  # a decoder needs a causal form: longformer has one, performer's is tested elsewhere
        folder = tmp_path / str(index)
        reference = family.checkpoint(upstream, folder)
        config = small_config(attention_type, causal=upstream.__name__.endswith(("CausalLM", "LMHeadModel")))
        ours, info = family.ours(upstream).from_pretrained(
            folder, attention_type=attention_type, attention_config=config, output_loading_info=True
        )
        assert all(".core." in key for key in info["missing_keys"]), info["missing_keys"]
        assert not info["unexpected_keys"] and not info["mismatched_keys"], info
        theirs = dict(reference.named_parameters(remove_duplicate=False))  # tied: under both names
        for param_name, param in ours.named_parameters():
            if ".core." not in param_name:
                torch.testing.assert_close(param, theirs[param_name], atol=0, rtol=0, msg=param_name)
        inputs, _ = family.inputs(family.ours(upstream))
        out = ours.train()(**inputs)
        if "loss" in out and out.loss is not None:
            assert torch.isfinite(out.loss)
            out.loss.backward()
            assert all(p.grad is None or torch.isfinite(p.grad).all() for p in ours.parameters())


@pytest.mark.parametrize("name", list(TEXT_FAMILIES))
def test_reformer_shares_queries_and_keys_in_every_family(name, tmp_path):
    """Reformer LSH's keys are its queries: every family's attention builds no key projection, so a checkpoint
    loads with exactly its key projections unused (reported), and the model trains."""
    family = TEXT_FAMILIES[name]
    bare = next(iter(family.heads))
    family.checkpoint(bare, tmp_path)
    if not family.allows("reformer_lsh"):  # rotary positions: its buckets would hash rotated vectors
        with pytest.raises(CONFIG_ERRORS, match="'reformer_lsh' cannot carry rotary positions: its hash"):
            family.ours(bare).from_pretrained(tmp_path, attention_type="reformer_lsh")
        return
    ours, info = family.ours(bare).from_pretrained(
        tmp_path, attention_type="reformer_lsh", attention_config=small_config("reformer_lsh"),
        output_loading_info=True,
    )  # fmt: skip
    unused = info["unexpected_keys"]
    assert unused and all(key.rsplit(".", 2)[-2] in ("key", "k_lin") for key in unused), unused
    assert all(".core." in key for key in info["missing_keys"]), info["missing_keys"]
    assert not any(name.rsplit(".", 2)[-2] in ("key", "k_lin") for name, _ in ours.named_parameters())
    inputs, mask = family.inputs(family.ours(bare))
    hidden = ours.train()(**inputs).last_hidden_state  # (b, n, D)
    (hidden * mask[..., None]).square().mean().backward()
    grads = [param.grad for param in ours.parameters() if param.grad is not None]
    assert grads and all(torch.isfinite(grad).all() for grad in grads)


@pytest.mark.parametrize("attention_type", list_attention_types("text"))
@pytest.mark.parametrize("name", list(TEXT_FAMILIES))
def test_every_text_type_trains_in_every_family(name, attention_type):
    """Each family's layers (BERT's, DistilBERT's) and embeddings (ELECTRA's projected ones) run every text
    attention type: a masked-LM training step on a padded batch, a finite loss and finite gradients."""
    family = TEXT_FAMILIES[name]
    upstream = next(up for up in family.heads if task_of(family.ours(up)) is AutoModelForMaskedLM)
    our_class = family.ours(upstream)
    fields = {
        **family.sizes,
        "attention_type": attention_type,
        "attention_config": small_config(attention_type),
    }
    if not family.allows(attention_type):  # a type that cannot carry the family's rotary positions
        with pytest.raises(CONFIG_ERRORS, match=f"'{attention_type}' cannot carry rotary positions: "):
            our_class.config_class(**fields)
        return
    torch.manual_seed(0)
    model = our_class(our_class.config_class(**fields)).train()
    inputs, _ = family.inputs(our_class)
    loss = model(**inputs).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("case", HEAD_CASES, ids=case_id)
def test_padding_free_equals_padded(case, tmp_path):
    """Every head computed padding-free (config.padding_free: the real tokens only) gives the padded
    computation's outputs at every real token and its loss."""
    family, upstream = case
    family.checkpoint(upstream, tmp_path)
    our_class = family.ours(upstream)
    padded = our_class.from_pretrained(tmp_path)
    free = our_class.from_pretrained(tmp_path, padding_free=True)
    inputs, mask = family.inputs(our_class)
    assert_same_outputs(forward(free, inputs), forward(padded, inputs), mask)


@pytest.mark.parametrize(
    "case", [c for c in HEAD_CASES if "MultipleChoice" not in c[1].__name__], ids=case_id
)
def test_packed_row_equals_each_sequence_alone(case, tmp_path):
    """A row of packed sequences (DataCollatorWithFlattening's: position_ids restarting at 0) gives each
    sequence its outputs alone: every token's for the token-level heads, one per sequence for the
    sequence-level ones (the pooled output too). A decoder keeps its sequences apart causally."""
    from transformers import DataCollatorWithFlattening

    family, upstream = case
    family.checkpoint(upstream, tmp_path)
    model = family.ours(upstream).from_pretrained(tmp_path).eval()
    ids, mask = family.batch()
    lengths = mask.sum(-1).tolist()
    examples = [{"input_ids": ids[i, :length].tolist()} for i, length in enumerate(lengths)]
    row = DataCollatorWithFlattening(return_tensors="pt")(examples)
    with torch.no_grad():
        together = model(row["input_ids"], position_ids=row["position_ids"])
        alone = [model(ids[i : i + 1, :length]) for i, length in enumerate(lengths)]
    for name in together.keys():
        if name in ("cache", "hidden_states", "attentions"):
            continue
        if together[name].shape[0] == len(lengths):  # one output per sequence
            expected = torch.cat([out[name] for out in alone])
        else:  # one per token, along the row
            expected = torch.cat([out[name] for out in alone], dim=1)
        torch.testing.assert_close(together[name], expected, **CLOSE, msg=name)
