"""Transformer-LS: long-short attention, bidirectional form.

Zhu et al. 2021, "Long-Short Transformer: Efficient Transformers for Language and Vision" (NeurIPS),
https://arxiv.org/abs/2107.02192; reference code https://github.com/NVIDIA/transformer-ls.

Per head, with w = ``window_size``, e = floor(w / 2) and r = ``num_landmarks``:

    short-term: the sequence is cut into segments of w tokens; a query of segment s attends to the keys
                at positions [s w - e, s w + w + e)  (its segment plus e tokens on each side)
    long-range: P = softmax_n(K W^P)  (n x r, softmax over positions, padded positions -> -inf)
                K_bar = P^T K,  V_bar = P^T V  (r x d)
    DualLN:     a_i = softmax([q_i LN_L(K_win(i))^T , q_i LN_G(K_bar)^T] / sqrt(d))
                out_i = a_i [LN_L(V_win(i)) ; LN_G(V_bar)]

one softmax per query over its w + 2e window keys and the r global keys. Cost O(n (w + 2e + r) d) time
and O(n (w + 2e + r)) memory (the probabilities kept for backward); nothing of size n x n is ever built.
:meth:`LongShortAttention.reference` computes it in one piece; the kernel "chunked"
(:mod:`.kernels.long_short`, what ``implementation="auto"`` runs outside torch.export / torch.compile)
computes the same a chunk of rows and segments at a time, with a flash-style backward.

Deviations from the paper / official code:
- W^P acts on each head's projected keys, (d, r) per head, instead of on the layer input X (official:
  one Linear(hidden, heads * r) on X). This contract sees only projected heads; the paper's equation is
  written P = softmax(K W^P), so the difference is only in what "K" means. W^P has no bias: a bias per
  landmark would shift a whole softmax column and cancel.
- The LayerNorms normalise over head_dim per head (official: over the full hidden size), with affine
  parameters per (head, dim), so the parameter count matches the official LayerNorm(hidden).
- K_bar = P^T K uses the raw keys as in the paper's equation (the official code projects the LN_L-normed
  keys). ``num_landmarks = 0`` drops the long-range branch (pure segment-wise sliding window);
  ``dual_ln = False`` drops both LayerNorms. Both switches exist in the official code too.
- The CLS-token special case and the depth-wise convolution of the official LRA code are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec
from .config import AttentionConfig
from .dropout import fast_dropout
from .inputs import AttentionInputs
from .kernels.long_short import CHUNKED
from .registry import register_attention
from .utils import pad_to_multiple, unpad


@dataclass
class LongShortConfig(AttentionConfig):
    """Hyperparameters of Transformer-LS.

    Attributes:
        window_size: segment length w; each query also sees floor(w / 2) keys on either side.
        num_landmarks: rank r of the dynamic projection (global keys per head); 0 disables the branch.
        dual_ln: apply the separate LayerNorms to local and to projected keys/values (DualLN).
        layer_norm_eps: epsilon of both LayerNorms.
    """

    window_size: int = 128
    num_landmarks: int = 64
    dual_ln: bool = True
    layer_norm_eps: float = 1e-5

    def validate(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}.")
        if self.num_landmarks < 0:
            raise ValueError(
                f"num_landmarks must be >= 0 (0 disables the long branch), got {self.num_landmarks}."
            )
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}.")


@register_attention("long_short")
class LongShortAttention(AttentionCore):
    config_class = LongShortConfig
    cross_attention_refusal = (
        "its sliding window pairs query i with the keys around position i of the same sequence, which a "
        "decoder's query has no place in"
    )
    relative_positions_refusal = (
        "its long-range keys are learned low-rank mixtures of the whole sequence, which sit at no distance "
        "from a query (only its window's pairs have one)"
    )
    rotary_refusal = (
        "its long-range keys are dynamic projections of the whole sequence (mixtures of the keys of every "
        "position), which have no relative position to a query; only its window could carry them"
    )
    capabilities = AttentionCapabilities(modalities=frozenset({"text", "vision", "graph"}))
    paper = "Zhu et al. 2021, Long-Short Transformer: Efficient Transformers for Language and Vision"
    cost = "O(n·(w+r))"
    summary = "segment-wise window + dynamic low-rank projection, dual LayerNorm"
    small_config = {"window_size": 6, "num_landmarks": 4}
    export_note = "every segment at once: O(n (w + 2e + r)) scores per head"
    script_configs = {  # vision: about one patch row; mqar: the defaults cover a 64-token sequence whole
        "text": {"attention_config": {"window_size": 64, "num_landmarks": 32}},
        "listops": {"attention_config": {"window_size": 64, "num_landmarks": 32}},
        "mqar": {"attention_config": {"window_size": 16, "num_landmarks": 8}},
        "vision": {"attention_config": {"window_size": 7, "num_landmarks": 8}},
    }
    kernels = (CHUNKED,)

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n min(n, w + 2e) d + 6 n r d + 4 n r d: window w + 2 floor(w/2) keys, P = softmax(K W), P^T K,
        P^T V, and r landmark keys."""
        w, r = config.window_size, config.num_landmarks
        window_keys = min(n, w + 2 * (w // 2))
        return 4.0 * n * window_keys * head_dim + 10.0 * n * r * head_dim

    no_weight_decay = ("local_norm_weight", "global_norm_weight")  # LayerNorm gains, as nn.LayerNorm's

    def __init__(self, spec: AttentionSpec, config: LongShortConfig | None = None):
        super().__init__(spec, config)
        h, d, r = spec.num_heads, spec.head_dim, self.config.num_landmarks
        self.dynamic_projection = nn.Parameter(torch.empty(h, d, r)) if r > 0 else None  # W^P per head
        if self.config.dual_ln:
            self.local_norm_weight = nn.Parameter(torch.empty(h, d))
            self.local_norm_bias = nn.Parameter(torch.empty(h, d))
            self.global_norm_weight = nn.Parameter(torch.empty(h, d))
            self.global_norm_bias = nn.Parameter(torch.empty(h, d))
        self.init_weights()

    def init_weights(self) -> None:
        """W^P ~ U(-1/sqrt(d), 1/sqrt(d)) (nn.Linear's default, as the official dconv_fc); LN = identity."""
        if self.dynamic_projection is not None:
            bound = 1.0 / math.sqrt(self.head_dim)
            nn.init.uniform_(self.dynamic_projection, -bound, bound)
        if self.config.dual_ln:
            for name in ("local", "global"):
                nn.init.ones_(getattr(self, f"{name}_norm_weight"))
                nn.init.zeros_(getattr(self, f"{name}_norm_bias"))

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """LayerNorm of x over its last dim (head_dim), then weight and bias (broadcast against x)."""
        normed = F.layer_norm(x, x.shape[-1:], eps=self.config.layer_norm_eps)
        return torch.addcmul(bias, normed, weight)

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """The module docstring's equations in one piece on (b, h, n, d) tensors, with plain autograd (what
        torch.export and torch.compile trace; memory O(n (w + 2e + r)) per head)."""
        attention_mask = inputs.attention_mask
        b, h, n, d = query.shape
        w, r = self.config.window_size, self.config.num_landmarks
        e = w // 2
        real = (
            torch.ones(b, n, dtype=torch.bool, device=query.device)
            if attention_mask is None
            else attention_mask
        )
        pad = ~real[:, None, :, None]  # (b, 1, n, 1)
        q, k, v = (t.masked_fill(pad, 0.0) for t in (query, key, value))  # poisoned padding cannot leak
        params = {name: p.to(query.dtype) for name, p in self.named_parameters(recurse=False)}

        def norm(x, which):  # LN over head_dim with per-head affine, (b, h, ..., d)
            if not self.config.dual_ln:
                return x
            weight, bias = params[f"{which}_norm_weight"], params[f"{which}_norm_bias"]  # (h, d)
            shape = (1, h) + (1,) * (x.dim() - 3) + (d,)
            return self.layer_norm(x, weight.view(shape), bias.view(shape))

        def windows(x):  # (b, ..., n) -> (b, ..., S, w + 2e): segment s sees [s w - e, s w + w + e)
            padded = F.pad(pad_to_multiple(x, w, dim=-1), (e, w - e))  # e before, up to (S + 1) w
            blocks = padded.unflatten(-1, (-1, w))  # (b, ..., S + 1, w)
            return torch.cat([blocks[..., :-1, :], blocks[..., 1:, : 2 * e]], dim=-1)

        def token_windows(x):  # (b, h, n, d) -> (b, h, S, w + 2e, d)
            return windows(x.transpose(2, 3)).permute(0, 1, 3, 4, 2)

        keys, values = token_windows(norm(k, "local")), token_windows(norm(v, "local"))
        valid = windows(real)  # (b, S, w + 2e)
        num_segments = valid.shape[1]
        if r > 0:
            logits = params["dynamic_projection"].transpose(1, 2) @ k.transpose(2, 3)  # (b, h, r, n)
            projection = torch.softmax(logits.masked_fill(~real[:, None, None], float("-inf")), dim=-1)
            landmark_keys = norm(projection @ k, "global")[:, :, None]  # (b, h, 1, r, d)
            landmark_values = norm(projection @ v, "global")[:, :, None]
            shape = (b, h, num_segments, r, d)
            keys = torch.cat([keys, landmark_keys.expand(shape)], dim=3)  # (b, h, S, w + 2e + r, d)
            values = torch.cat([values, landmark_values.expand(shape)], dim=3)
            valid = F.pad(valid, (0, r), value=True)  # landmarks always valid
        q = pad_to_multiple(q * self.scaling, w).view(b, h, num_segments, w, d)  # (b, h, S, w, d)
        scores = q @ keys.transpose(-1, -2)  # (b, h, S, w, w + 2e + r)
        scores = scores.masked_fill(~valid[:, None, :, None, :], torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        probs = fast_dropout(probs, self.spec.dropout, self.training)
        out = (probs @ values).view(b, h, num_segments * w, d)  # (b, h, S w, d)
        return AttentionOutput(unpad(out, n), None)  # (b, h, n, d)
