"""The text families under test, one entry each: transformers' tiny model of the family for every head, the
inputs and labels of each head, and checks that a family's checkpoints load into ours (strictly, equal
outputs) and back (tests/models/text/test_families.py runs them on every family); each family's tokenizer as
its users have it, trained here in a second (:func:`train_family_tokenizer`), and a tiny checkpoint saved
beside it (:meth:`TextFamily.saved_with_tokenizer`).

A new family is one :class:`TextFamily` entry in :data:`TEXT_FAMILIES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tokenizers import (
    ByteLevelBPETokenizer,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLMHeadModel,
    BertModel,
    BertTokenizerFast,
    DistilBertConfig,
    DistilBertForMaskedLM,
    DistilBertForMultipleChoice,
    DistilBertForQuestionAnswering,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertModel,
    DistilBertTokenizerFast,
    ElectraConfig,
    ElectraForCausalLM,
    ElectraForMaskedLM,
    ElectraForMultipleChoice,
    ElectraForPreTraining,
    ElectraForQuestionAnswering,
    ElectraForSequenceClassification,
    ElectraForTokenClassification,
    ElectraModel,
    ElectraTokenizerFast,
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForCausalLM,
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
    RobertaTokenizerFast,
    XLMRobertaConfig,
    XLMRobertaForCausalLM,
    XLMRobertaForMaskedLM,
    XLMRobertaForMultipleChoice,
    XLMRobertaForQuestionAnswering,
    XLMRobertaForSequenceClassification,
    XLMRobertaForTokenClassification,
    XLMRobertaModel,
    XLMRobertaTokenizerFast,
)

import hf_efficient
from hf_efficient.data.text import train_wordpiece_tokenizer
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
        rotary: its positions are rotary (ModernBERT's): only the types that carry them run
            (``hf_efficient.rotary_attention_types()``), the others are refused naming why.
        tokenizer: the kind of tokenizer its checkpoints ship (:data:`TOKENIZERS`).
    """

    name: str
    upstream_config: type
    sizes: dict
    heads: dict[type, str]
    token_types: bool = True
    pad_token_id: int = 0
    decoder_fields: dict = field(default_factory=lambda: {"is_decoder": True})
    rotary: bool = False
    tokenizer: str = "bert"

    def allows(self, attention_type: str) -> bool:
        """Whether the family's positions allow ``attention_type`` (every text type, unless rotary)."""
        return not self.rotary or attention_type in hf_efficient.rotary_attention_types("text")

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

    def saved_with_tokenizer(self, upstream_class: type, folder, texts: list[str], **fields):
        """The family's tokenizer trained on ``texts`` and transformers' tiny ``upstream_class`` model of its
        vocabulary and special ids, both saved in ``folder`` (an upstream checkpoint as users have them);
        returns the tokenizer."""
        tokenizer = train_family_tokenizer(self.tokenizer, texts)
        ids = {"pad_token_id": tokenizer.pad_token_id}
        if self.name == "modernbert":  # its config names every special id
            ids.update(cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id)
            ids.update(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
        self.checkpoint(upstream_class, folder, vocab_size=len(tokenizer), **ids, **fields)
        tokenizer.save_pretrained(folder)
        return tokenizer

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


TOKENIZER_VOCAB, TOKENIZER_MAX_LENGTH = 300, 64
# ids 0..4 in the order <s> <pad> </s> <unk> <mask>: RoBERTa's pad 1, bos 0, eos 2
ROBERTA_SPECIALS = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>")
ROBERTA_SPECIALS.update(cls_token="<s>", pad_token="<pad>", mask_token="<mask>")
BERT_SPECIALS = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]")
BERT_SPECIALS["mask_token"] = "[MASK]"
# The tokenizer classes over a trained WordPiece vocabulary: BERT's and ELECTRA's return token_type_ids,
# DistilBERT's do not (its model refuses them).
WORDPIECE_CLASSES = {"bert": BertTokenizerFast, "electra": ElectraTokenizerFast}
WORDPIECE_CLASSES["distilbert"] = DistilBertTokenizerFast


