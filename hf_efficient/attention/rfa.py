"""Random Feature Attention (Peng et al. 2021, "Random Feature Attention", ICLR).

Random Fourier features (Rahimi & Recht 2007) with w_i ~ N(0, sigma^2 I_d), i = 1..m:

    phi(x) = sqrt(1/m) [sin(w_1 . x), ..., sin(w_m . x), cos(w_1 . x), ..., cos(w_m . x)]
    exp(sigma^2 x . y) ~= exp(sigma^2 |x|^2 / 2 + sigma^2 |y|^2 / 2) phi(x) . phi(y)   (E cos(w . (x - y)))

    non-causal:  out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / phi(q_i) . sum_j phi(k_j)
    causal gate: g_t = sigmoid(w_g . k_t + b_g),  S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T,
                 z_t = g_t z_{t-1} + (1 - g_t) phi(k_t),  out_t = phi(q_t)^T S_t / phi(q_t) . z_t

Queries and keys are l2-normalised before phi, as in the paper, so with one sigma for every dimension the
exp(|x|^2 / 2) factors are equal for all keys and cancel in the ratio: the core approximates
softmax(q^ . k^ * sigma^2) over unit vectors. With the learned per-dimension sigma the target is the
normalised Gaussian kernel exp(-|sigma o (q^ - k^)|^2 / 2) (the key factor exp(-|sigma o k^|^2 / 2) no longer
cancels). Either way the logits span at most about 2 max(sigma)^2, and the sin/cos estimate has an absolute
error of about 1/sqrt(2m) however small the kernel is, so sharp attention needs large sigma and many features
(``benchmarks/studies/rfa_trained_attention.py`` measures both in a trained model).
The reference computes the non-causal form from whole-sequence sums and the causal one as its masked
quadratic form, out = (A o (phi(Q) phi(K)^T)) [V, 1] (then divided), with A_tj = (1 - g_j) prod_{j < l <= t}
g_l = exp(sum_{j < l <= t} log g_l + log(1 - g_j)) for j <= t (sums of log gates: no overflow however small
the gates). :meth:`step` is the same recurrence one token at a time (decoding). Cost O(n m d) time; the
kernel ``"chunked"`` (``kernels.rfa``) computes both forms in O(n d + m d) memory.

Choices and deviations (following the authors' released code where the paper is silent):
- sigma is learned per head and dimension, W = sigma * W~ with W~ ~ N(0, I) fixed (the authors'
  ``reparam_proj``); ``sigma`` sets its initial value (a temperature), ``learn_sigma=False`` freezes it.
  sigma is listed in ``no_weight_decay``: transformers' Trainer would decay it toward 0 (uniform
  attention). Train with :class:`hf_efficient.training.EfficientTrainer` (the scripts do).
- Normalisation is exact (x / max(|x|, 1e-12)); the released code divides by |x| + 1e-3.
- The sin/cos denominator can be zero or negative. It is replaced by max(|den|, eps) (the released
  ``normalize_attn_weights``: ``.abs().clamp(eps)``).
- The paper computes the gate from the layer input x_t; the contract hands the core projected heads only,
  so the gate is computed per head from the key k_t. The gate (RFA-Gate) is causal only, as in the paper:
  its parameters exist only in a core built for a causal model (``AttentionSpec(causal=True)``, a decoder),
  so an encoder holds no parameter it never trains (encoder checkpoints that hold them still load: they are
  ignored). ``gate=False`` gives plain causal RFA. Padded steps leave S, z unchanged (g = 1, no contribution).
- Decoding keeps (S, z) per layer, 2m (d + 1) numbers per head whatever the context.
- ``orthogonal_features=True`` draws each head's W~ in orthogonal blocks with chi_d row norms (as Performer):
  every row is still N(0, I): unbiased, with less variance. Off by default (iid rows, as in the paper).
- W~ is a persistent buffer drawn from (seed, layer_idx); the paper redraws per training step from a pool:
  here :meth:`resample_random_state` redraws it when the training loop asks (or never: the scripts'
  ``--random_state_redraw_steps 0``). A model trained on one draw is tied to it: never redraw after training.
- Rotary positions (RoPE): the non-causal form rotates its features as RoFormer's eq. 19 (``rotary``).
- Attention-probability dropout has no counterpart (no probabilities are formed) and is not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import ROTATE_FEATURE_MAPS, AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec
from .cache import RecurrentStateLayer
from .config import AttentionConfig
from .inputs import AttentionInputs
from .kernels.fla import RFA_FLA
from .kernels.rfa import CHUNKED
from .registry import register_attention
from .rotary import kernel_sums
from .utils import orthogonal_gaussian_features


@dataclass
class RFAConfig(AttentionConfig):
    """Hyperparameters of :class:`RandomFeatureAttention`.

    Attributes:
        num_features: m, random vectors per head (2m features: sin and cos).
        sigma: initial standard deviation of the random vectors (softmax temperature sigma^2).
        learn_sigma: learn sigma per head and dimension (the authors' reparameterisation).
        gate: use the learned recency gate in the causal form (RFA-Gate); built in causal models only.
        gate_bias_init: initial b_g; sigmoid(2) = 0.88 keeps about 8 tokens of memory at the start.
        eps: floor of |denominator|.
        causal_chunk: block length of the chunked kernel's causal form (speed only; no effect on the maths).
        seed: seed of the random vectors, combined with the layer index.
        orthogonal_features: draw the random vectors of each head in orthogonal blocks (lower variance).
    """

    num_features: int = 128
    sigma: float = 1.0
    learn_sigma: bool = True
    gate: bool = True
    gate_bias_init: float = 2.0
    eps: float = 1e-3
    causal_chunk: int = 64
    seed: int = 0
    orthogonal_features: bool = False

    def validate(self) -> None:
        for name in ("num_features", "causal_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"rfa: {name} must be >= 1, got {getattr(self, name)}")
        if self.sigma <= 0:
            raise ValueError(f"rfa: sigma must be > 0, got {self.sigma}")
        if self.eps <= 0:
            raise ValueError(f"rfa: eps must be > 0, got {self.eps}")


_KEPT = {"random_state_redraw_steps": 0}  # the features drawn at initialisation, kept for the whole run


@register_attention("rfa")
class RandomFeatureAttention(AttentionCore):
    config_class = RFAConfig
    kernels = (CHUNKED, RFA_FLA)  # fla (the gpu extra): only when forced, until measured
    capabilities = AttentionCapabilities(
        causal=True, permutation_equivariant=True, cross_attention=True, rotary=ROTATE_FEATURE_MAPS
    )
    paper = "Peng et al. 2021, Random Feature Attention (ICLR)"
    cost = "O(n·m·d)"
    summary = "random Fourier features, gated causal form"
    small_config = {"num_features": 16, "causal_chunk": 8}
    export_note = "the saved random features; the bidirectional form (the gated causal one does not trace)"
    script_configs = {  # vision and clm keep one draw all run (a model trained on a draw is tied to it)
        "text": {"attention_config": {"num_features": 64}, "training": {"random_state_redraw_steps": 1000}},
        "listops": {"attention_config": {"num_features": 64}, "training": {"random_state_redraw_steps": 100}},
        "mqar": {"attention_config": {"num_features": 64}},
        "vision": {"attention_config": {"num_features": 128, "orthogonal_features": True}, "training": _KEPT},
        "clm": {"attention_config": {"num_features": 64, "gate": True}, "training": _KEPT},
    }

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n m d + 8 n m (d + 1): W q, W k, then 2m sin/cos features times [V, 1] (non-causal form)."""
        m = config.num_features
        return 4.0 * n * m * head_dim + 8.0 * n * m * (head_dim + 1)

    no_weight_decay = ("sigma",)  # the temperature: decayed, it drifts toward uniform attention

    def __init__(self, spec: AttentionSpec, config: RFAConfig | None = None):
        super().__init__(spec, config)
        h, m, d = spec.num_heads, self.config.num_features, spec.head_dim
        self.register_buffer("random_weights", torch.empty(h, m, d))  # W~ ~ N(0, I), (h, m, d)
        self.sigma = nn.Parameter(torch.empty(h, 1, d)) if self.config.learn_sigma else None
        # The gate is used by the causal form only: it exists in a causal model (a decoder), never in an
        # encoder, where it would be a parameter without gradient (DDP would need find_unused_parameters).
        self.uses_gate = self.config.gate and spec.causal
        if self.uses_gate:
            self.gate_weight = nn.Parameter(torch.empty(h, d))  # w_g per head
            self.gate_bias = nn.Parameter(torch.empty(h))  # b_g per head
        self.init_weights()

    def init_weights(self) -> None:
        self.resample_random_state(self.config.seed)
        with torch.no_grad():
            if self.sigma is not None:
                self.sigma.fill_(self.config.sigma)
            if self.uses_gate:
                self.gate_weight.normal_(0.0, self.head_dim**-0.5)
                self.gate_bias.fill_(self.config.gate_bias_init)

    def unbuilt_parameter_names(self) -> tuple[str, ...]:
        """The gate's parameters when this core has no gate: a checkpoint of a causal model holds them, and
        encoder checkpoints saved before the gate was limited to causal models do too."""
        return () if self.uses_gate else ("gate_weight", "gate_bias")

    def resample_random_state(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + self.spec.layer_idx)
        h, m, d = self.random_weights.shape
        if self.config.orthogonal_features:
            draw = torch.stack([orthogonal_gaussian_features(m, d, generator) for _ in range(h)])  # (h, m, d)
        else:
            draw = torch.randn(h, m, d, generator=generator)
        with torch.no_grad():
            self.random_weights.copy_(draw)

    def scales(self) -> torch.Tensor:
        """sigma, (h, 1, d): learned, or the configured constant."""
        if self.sigma is not None:
            return self.sigma
        return self.random_weights.new_full((self.num_heads, 1, self.head_dim), self.config.sigma)

    def projection(self) -> torch.Tensor:
        """W = sigma * W~, (h, m, d): row i of head h is w_i ~ N(0, diag(sigma_h^2))."""
        return self.scales() * self.random_weights

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """phi(x / |x|) = sqrt(1/m) [sin(W x^), cos(W x^)]: (b, h, n, d) -> (b, h, n, 2m)."""
        weight = self.projection().to(x.dtype)  # (h, m, d)
        u = (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)) @ weight.transpose(1, 2)  # (b, h, n, m)
        return torch.cat([u.sin(), u.cos()], -1) * self.config.num_features**-0.5

    def log_gates(self, key: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(log g_t, log(1 - g_t)), each (b, h, n); padded steps get g = 1 (the state is kept)."""
        if not self.uses_gate:
            zero = key.new_zeros(key.shape[:3])
            return zero, zero
        logits = (key * self.gate_weight[:, None]).sum(-1) + self.gate_bias[:, None]  # (b, h, n)
        log_g, log_keep = F.logsigmoid(logits), F.logsigmoid(-logits)
        if mask is not None:
            log_g = log_g.masked_fill(~mask[:, None], 0.0)
        return log_g, log_keep

    def reference(self, query, key, value, inputs: AttentionInputs, state=None, return_state=False):
        """The maths in one piece; the causal form from ``state`` ([S | z] (b, h, 2m, d + 1) or None) and,
        with ``return_state``, (AttentionOutput, the [S | z] after the last token) (:class:`Kernel`)."""
        mask = inputs.attention_mask
        if inputs.is_causal:
            out, sums = self.causal_in_float32(self._causal, query, key, value, mask, state)
            return (AttentionOutput(out, None), sums) if return_state else AttentionOutput(out, None)
        keep = None if mask is None else mask[:, None, :, None]  # (b, 1, n, 1)
        v_one = F.pad(value, (0, 1), value=1.0)  # (b, h, n, d + 1): the ones accumulate z beside S
        v_one = v_one if keep is None else v_one.masked_fill(~keep, 0.0)  # padded keys: no contribution
        phi_q, phi_k = self.feature_map(query), self.feature_map(key)  # (b, h, n, 2m)
        numerator, denominator = kernel_sums(phi_q, phi_k, v_one, inputs.rotary)  # [S | z]: (b, h, 2m, d + 1)
        return AttentionOutput(numerator / denominator.abs().clamp_min(self.config.eps), None)

    def _causal(self, query, key, value, mask, state=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The gated causal form as its masked quadratic form, from ``state`` ([S | z] (b, h, 2m, d + 1) of
        earlier tokens, or None). Returns (output (b, h, n, d), the [S | z] after the last token)."""
        n, d = query.shape[2:]
        value = F.pad(value, (0, 1), value=1.0)  # (b, h, n, d + 1)
        if mask is not None:  # padded steps: no contribution, and g = 1 (log_gates)
            keep = mask[:, None, :, None]  # (b, 1, n, 1)
            key, value = key.masked_fill(~keep, 0.0), value.masked_fill(~keep, 0.0)
        log_g, log_keep = self.log_gates(key, mask)  # (b, h, n)
        phi_q, phi_k = self.feature_map(query), self.feature_map(key)  # (b, h, n, 2m)
        # sum_{j < l <= t} log g_l for j <= t: log g_l placed at rows l > j, summed down the rows up to t
        below = torch.ones(n, n, dtype=torch.bool, device=query.device).tril(-1)  # (t, j): t > j
        between = log_g[..., :, None].expand(*log_g.shape, n).masked_fill(~below, 0.0).cumsum(-2)
        decay = between.masked_fill(~torch.ones_like(below).tril(), -math.inf)  # (b, h, n, n)
        weights = (decay + log_keep[..., None, :]).exp()  # A_tj = (1 - g_j) prod_{j < l <= t} g_l
        result = ((phi_q @ phi_k.transpose(-1, -2)) * weights) @ value  # (b, h, n, d + 1)
        sums = (phi_k * weights[..., -1, :, None]).transpose(-1, -2) @ value  # (b, h, 2m, d + 1)
        if state is not None:  # the earlier tokens, decayed by every gate since: prod_{l <= t} g_l
            through = log_g.cumsum(-1).exp()[..., None]  # (b, h, n, 1)
            result = result + through * (phi_q @ state)
            sums = sums + through[..., -1:, :] * state
        return result[..., :d] / result[..., d:].abs().clamp_min(self.config.eps), sums

    def new_cache_layer(self) -> RecurrentStateLayer:
        return RecurrentStateLayer()

    def _attend_cached(self, query, key, value, inputs: AttentionInputs, layer) -> AttentionOutput:
        """One token through :meth:`step`, several (the prompt) through the causal form of the kernel chosen
        for the call (else the reference); the layer keeps (S (b, h, 2m, d), z (b, h, 2m)) in float32 (or
        wider)."""
        mask, n = inputs.attention_mask, query.shape[2]
        if n == 1:
            real = None if mask is None else mask[:, 0]
            out, state = self.step(query[:, :, 0], key[:, :, 0], value[:, :, 0], layer.state, real)
            result = AttentionOutput(out[:, :, None], None)
        else:
            s_z = layer.state
            start = None if s_z is None else torch.cat([s_z[0], s_z[1][..., None]], -1)  # [S | z]
            result, sums = self._attend(query, key, value, inputs, state=start, return_state=True)
            state = (sums[..., :-1], sums[..., -1])  # sums: (b, h, 2m, d + 1)
        layer.store(state, n)
        return result

    def causal_in_float32(
        self, form, query, key, value, mask, state=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A causal form ``form(query, key, value, mask, state) -> (output, [S | z])``; the gated recurrence
        (cumulative log gates, decayed states, normaliser) runs in float32 for half-precision inputs:
        products of many gates leave float16's range and bfloat16's precision."""
        self._check_gate_exists()
        work = torch.promote_types(query.dtype, torch.float32)
        out, state = form(query.to(work), key.to(work), value.to(work), mask, state)
        return out.to(query.dtype), state

    def _check_gate_exists(self) -> None:
        if self.config.gate and not self.uses_gate:
            raise ValueError(
                "rfa: gate=True, but this core was built for a bidirectional model (AttentionSpec("
                "causal=False)), which has no recency gate. Build it for a causal model (AttentionSpec("
                "causal=True); EfficientBertConfig(is_decoder=True)) or set gate=False for plain causal RFA."
            )

    def step(self, query, key, value, state=None, real=None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """One token of the causal recurrence (decoding), the RNN form of the causal core: query, key,
        value (b, h, d) of the current token; state (S (b, h, 2m, d), z (b, h, 2m)) after the previous token,
        or None at the start; real (b,) bool, False where this token is padding (its state passes on
        unchanged). Returns (out (b, h, d), new state), in float32 for half-precision inputs (as the
        parallel form)."""
        self._check_gate_exists()
        dtype, work = query.dtype, torch.promote_types(query.dtype, torch.float32)
        query, key, value = query.to(work), key.to(work), value.to(work)
        if real is not None:  # a padded step adds nothing and (g = 1) keeps the state as it is
            key, value = (t.masked_fill(~real[:, None, None], 0.0) for t in (key, value))
        phi_q = self.feature_map(query[:, :, None])[:, :, 0]  # (b, h, 2m)
        phi_k = self.feature_map(key[:, :, None])[:, :, 0]  # (b, h, 2m)
        if real is not None:
            phi_k = phi_k.masked_fill(~real[:, None, None], 0.0)
        if state is None:
            state = (query.new_zeros(*phi_k.shape, value.shape[-1]), torch.zeros_like(phi_k))
        s, z = state
        log_g, log_keep = self.log_gates(key[:, :, None], None if real is None else real[:, None])
        g, keep = log_g.exp(), log_keep.exp()  # (b, h, 1)
        s = g[..., None] * s + (keep * phi_k)[..., None] * value[:, :, None]  # (b, h, 2m, d)
        z = g * z + keep * phi_k  # (b, h, 2m)
        num = (phi_q[:, :, None] @ s)[:, :, 0]  # (b, h, d)
        den = (phi_q * z).sum(-1, keepdim=True)  # (b, h, 1)
        return (num / den.abs().clamp_min(self.config.eps)).to(dtype), (s, z)
