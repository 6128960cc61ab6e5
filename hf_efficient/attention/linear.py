"""Linear attention: Katharopoulos et al. 2020, "Transformers are RNNs: Fast Autoregressive Transformers
with Linear Attention" (ICML 2020).

Softmax similarity exp(q^T k) is replaced by a kernel phi(q)^T phi(k) with phi(x) = elu(x) + 1 > 0:

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)

Non-causal: the sums run over all keys. Causal (``is_causal=True``): over j <= i only; the reference
(``_kernelized``) computes it as the masked quadratic form tril(phi(Q) phi(K)^T) [V, 1], the kernel
``"chunked"`` (``kernels.kernelized``) in blocks of ``block_size`` tokens with prefix sums of the d x d
states across blocks, and token-by-token decoding by the recurrent form :meth:`step` with state (S, z),
S_i = S_{i-1} + phi(k_i) v_i^T, z_i = z_{i-1} + phi(k_i). Cost O(n d^2) time, O(n d) memory;
decoding keeps (S, z) per layer, h d (d + 1) numbers whatever the context (a
:class:`~hf_efficient.attention.cache.RecurrentStateLayer`), and spends O(d^2) per token and head.

Deviations from the paper: ``eps`` (default 1e-6) is added to the denominator (the reference code does the
same); padded keys are honoured by zeroing both their mapped keys phi(k_j) and their values (masked_fill), so
they contribute to neither sum. There is no 1/sqrt(d) scaling (none in the paper either: phi is applied to
the raw projections).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from ._kernel_state import FeatureMaps, Pointwise, plain
from ._kernelized import KernelizedAttentionCore
from .base import ROTATE_FEATURE_MAPS, AttentionCapabilities
from .config import AttentionConfig
from .kernels.fla import KERNELIZED_FLA
from .kernels.kernelized import CHUNKED
from .kernels.kernelized_parallel import PARALLEL
from .registry import register_attention


@dataclass
class LinearAttentionConfig(AttentionConfig):
    """Hyperparameters of ``linear``.

    Attributes:
        eps: added to the denominator phi(q_i)^T z.
        block_size: block length of the chunked kernel's causal form (speed only; no effect on results).
    """

    eps: float = 1e-6
    block_size: int = 64

    def validate(self) -> None:
        if not self.eps >= 0.0:
            raise ValueError(f"linear: eps must be >= 0, got {self.eps}.")
        if self.block_size < 1:
            raise ValueError(f"linear: block_size must be >= 1, got {self.block_size}.")


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1, positive everywhere."""
    return masked_elu_feature_map(x, None)


def masked_elu_feature_map(x: torch.Tensor, keep: torch.Tensor | None, pointwise: Pointwise = plain):
    """phi(x) for keys, exactly 0 at padded positions (``keep`` (b, 1, c, 1) False).

    Its derivative is a function of phi, phi' = min(phi, 1) (exp(x) = phi for x <= 0, 1 above; 0 at padded
    keys): ``pointwise`` may keep only phi for backward (the chunked kernel does)."""
    return pointwise(x, keep, _elu_plus_one, lambda phi: phi.clamp(max=1.0))


def _elu_plus_one(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    phi = F.elu(x).add_(1.0)
    return phi if keep is None else phi.masked_fill_(~keep, 0.0)


@register_attention("linear")
class LinearAttention(KernelizedAttentionCore):
    """Kernelised attention with phi(x) = elu(x) + 1 (no parameters, no random state)."""

    config_class = LinearAttentionConfig
    # auto: parallel on CUDA, chunked elsewhere; fla (the gpu extra) only when forced, until measured
    kernels = (PARALLEL, CHUNKED, KERNELIZED_FLA)
    capabilities = AttentionCapabilities(
        causal=True, permutation_equivariant=True, cross_attention=True, rotary=ROTATE_FEATURE_MAPS
    )
    paper = (
        "Katharopoulos et al. 2020, Transformers are RNNs: Fast Autoregressive Transformers with Linear "
        "Attention"
    )
    cost = "O(n·d²)"
    summary = "elu+1 features, causal prefix-sum and RNN step forms"
    small_config = {"block_size": 4}
    export_note = "one piece (no chunks): O(n d) features"
    lra_listops = ("Linear Trans.", 16.13)
    script_configs = {  # graph: GraphGPS, graph_sparse along edges plus linear attention over all nodes
        "graph": {"model": {"graph_layer_type": "gps", "local_attention_type": "graph_sparse"}}
    }
    float32_for = (torch.float16,)  # see _kernelized: 1 / normaliser gradients overflow float16

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n d (d + 1): phi(K)^T [V, 1] and phi(Q) [S | z] with d features (elu + 1)."""
        return 4.0 * n * head_dim * (head_dim + 1)

    def feature_maps(self, query, attention_mask, pointwise: Pointwise = plain) -> FeatureMaps:
        return FeatureMaps(
            query,
            query_features=partial(masked_elu_feature_map, keep=None, pointwise=pointwise),
            key_features=partial(masked_elu_feature_map, pointwise=pointwise),
            num_features=self.head_dim,
            key_maxima=None,  # elu + 1 needs no stabilising shift
        )