def train_family_tokenizer(kind: str, texts: list[str]) -> PreTrainedTokenizerFast:
    """A tokenizer of ``kind`` (:data:`TOKENIZERS`) trained on ``texts`` in a second, wrapped as the family's
    transformers class, with at most :data:`TOKENIZER_VOCAB` tokens and a ``model_max_length`` of 64 (what
    the tiny checkpoints read)."""
    return TOKENIZERS[kind](texts)


def _byte_level_bpe(texts: list[str], specials: list[str]) -> Tokenizer:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=TOKENIZER_VOCAB, special_tokens=specials)
    return bpe._tokenizer


def roberta_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """RoBERTa's: byte-level BPE, ``<s> A </s></s> B </s>``, no token types."""
    backend = _byte_level_bpe(texts, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    return RobertaTokenizerFast(
        tokenizer_object=backend, model_max_length=TOKENIZER_MAX_LENGTH, **ROBERTA_SPECIALS
    )


def xlm_roberta_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """XLM-R's: a SentencePiece-style Unigram model (Metaspace ``▁`` word starts), RoBERTa's layout."""
    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.UnigramTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=specials, unk_token="<unk>")
    backend.train_from_iterator(texts, trainer)
    return XLMRobertaTokenizerFast(
        tokenizer_object=backend, model_max_length=TOKENIZER_MAX_LENGTH, **ROBERTA_SPECIALS
    )


def modernbert_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """ModernBERT's: byte-level BPE with BERT's special tokens (``[CLS] A [SEP] B [SEP]``) in a plain
    ``PreTrainedTokenizerFast`` that returns no token_type_ids."""
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]  # ids 0..4: the tiny config's pad, cls, sep
    backend = _byte_level_bpe(texts, specials)
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )  # fmt: skip
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=TOKENIZER_MAX_LENGTH,
        model_input_names=["input_ids", "attention_mask"], **BERT_SPECIALS,
    )  # fmt: skip


def wordpiece_tokenizer(family: str):
    """BERT's WordPiece (``train_wordpiece_tokenizer``) in ``family``'s tokenizer class."""

    def train(texts: list[str]) -> PreTrainedTokenizerFast:
        from datasets import Dataset

        vocab = train_wordpiece_tokenizer(
            Dataset.from_dict({"text": texts}), "text", vocab_size=TOKENIZER_VOCAB, min_frequency=1
        ).get_vocab()
        return WORDPIECE_CLASSES[family](vocab=vocab, model_max_length=TOKENIZER_MAX_LENGTH)

    return train


TOKENIZERS = {
    "bert": wordpiece_tokenizer("bert"),
    "electra": wordpiece_tokenizer("electra"),
    "distilbert": wordpiece_tokenizer("distilbert"),
    "roberta": roberta_tokenizer,
    "xlm-roberta": xlm_roberta_tokenizer,
    "modernbert": modernbert_tokenizer,
}


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
# ModernBERT: a global layer then a window layer whose window (8 tokens: 4 keys on each side) the 20-token
# inputs pass; its special ids inside the tiny vocabulary, biases and norm biases on (so they load too).
MODERNBERT_SIZES = dict(
    **TINY, vocab_size=VOCAB, max_position_embeddings=64, local_attention=8, pad_token_id=0, bos_token_id=1,
    cls_token_id=1, eos_token_id=2, sep_token_id=2, norm_bias=True, attention_bias=True, mlp_bias=True,
    classifier_bias=True,
)  # fmt: skip

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
            tokenizer="roberta",
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
            tokenizer="xlm-roberta",
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
            tokenizer="electra",
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
            tokenizer="distilbert",
        ),
        TextFamily(
            "modernbert",
            ModernBertConfig,
            MODERNBERT_SIZES,
            {
                ModernBertModel: "EfficientModernBertModel",
                ModernBertForMaskedLM: "EfficientModernBertForMaskedLM",
                ModernBertForSequenceClassification: "EfficientModernBertForSequenceClassification",
                ModernBertForTokenClassification: "EfficientModernBertForTokenClassification",
                ModernBertForQuestionAnswering: "EfficientModernBertForQuestionAnswering",
                ModernBertForMultipleChoice: "EfficientModernBertForMultipleChoice",
            },
            token_types=False,
            rotary=True,
            tokenizer="modernbert",
        ),
    )
}
HEAD_CASES = [(family, upstream) for family in TEXT_FAMILIES.values() for upstream in family.heads]
