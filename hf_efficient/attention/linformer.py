"""Linformer: self-attention with linear complexity (Wang et al. 2020, arXiv:2006.04768).

Keys and values are projected along the sequence axis to a fixed length k before exact softmax:

    K' = E K,  V' = F V            E, F : (k, n_max), sliced to their first n columns for n tokens
    Attention(Q, K, V) = softmax(Q K'^T / sqrt(d)) V'

Cost O(n k d) time and O(n k) memory for the scores (O(n) for fixed k); the scores are computed by
torch's fused ``scaled_dot_product_attention`` over the k projected keys, so nothing of size n x k is
kept for the backward pass. The sequence length is capped at ``spec.max_seq_len`` (= n_max).

Parameter sharing (``sharing``, paper section 4):
    "none"      one E and one F per head                      2 h k n_max parameters per layer
    "headwise"  one E and one F shared by the heads of a layer  2 k n_max
    "key_value" one matrix, E = F, shared by the heads          k n_max
    "layerwise" one matrix E = F shared by every layer          k n_max for the whole model, tied through
                :meth:`LinformerAttention.share_parameters_with` (the same Parameter object).

Deviations from the paper:
    * Padding: padded keys and values are zeroed (``masked_fill``) before the projection, so
      ``E[:, :n_padded]`` applied to a padded batch equals ``E[:, :n_real]`` applied to the real tokens;
      appending padding changes nothing. Shorter inputs slice the projection instead of padding to n_max.
    * Initialisation: xavier-uniform with gain 1/sqrt(2), as the authors' fairseq code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .base import AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec
from .config import AttentionConfig
from .dropout import sdpa
from .inputs import AttentionInputs
from .registry import register_attention

SHARING_MODES = ("headwise", "key_value", "layerwise", "none")


@dataclass
class LinformerConfig(AttentionConfig):
    """Hyperparameters of :class:`LinformerAttention`.

    Attributes:
        projected_length: k, the number of projected keys/values (paper: 128-256).
        sharing: how the projections are shared: "headwise", "key_value", "layerwise" or "none".
    """

    projected_length: int = 256
    sharing: Literal["headwise", "key_value", "layerwise", "none"] = "headwise"

    def validate(self) -> None:
        if self.projected_length < 1:
            raise ValueError(f"projected_length must be >= 1, got {self.projected_length}.")
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"sharing must be one of {SHARING_MODES}, got {self.sharing!r}.")


def project_sequence(projection: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Apply a sequence-axis projection: (k, n) or (h, k, n) times x (b, h, n, d) -> (b, h, k, d).

    A shared (k, n) matrix is applied to all batch items and heads with one GEMM, k x n times
    n x (b h d), instead of a broadcast batched matmul that would copy the projection b*h times.
    """
    projection = projection.to(x.dtype)  # a float32 parameter on half-precision inputs (autocast)
    if projection.dim() == 3:
        return torch.einsum("hkn,bhnd->bhkd", projection, x)
    return torch.einsum("kn,bhnd->bhkd", projection, x)


