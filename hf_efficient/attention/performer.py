"""Performer (FAVOR+): Choromanski et al. 2021, "Rethinking Attention with Performers" (ICLR 2021).

Softmax attention exp(q^T k / sqrt(d)) is estimated with positive orthogonal random features: with
x' = x d^{-1/4} (so q'^T k' = q^T k / sqrt(d)) and rows w_1..w_m of W,

    phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m)          E[phi(q)^T phi(k)] = exp(q^T k / sqrt(d))
    out_i  = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)

(``kernel="relu"``: phi(x) = relu(W x) / sqrt(m) + 1e-3, the paper's generalised ReLU kernel.) W is built
from orthogonal blocks: QR of d x d Gaussian matrices (signs fixed so each block is Haar-distributed), rows
rescaled by chi_d-distributed norms ("regular" scaling, so each row is marginally N(0, I)). Non-causal and
causal (see ``_kernelized``; the kernel ``"chunked"`` computes features chunk by chunk and the causal form
in blocks, ``kernels.kernelized``). Cost O(n m d) time; memory with the chunked kernel O(n m) when training
(autograd keeps the features), O(n d + m d) beyond the inputs in inference.

Numerical stabilisation (as the official code): exponents are shifted before exp. A query row may use its
own shift (its max exponent): phi(q_i) appears in both numerator and denominator of out_i, so a per-row factor
cancels. Keys must share ONE shift (per batch item and head): a per-key factor c_j would turn the estimate
into sum_j c_j phi(q_i)^T phi(k_j) v_j / sum_j c_j ..., i.e. reweight the keys and bias the attention. The
shift is the max over the keys that query i sums over and features f of (W k'_j)_f - |k'_j|^2/2: all real
keys in the non-causal form; in the causal form the keys j <= i only (the running maximum), so no later key
can change an earlier output (through eps or underflow), and incremental decoding, which sees keys one at a
time, computes exactly the same thing: its state keeps the sums and their shift and rescales them when a new
key raises the maximum (``_kernelized``). The shifts are constants
(detached); padded keys are left out of the maxima and their features are exactly 0.

Deviations: eps is added to the denominator instead of 1e-6 to every softmax feature; exponents are
floored at -80 (a feature can be no smaller than e^-80 of its row's largest: no denormals); query features
drop the |x'|^2/2 term together with the row shift (a per-row factor: values and gradients change only at
the eps level); the key shift is per (batch, head), not over the whole batch (keeps batch items
independent); in the causal form it is the running maximum (the official code's causal form shifts by the
maximum over all keys, later ones included). W is redrawn only when asked (:meth:`resample_random_state`,
called by ``hf_efficient.training.RandomStateCallback``), never inside ``forward``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from ._kernel_state import FeatureMaps, Pointwise, accumulate_dtype, plain
from ._kernelized import KernelizedAttentionCore
from .base import ROTATE_FEATURE_MAPS, AttentionCapabilities, AttentionSpec
from .config import AttentionConfig
from .kernels.fla import KERNELIZED_FLA
from .kernels.kernelized import CHUNKED
from .kernels.kernelized_parallel import PARALLEL
from .registry import register_attention
from .utils import orthogonal_gaussian_features

RELU_FEATURE_FLOOR = 1e-3  # the official relu_kernel_transformation's numerical_stabilizer
# Exponents are floored here (features >= e^-80 ~ 2e-35 of a row's largest, 0 in every float32 sum) before
# exp: below about -87 exp underflows into denormals, which are much slower on CPU, and a checkpoint's
# large-norm keys put many features there.
EXPONENT_FLOOR = -80.0


def floored_exp(exponent: torch.Tensor, keep: torch.Tensor | None = None, pointwise: Pointwise = plain):
    """exp(max(exponent, EXPONENT_FLOOR)), 0 where ``keep`` is False; overwrites ``exponent`` (a temporary).

    Its derivative is a function of its output (d phi = phi where the exponent was above the floor, i.e.
    where phi > exp(floor); 0 where floored or padded): ``pointwise`` may keep only phi for backward (the
    chunked kernel does; recorded as plain ops, the in-place clamp_min_ keeps a copy of its input)."""
    return pointwise(exponent, keep, _floored_exp, _floored_exp_slope)


def _floored_exp(exponent: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    exponent = exponent.clamp_min_(EXPONENT_FLOOR)
    if keep is not None:
        exponent = exponent.masked_fill_(~keep, float("-inf"))  # exp -> exactly 0 (exp_ keeps its result)
    return exponent.exp_()


def _floored_exp_slope(phi: torch.Tensor) -> torch.Tensor:
    return phi * (phi > math.exp(EXPONENT_FLOOR))


@dataclass
class PerformerConfig(AttentionConfig):
    """Hyperparameters of ``performer``.

    Attributes:
        num_features: m, number of random features.
        kernel: "softmax" (positive random features, FAVOR+) or "relu".
        eps: added to the denominator.
        seed: seeds the initial features with the layer index (redraws use their own seeds).
        block_size: block length of the chunked kernel's causal form (speed only).
    """

    num_features: int = 256
    kernel: Literal["softmax", "relu"] = "softmax"
    eps: float = 1e-6
    seed: int = 0
    block_size: int = 128

    def validate(self) -> None:
        if self.num_features < 1:
            raise ValueError(f"performer: num_features must be >= 1, got {self.num_features}.")
        if self.kernel not in ("softmax", "relu"):
            raise ValueError(f"performer: kernel must be 'softmax' or 'relu', got {self.kernel!r}.")
        if not self.eps >= 0.0:
            raise ValueError(f"performer: eps must be >= 0, got {self.eps}.")
        if self.block_size < 1:
            raise ValueError(f"performer: block_size must be >= 1, got {self.block_size}.")


def seeded_generator(seed: int, layer_idx: int) -> torch.Generator:
    """A CPU generator seeded by (seed, layer_idx), different for every layer."""
    return torch.Generator().manual_seed((seed * 1_000_003 + layer_idx) % 2**63)


@register_attention("performer")
class PerformerAttention(KernelizedAttentionCore):
    """FAVOR+ with a persistent (m, d) random feature buffer ``projection_matrix``."""

    config_class = PerformerConfig
    # auto: parallel on CUDA, chunked elsewhere; fla (the gpu extra) only when forced, until measured
    kernels = (PARALLEL, CHUNKED, KERNELIZED_FLA)
    capabilities = AttentionCapabilities(
        causal=True, permutation_equivariant=True, cross_attention=True, rotary=ROTATE_FEATURE_MAPS
    )
    paper = "Choromanski et al. 2021, Rethinking Attention with Performers"
    cost = "O(n·m·d)"
    summary = "FAVOR+ positive orthogonal random features, redraw callback"
    small_config = {"num_features": 64, "block_size": 4}
    export_note = "random features: the saved buffer, as in eager mode; one piece: O(n m) features"
    lra_listops = ("Performer", 18.01)
    script_configs = {  # a causal model decodes with the features it was trained on: never redrawn
        "text": {"attention_config": {"num_features": 128}, "training": {"random_state_redraw_steps": 1000}},
        "listops": {
            "attention_config": {"num_features": 128},
            "training": {"random_state_redraw_steps": 100},
        },
        "mqar": {"attention_config": {"num_features": 64}},
        "vision": {"attention_config": {"num_features": 64}, "training": {"random_state_redraw_steps": 1000}},
        "clm": {"attention_config": {"num_features": 64}, "training": {"random_state_redraw_steps": 0}},
        "graph": {  # GraphGPS: graph_sparse along edges plus Performer over all nodes
            "attention_config": {"num_features": 64},
            "model": {"graph_layer_type": "gps", "local_attention_type": "graph_sparse"},
            "training": {"random_state_redraw_steps": 100},
        },
    }
    # float16: 1 / normaliser gradients overflow (see _kernelized). bfloat16 runs: its features are computed
    # in float32 (feature_maps: exp of bfloat16-rounded projections w.x missed float32 by 0.06 at head size
    # 64), the products of the features in bfloat16.
    float32_for = (torch.float16,)

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n m d + 4 n m (d + 1): features W q, W k (m x d each) and the two products with [V, 1]."""
        m = config.num_features
        return 4.0 * n * m * head_dim + 4.0 * n * m * (head_dim + 1)

    def __init__(self, spec: AttentionSpec, config: PerformerConfig | None = None):
        super().__init__(spec, config)
        w = orthogonal_gaussian_features(
            self.config.num_features, self.head_dim, seeded_generator(self.config.seed, spec.layer_idx)
        )
        self.register_buffer("projection_matrix", w.to(torch.empty(0).device), persistent=True)  # (m, d)

    def init_weights(self) -> None:
        self.redraw_features(seeded_generator(self.config.seed, self.spec.layer_idx))

    @torch.no_grad()
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Draw a new W in place (global RNG when ``generator`` is None)."""
        w = orthogonal_gaussian_features(self.config.num_features, self.head_dim, generator)
        self.projection_matrix.copy_(w)

    def resample_random_state(self, seed: int) -> None:
        self.redraw_features(seeded_generator(seed, self.spec.layer_idx))

    @property
    def shifted_features(self) -> bool:
        return self.config.kernel == "softmax"  # exp features take a stabilising shift; relu ones do not

    def feature_maps(self, query, attention_mask, pointwise: Pointwise = plain) -> FeatureMaps:
        """The query (padded rows zeroed), the feature maps and, for the softmax kernel, the keys' largest
        log-features (the stabilising shift: see the module docstring and ``_kernelized``)."""
        m = self.config.num_features
        if attention_mask is not None:  # padded queries may hold anything (even inf); their rows end up 0
            query = query.masked_fill(~attention_mask[:, None, :, None], 0.0)
        relu = self.config.kernel == "relu"
        # Fold scalings into W: W x' = (W d^{-1/4}) x; relu(W x) / sqrt(m) = relu((W / sqrt(m)) x).
        scale = m**-0.5 if relu else self.head_dim**-0.25
        # projections and exp in float32 for half-precision inputs, the features back in the inputs' dtype
        work = accumulate_dtype(query)
        w_t = self.projection_matrix.to(work).t() * scale  # (d, m)
        if relu:
            features = partial(self._relu_features, w_t=w_t)
            return FeatureMaps(query, features, features, m, key_maxima=None)
        log_sqrt_m = 0.5 * math.log(m)  # the 1/sqrt(m) factor, applied inside exp

        def query_features(x: torch.Tensor) -> torch.Tensor:
            # exp(W x' - |x'|^2/2 - shift) with the row's own shift max_f (W x')_f - |x'|^2/2: the
            # |x'|^2/2 terms cancel, and with them a per-row factor that out_i does not depend on.
            proj = x.to(work) @ w_t  # (b, h, c, m)
            proj = proj.sub_(proj.detach().amax(-1, keepdim=True) + log_sqrt_m)
            return floored_exp(proj, None, pointwise).to(x.dtype)

        def key_features(x: torch.Tensor, keep: torch.Tensor | None, shift: torch.Tensor) -> torch.Tensor:
            # exp(W x' - |x'|^2/2 - shift) / sqrt(m); shift (b, h, c | 1, 1) (see _kernelized)
            dtype, x = x.dtype, x.to(work)
            proj = x @ w_t  # (b, h, c, m)
            proj = proj.add_(-(self._half_sq_norm(x) + (shift + log_sqrt_m)))  # add: no negated copy
            return floored_exp(proj, keep, pointwise).to(dtype)  # exactly 0 at padded keys

        def key_maxima(x: torch.Tensor) -> torch.Tensor:
            # max over features f of (W k'_j)_f - |k'_j|^2/2 for each key j: (b, h, c, d) -> (b, h, c)
            x = x.to(work)
            return (x @ w_t).amax(-1) - self._half_sq_norm(x)[..., 0]

        return FeatureMaps(query, query_features, key_features, m, key_maxima)

    def _half_sq_norm(self, x: torch.Tensor) -> torch.Tensor:
        """|x'|^2 / 2 with x' = x d^{-1/4}: (b, h, c, d) -> (b, h, c, 1)."""
        return x.square().sum(-1, keepdim=True) * (0.5 * self.head_dim**-0.5)

    @staticmethod
    def _relu_features(
        x: torch.Tensor, keep: torch.Tensor | None = None, *, w_t: torch.Tensor
    ) -> torch.Tensor:
        """relu(W x / sqrt(m)) + floor, (b, h, c, m), 0 where ``keep`` is False; ``w_t`` is W^T / sqrt(m)."""
        phi = torch.relu(x.to(w_t.dtype) @ w_t) + RELU_FEATURE_FLOOR
        return (phi if keep is None else phi.masked_fill_(~keep, 0.0)).to(x.dtype)
