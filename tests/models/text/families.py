"""The text families under test, one entry each: transformers' tiny model of the family for every head, the
inputs and labels of each head, and checks that a family's checkpoints load into ours (strictly, equal
outputs) and back (tests/models/text/test_families.py runs them on every family).

A new family is one :class:`TextFamily` entry in :data:`TEXT_FAMILIES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLMHeadModel,
    BertModel,
    DistilBertConfig,
    DistilBertForMaskedLM,
    DistilBertForMultipleChoice,
    DistilBertForQuestionAnswering,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertModel,
    ElectraConfig,
    ElectraForCausalLM,
    ElectraForMaskedLM,
    ElectraForMultipleChoice,
    ElectraForPreTraining,
    ElectraForQuestionAnswering,
    ElectraForSequenceClassification,
    ElectraForTokenClassification,
    ElectraModel,
    RobertaConfig,
    RobertaForCausalLM,
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
    XLMRobertaConfig,
    XLMRobertaForCausalLM,
    XLMRobertaForMaskedLM,
    XLMRobertaForMultipleChoice,
    XLMRobertaForQuestionAnswering,
    XLMRobertaForSequenceClassification,
    XLMRobertaForTokenClassification,
    XLMRobertaModel,
)

import hf_efficient
from hf_efficient.models.families import task_of

from .helpers import LENGTHS

VOCAB, NUM_LABELS, NUM_CHOICES = 99, 3, 2
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


@dataclass(frozen=True)
class TextFamily:
    """One family: its transformers config and tiny sizes (in the family's own field names), transformers'
    class of every head with ours beside it, and how its inputs look.

    Attributes:
        name: the family, as tests are named.
        upstream_config: transformers' config class of the family.
        sizes: a tiny model in that config's fields.
        heads: transformers' class -> ours (by name, in ``hf_efficient``).
        token_types: its tokenizer returns token_type_ids (BERT's segments).
        pad_token_id: the padding id its positions and padding read.
    """

    name: str
    upstream_config: type
    sizes: dict
    heads: dict[type, str]
    token_types: bool = True
    pad_token_id: int = 0
    decoder_fields: dict = field(default_factory=lambda: {"is_decoder": True})

    def config(self, upstream_class: type, **fields):
        """transformers' tiny config for ``upstream_class`` (a causal LM gets ``is_decoder``), ``fields``
        replacing any of its values."""
        task = task_of(self.ours(upstream_class)).__name__
        extra = dict(self.decoder_fields) if task == "AutoModelForCausalLM" else {}
        if task in ("AutoModelForSequenceClassification", "AutoModelForTokenClassification"):
            extra["num_labels"] = NUM_LABELS  # question answering keeps its 2 (start, end)
        return self.upstream_config(**{**self.sizes, **extra, **fields})

    def checkpoint(self, upstream_class: type, folder, **fields) -> torch.nn.Module:
        """transformers' tiny ``upstream_class`` model (``fields`` set on its config), its zero-initialised
        parameters randomised, saved in ``folder``; returned in eval mode."""
        torch.manual_seed(0)
        model = upstream_class(self.config(upstream_class, **fields)).eval()
        randomise_zero_init(model)
        model.save_pretrained(folder)
        return model

    def ours(self, upstream_class: type) -> type:
        return getattr(hf_efficient, self.heads[upstream_class])

    def batch(self, rows: int = 3, n: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids (rows, n) above the special ids, padding ids at padded positions, and the 0/1 mask
        (lengths 20, 13, 7 for the first three rows)."""
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(5, VOCAB, (rows, n), generator=g)
        lengths = torch.tensor([LENGTHS[i % len(LENGTHS)] for i in range(rows)])
        mask = (torch.arange(n)[None] < lengths[:, None]).long()
        return ids.masked_fill(mask == 0, self.pad_token_id), mask

    def inputs(self, our_class: type) -> tuple[dict, torch.Tensor]:
        """The inputs and labels of a head (as its collator gives them) and the (rows, n) mask of its
        sequences."""
        task = task_of(our_class).__name__
        rows = 2 * NUM_CHOICES if task == "AutoModelForMultipleChoice" else 3
        ids, mask = self.batch(rows)
        inputs = {"input_ids": ids, "attention_mask": mask}
        if self.token_types:
            inputs["token_type_ids"] = (torch.arange(ids.shape[1]) >= 10).long().expand_as(ids)
        g = torch.Generator().manual_seed(1)
        if task == "AutoModelForMultipleChoice":
            inputs = {key: value.reshape(2, NUM_CHOICES, -1) for key, value in inputs.items()}
            return {**inputs, "labels": torch.tensor([1, 0])}, mask
        if task == "AutoModelForSequenceClassification":
            return {**inputs, "labels": torch.tensor([0, 2, 1])}, mask
        if task == "AutoModelForTokenClassification":
            labels = torch.randint(0, NUM_LABELS, ids.shape, generator=g).masked_fill(mask == 0, -100)
            return {**inputs, "labels": labels}, mask
        if task == "AutoModelForQuestionAnswering":
            positions = {"start_positions": torch.tensor([3, 1, 0]), "end_positions": torch.tensor([5, 4, 2])}
            return {**inputs, **positions}, mask
        if task == "AutoModelForMaskedLM":
            labels = ids.masked_fill((torch.rand(ids.shape, generator=g) < 0.6) | (mask == 0), -100)
            labels[:, 0] = ids[:, 0]  # a target in every row
            return {**inputs, "labels": labels}, mask
        if task == "AutoModelForCausalLM":
            return {**inputs, "labels": ids.masked_fill(mask == 0, -100)}, mask
        if task == "AutoModelForPreTraining":  # ELECTRA's discriminator: 1 = a replaced token
            return {**inputs, "labels": torch.randint(0, 2, ids.shape, generator=g)}, mask
        return inputs, mask


def randomise_zero_init(model: torch.nn.Module) -> None:
    """Give biases and norms non-trivial values, so a parameter that fails to load shows."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                param.add_(0.1 * torch.randn_like(param))


BERT_HEADS = {
    BertModel: "EfficientBertModel",
    BertForMaskedLM: "EfficientBertForMaskedLM",
    BertLMHeadModel: "EfficientBertForCausalLM",
    BertForSequenceClassification: "EfficientBertForSequenceClassification",
    BertForTokenClassification: "EfficientBertForTokenClassification",
    BertForQuestionAnswering: "EfficientBertForQuestionAnswering",
    BertForMultipleChoice: "EfficientBertForMultipleChoice",
}
ROBERTA_SIZES = dict(**TINY, vocab_size=VOCAB, max_position_embeddings=66, type_vocab_size=1)
# The activations are not the default gelu, so that the heads with a fixed one (ELECTRA's generator and
# classifier: gelu; DistilBERT's classifiers: relu) show if they read the config's instead.
ELECTRA_SIZES = dict(
    **TINY, vocab_size=VOCAB, max_position_embeddings=64, embedding_size=16, hidden_act="silu"
)
DISTILBERT_SIZES = dict(
    dim=32,
    n_layers=2,
    n_heads=4,
    hidden_dim=37,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    activation="silu",
)

TEXT_FAMILIES = {
    family.name: family
    for family in (
        TextFamily(
            "bert",
            BertConfig,
            dict(**TINY, vocab_size=VOCAB, max_position_embeddings=64),
            BERT_HEADS,
        ),
        TextFamily(
            "roberta",
            RobertaConfig,
            ROBERTA_SIZES,
            {
                RobertaModel: "EfficientRobertaModel",
                RobertaForMaskedLM: "EfficientRobertaForMaskedLM",
                RobertaForCausalLM: "EfficientRobertaForCausalLM",
                RobertaForSequenceClassification: "EfficientRobertaForSequenceClassification",
                RobertaForTokenClassification: "EfficientRobertaForTokenClassification",
                RobertaForQuestionAnswering: "EfficientRobertaForQuestionAnswering",
                RobertaForMultipleChoice: "EfficientRobertaForMultipleChoice",
            },
            token_types=False,
            pad_token_id=1,
        ),
        TextFamily(
            "xlm-roberta",
            XLMRobertaConfig,
            ROBERTA_SIZES,
            {
                XLMRobertaModel: "EfficientXLMRobertaModel",
                XLMRobertaForMaskedLM: "EfficientXLMRobertaForMaskedLM",
                XLMRobertaForCausalLM: "EfficientXLMRobertaForCausalLM",
                XLMRobertaForSequenceClassification: "EfficientXLMRobertaForSequenceClassification",
                XLMRobertaForTokenClassification: "EfficientXLMRobertaForTokenClassification",
                XLMRobertaForQuestionAnswering: "EfficientXLMRobertaForQuestionAnswering",
                XLMRobertaForMultipleChoice: "EfficientXLMRobertaForMultipleChoice",
            },
            token_types=False,
            pad_token_id=1,
        ),
        TextFamily(
            "electra",
            ElectraConfig,
            ELECTRA_SIZES,
            {
                ElectraModel: "EfficientElectraModel",
                ElectraForPreTraining: "EfficientElectraForPreTraining",
                ElectraForMaskedLM: "EfficientElectraForMaskedLM",
                ElectraForCausalLM: "EfficientElectraForCausalLM",
                ElectraForSequenceClassification: "EfficientElectraForSequenceClassification",
                ElectraForTokenClassification: "EfficientElectraForTokenClassification",
                ElectraForQuestionAnswering: "EfficientElectraForQuestionAnswering",
                ElectraForMultipleChoice: "EfficientElectraForMultipleChoice",
            },
        ),
        TextFamily(
            "distilbert",
            DistilBertConfig,
            DISTILBERT_SIZES,
            {
                DistilBertModel: "EfficientDistilBertModel",
                DistilBertForMaskedLM: "EfficientDistilBertForMaskedLM",
                DistilBertForSequenceClassification: "EfficientDistilBertForSequenceClassification",
                DistilBertForTokenClassification: "EfficientDistilBertForTokenClassification",
                DistilBertForQuestionAnswering: "EfficientDistilBertForQuestionAnswering",
                DistilBertForMultipleChoice: "EfficientDistilBertForMultipleChoice",
            },
            token_types=False,
        ),
    )
}
HEAD_CASES = [(family, upstream) for family in TEXT_FAMILIES.values() for upstream in family.heads]
