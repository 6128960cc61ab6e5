"""transformers' BERT with relative position embeddings, as transformers 4 built them: the reference of the
relative-position parity tests (tests/models/text/test_relative_positions.py).

transformers 5 dropped ``position_embedding_type`` from BERT (its BertModel always adds absolute positions and
builds no ``distance_embedding``), while checkpoints trained with transformers 4's ``"relative_key"`` /
``"relative_key_query"`` (zhiheng-huang/bert-base-uncased-embedding-relative-key, ...) hold them. Within
:func:`relative_bert`, transformers' BERT classes build transformers 4's modules instead: each layer's
``attention.self`` gets its ``distance_embedding`` (2 L - 1 rows of head size) and scores

    s_ij = (q_i . k_j + q_i . e_{i-j} [+ k_j . e_{i-j}]) / sqrt(d) + mask_ij

op for op as transformers 4's eager ``BertSelfAttention`` (the einsums over the (n, T) distance table, the
sum before the scaling), and the embeddings add no absolute positions. Everything else (names, heads, masks,
the cache) is transformers 5's own. Checked once against transformers 4.57.1 itself (tiny checkpoints of every
BERT head, both types, distance tables of standard deviation 0.5): equal outputs, 0.0 apart; only its decoder
called with a cache (use_cache=True, its default) differs, as it gave every query of a cached call the last
position's distances.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from transformers.cache_utils import EncoderDecoderCache
from transformers.models.bert import modeling_bert

RELATIVE_TYPES = ("relative_key", "relative_key_query")


class RelativeBertEmbeddings(modeling_bert.BertEmbeddings):
    """transformers 4's BertEmbeddings with relative positions: words + token types, LayerNorm, dropout (the
    position table is built, and saved, but not added)."""

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None, **kwargs):
        embeds = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if token_type_ids is None:
            token_type_ids = torch.zeros(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return self.dropout(self.LayerNorm(embeds + self.token_type_embeddings(token_type_ids)))


class RelativeBertSelfAttention(modeling_bert.BertSelfAttention):
    """transformers 4's eager BertSelfAttention with ``distance_embedding``."""

    def __init__(self, config, is_causal=False, layer_idx=None):
        super().__init__(config, is_causal=is_causal, layer_idx=layer_idx)
        self.position_embedding_type = config.position_embedding_type
        self.max_position_embeddings = config.max_position_embeddings
        self.distance_embedding = nn.Embedding(
            2 * config.max_position_embeddings - 1, self.attention_head_size
        )

    def forward(self, hidden_states, attention_mask=None, cache=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
        query, key, value = (
            projection(hidden_states).view(shape).transpose(1, 2)
            for projection in (self.query, self.key, self.value)
        )  # (b, h, n, d)
        if cache is not None:
            own = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
            key, value = own.update(key, value, self.layer_idx)  # (b, h, T, d)
        query_length, key_length = query.shape[2], key.shape[2]
        # the queries are the last query_length of key_length positions (transformers 4 wrote key_length - 1
        # for every query of a cached call, the same for one new token)
        position_ids_l = torch.arange(key_length - query_length, key_length, device=query.device).view(-1, 1)
        position_ids_r = torch.arange(key_length, device=query.device).view(1, -1)
        distance = position_ids_l - position_ids_r
        positional_embedding = self.distance_embedding(distance + self.max_position_embeddings - 1)
        positional_embedding = positional_embedding.to(dtype=query.dtype)
        scores = torch.matmul(query, key.transpose(-1, -2))
        scores = scores + torch.einsum("bhld,lrd->bhlr", query, positional_embedding)
        if self.position_embedding_type == "relative_key_query":
            scores = scores + torch.einsum("bhrd,lrd->bhlr", key, positional_embedding)
        scores = scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                attention_mask = torch.zeros_like(scores).masked_fill(
                    ~attention_mask, torch.finfo(scores.dtype).min
                )
            scores = scores + attention_mask
        probs = self.dropout(nn.functional.softmax(scores, dim=-1))
        output = torch.matmul(probs, value).transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return output, probs


@contextlib.contextmanager
def relative_bert():
    """Within it, transformers' BERT classes build transformers 4's relative-position modules (on a config
    with ``position_embedding_type`` relative_key or relative_key_query, eager attention)."""
    saved = modeling_bert.BertSelfAttention, modeling_bert.BertEmbeddings
    modeling_bert.BertSelfAttention, modeling_bert.BertEmbeddings = (
        RelativeBertSelfAttention,
        RelativeBertEmbeddings,
    )
    try:
        yield
    finally:
        modeling_bert.BertSelfAttention, modeling_bert.BertEmbeddings = saved