@register_attention("linformer")
class LinformerAttention(AttentionCore):
    config_class = LinformerConfig
    # Not for graphs: it projects along token positions up to a fixed maximum length, and a graph's nodes
    # have neither an order nor a maximum count (the graph config has no max_position_embeddings).
    cross_attention_refusal = (
        "its learned projections E, F compress the keys of the model's own sequence by position (k x "
        "max_position_embeddings), and a decoder decodes one query at a time against an encoder sequence "
        "of another length; cross-attention over another sequence is not defined for it here"
    )
    rotary_refusal = (
        "its projections E, F mix the keys and values of every position into k compressed rows, which have "
        "no position a rotation could stand for: no query meets a key at a relative position"
    )
    capabilities = AttentionCapabilities(fixed_max_length=True, modalities=frozenset({"text", "vision"}))
    paper = "Wang et al. 2020, Linformer: Self-Attention with Linear Complexity"
    cost = "O(n·k)"
    summary = "learned length projections, head/key-value/layer sharing"
    small_config = {"projected_length": 8}
    export_note = "sequence length up to max_position_embeddings (the projections' size)"
    lra_listops = ("Linformer", 35.7)
    script_configs = {  # shared across heads; mqar and vision: shorter than their sequences (default 256)
        "text": {"attention_config": {"projected_length": 128, "sharing": "headwise"}},
        "listops": {"attention_config": {"projected_length": 128, "sharing": "headwise"}},
        "mqar": {"attention_config": {"projected_length": 16, "sharing": "headwise"}},
        "vision": {"attention_config": {"projected_length": 16, "sharing": "headwise"}},
    }

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """8 n k d: E K and F V (k x n times n x d, 4 n k d) and attention over the k projected keys
        (4 n k d)."""
        return 8.0 * n * config.projected_length * head_dim

    def __init__(self, spec: AttentionSpec, config: LinformerConfig | None = None):
        super().__init__(spec, config)
        if spec.max_seq_len is None:
            raise ValueError(
                "linformer projects keys and values from a fixed maximum length n_max and needs "
                "spec.max_seq_len (the model's max_position_embeddings); got None."
            )
        self.max_seq_len = spec.max_seq_len
        k, n_max, sharing = self.config.projected_length, spec.max_seq_len, self.config.sharing
        if sharing == "none":
            # (h, k, n_max): one projection per head.
            self.key_projection = nn.Parameter(torch.empty(self.num_heads, k, n_max))
            self.value_projection = nn.Parameter(torch.empty(self.num_heads, k, n_max))
        elif sharing == "headwise":
            self.key_projection = nn.Parameter(torch.empty(k, n_max))
            self.value_projection = nn.Parameter(torch.empty(k, n_max))
        else:  # "key_value" and "layerwise": E = F
            self.projection = nn.Parameter(torch.empty(k, n_max))
        self.init_weights()

    def _projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(E, F), each (k, n_max) or (h, k, n_max); the same tensor twice when keys and values share."""
        if self.config.sharing in ("key_value", "layerwise"):
            return self.projection, self.projection
        return self.key_projection, self.value_projection

    def init_weights(self) -> None:
        """Xavier-uniform (gain 1/sqrt(2)) over fan_in = n_max, fan_out = k, for every head's matrix."""
        bound = math.sqrt(6.0 / (self.max_seq_len + self.config.projected_length)) / math.sqrt(2.0)
        for param in {id(p): p for p in self._projections()}.values():
            with torch.no_grad():
                param.uniform_(-bound, bound)

    def share_parameters_with(self, first: AttentionCore) -> None:
        """Layerwise sharing: use ``first``'s projection (the same Parameter object) for this layer.

        Does nothing for the other sharing modes. Raises if ``first`` is built with different sizes.
        """
        if self.config.sharing != "layerwise":
            return
        if not isinstance(first, LinformerAttention) or first.config.sharing != "layerwise":
            raise ValueError(
                "linformer layerwise sharing needs the first linformer layer to use sharing='layerwise' too."
            )
        if first.projection.shape != self.projection.shape:
            raise ValueError(
                "linformer layerwise sharing: the first linformer layer projects with shape "
                f"{tuple(first.projection.shape)} but this layer with {tuple(self.projection.shape)}; use "
                "the same projected_length and max_seq_len in every layer."
            )
        self.projection = first.projection

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_seq_len={self.max_seq_len}"

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """softmax(Q (E K)^T / sqrt(d)) (F V), E and F sliced to the first n columns; (b, h, n, d)."""
        attention_mask = inputs.attention_mask
        n = query.shape[-2]
        if attention_mask is not None:
            # Zero padded keys/values (masked_fill, so poisoned padding cannot leak) before they are mixed.
            padded = ~attention_mask[:, None, :, None]  # (b, 1, n, 1)
            key = key.masked_fill(padded, 0.0)
            value = value.masked_fill(padded, 0.0)
        # E[..., :n] and F[..., :n] as a gather of the first n columns: a slice of a parameter by a traced
        # length makes torch.export guard on n != n_max (measured on torch 2.13); a gather is the same copy.
        first = torch.arange(n, device=query.device)
        key_projection, value_projection = (p.index_select(-1, first) for p in self._projections())
        projected_key = project_sequence(key_projection, key)  # (b, h, k, d)
        projected_value = project_sequence(value_projection, value)  # (b, h, k, d)
        dropout = self.spec.dropout if self.training else 0.0
        output = sdpa(
            query, projected_key, projected_value, dropout_p=dropout, scale=self.scaling
        )  # (b, h, n, d)
        return AttentionOutput(output, None)
