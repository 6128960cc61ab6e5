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
(``benchmarks/rfa_trained_attention.py`` measures both in a trained model).
Cost O(n m d) time, O(n d + m d) memory. The non-causal form runs in chunks of the sequence with a
hand-written backward that recomputes the features, so no (n x 2m) tensor is stored or built in one piece.
The causal form runs in blocks of ``causal_chunk`` tokens: masked quadratic form inside a block, decays in
log space (exp(L_t - L_j) <= 1 with L the cumulative log gate, so no overflow however small the gates),
the state carried across blocks; groups of blocks are recomputed in backward (activation checkpointing).
:meth:`step` is the same recurrence one token at a time (decoding), tested equal to the parallel form.

Choices and deviations (following the authors' released code where the paper is silent):
- sigma is learned per head and dimension, W = sigma * W~ with W~ ~ N(0, I) fixed (the authors'
  ``reparam_proj``); ``sigma`` sets its initial value (a temperature), ``learn_sigma=False`` freezes it.
  sigma is listed in ``no_weight_decay``: transformers' Trainer would decay it toward 0 (uniform attention);
  with weight decay 0.05 over 18,000 Fashion-MNIST steps it ended at 0.64-0.78 of its start, 0.64 being
  the decay alone. Train with :class:`hf_efficient.training.EfficientTrainer` (the scripts do).
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
  every row is still N(0, I), so the estimate stays unbiased, and its variance drops. Measured on 50 unit
  queries/keys, d = 32, m = 64: relative output error against softmax(sigma^2 q^ . k^) 0.026 vs 0.079 (iid) at
  sigma = 0.7, 0.10 vs 0.19 at sigma = 1. Off by default (the rows are iid, as in the paper).
- W~ is a persistent buffer drawn from (seed, layer_idx); the paper redraws per training step from a
  pool: here :meth:`resample_random_state` redraws it, called explicitly by the training loop. Kept for the
  whole run instead (the scripts' ``--random_state_redraw_steps 0``), 128 features reached 88.78% on
  Fashion-MNIST (exact attention 88.03%); 64 features 86.20% kept, 85.70% redrawn every 1,000 steps. A model
  trained on one draw is tied to it (75% with another draw of its 128 features): never redraw after training.
- Attention-probability dropout has no counterpart (no probabilities are formed) and is not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .base import AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec
from .cache import RecurrentStateLayer
from .config import AttentionConfig
from .inputs import AttentionInputs, is_tracing
from .registry import register_attention
from .utils import (
    extend_padding_mask,
    feature_chunk_budget,
    orthogonal_gaussian_features,
    pad_to_multiple,
    row_slices,
    rows_per_chunk,
)

_FEATURE_CHUNK_BYTES = 4 * 2**20  # per-chunk (b, h, rows, 2m) features (measured: 4 MiB <= 8, 16 MiB)


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
        causal_chunk: block length of the parallel causal form (speed only; no effect on the maths).
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


def _unit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., d) -> (x / |x|, |x| floored) with the floor of F.normalize."""
    norm = x.norm(dim=-1, keepdim=True).clamp_min(1e-12)  # (..., 1)
    return x / norm, norm


def _sin_cos(unit: torch.Tensor, weight_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin(W x), cos(W x)) without the sqrt(1/m), each (b, h, c, m) and contiguous.

    Kept as two tensors rather than one [sin, cos] row: writing halves of rows in place ran 5x slower
    with two threads here, and a concatenation costs a copy.
    """
    u = torch.matmul(unit, weight_t)  # (b, h, c, d) @ (h, d, m) -> (b, h, c, m)
    return u.sin(), u.cos_()


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(b, h, c, f) -> (b * h, c, f) for batched matmuls."""
    return x.reshape(-1, *x.shape[2:])


def _values_and_ones(value, mask, piece):
    """[v, 1] of keys in ``piece``, (b * h, c, d + 1); zero rows (ones column included) where padded.

    The column of ones accumulates z beside S, so one matmul gives numerator and denominator, and zero
    rows remove padded keys from both without masking the features.
    """
    v_one = F.pad(value[:, :, piece], (0, 1), value=1.0)  # (b, h, c, d + 1)
    return _flat(v_one if mask is None else v_one.masked_fill(~mask[:, None, piece, None], 0.0))


def _non_causal_whole(query, key, value, base, sigma, mask, eps: float) -> torch.Tensor:
    """What :class:`_NonCausalRFA` computes, in one piece with plain autograd (for traced graphs, which
    cannot loop over chunks): (b, h, n, d). Memory O(n m) per head for the features."""
    b, h, n, d = query.shape
    m = base.shape[1]
    weight_t = (sigma * base).transpose(1, 2)  # (h, d, m)

    def sin_cos(x):  # not _sin_cos: its in-place cos would break plain autograd
        u = _unit(x)[0] @ weight_t  # (b, h, n, m)
        return u.sin(), u.cos()

    sin_k, cos_k = sin_cos(key)  # (b, h, n, m) each
    v_one = _values_and_ones(value, mask, slice(None))  # (b * h, n, d + 1)
    state_sin = torch.bmm(_flat(sin_k).transpose(1, 2), v_one) / m  # (b * h, m, d + 1)
    state_cos = torch.bmm(_flat(cos_k).transpose(1, 2), v_one) / m
    sin_q, cos_q = sin_cos(query)
    result = (torch.bmm(_flat(sin_q), state_sin) + torch.bmm(_flat(cos_q), state_cos)).view(b, h, n, d + 1)
    return result[..., :d] / result[..., d:].abs().clamp_min(eps)


class _NonCausalRFA(torch.autograd.Function):
    """Chunked non-causal RFA; backward recomputes the features chunk by chunk (memory O(n d)).

    The state is kept as two halves, S_sin and S_cos = (1/m) sum_j {sin, cos}(W k^_j) [v_j, 1]^T, each
    (b * h, m, d + 1); phi(q)^T [S | z] = sin(W q^) S_sin + cos(W q^) S_cos.
    """

    @staticmethod
    def forward(ctx, query, key, value, base, sigma, mask, eps: float):
        b, h, n, d = query.shape
        m = base.shape[1]
        weight_t = (sigma * base).transpose(1, 2)  # (h, d, m): W^T with W = sigma * W~
        budget = feature_chunk_budget(_FEATURE_CHUNK_BYTES, query.device)
        rows = rows_per_chunk(b * h * 2 * m * query.element_size(), n, budget)
        state_sin, state_cos = (query.new_zeros(b * h, m, d + 1) for _ in range(2))
        for piece in row_slices(n, rows):
            sin_k, cos_k = _sin_cos(_unit(key[:, :, piece])[0], weight_t)  # (b, h, c, m) each
            v_one = _values_and_ones(value, mask, piece)  # (b * h, c, d + 1)
            state_sin.baddbmm_(_flat(sin_k).transpose(1, 2), v_one)
            state_cos.baddbmm_(_flat(cos_k).transpose(1, 2), v_one)
        state_sin.div_(m), state_cos.div_(m)
        # same memory layout as the query: with heads split off (b, n, h, d) projections, merging heads
        # back afterwards is a free view, and the gradients below need no copy either
        out, den = torch.empty_like(query), query.new_empty(b, h, n)
        for piece in row_slices(n, rows):
            sin_q, cos_q = _sin_cos(_unit(query[:, :, piece])[0], weight_t)
            result = torch.bmm(_flat(sin_q), state_sin).baddbmm_(_flat(cos_q), state_cos)  # (b*h, c, d+1)
            result = result.view(b, h, -1, d + 1)  # (b, h, c, d + 1)
            den[:, :, piece] = result[..., d]
            torch.div(result[..., :d], result[..., d:].abs().clamp_min(eps), out=out[:, :, piece])
        ctx.save_for_backward(query, key, value, base, sigma, mask, state_sin, state_cos, out, den)
        ctx.eps, ctx.rows = eps, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, base, sigma, mask, state_sin, state_cos, out, den = ctx.saved_tensors
        b, h, n, d = query.shape
        m, rows, eps = base.shape[1], ctx.rows, ctx.eps
        weight_t = (sigma * base).transpose(1, 2)  # (h, d, m)
        grad_q, grad_k, grad_v = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
        grad_sigma = sigma.new_zeros(b, h, 1, d) if ctx.needs_input_grad[4] else None
        grad_sin, grad_cos = (query.new_zeros(b * h, m, d + 1) for _ in range(2))  # d loss / d (m * state)

        def through_features(grad_of_sin, grad_of_cos, sin, cos, unit, norm):
            # d sin(u) / du = cos(u), d cos(u) / du = -sin(u)
            grad_u = grad_of_sin.view_as(sin).mul_(cos).addcmul_(grad_of_cos.view_as(sin), sin, value=-1.0)
            # u = (x^ * sigma) @ W~^T: with t = grad_u @ W~, d/dx^ = t * sigma and d/dsigma = sum x^ * t
            grad_unit = grad_u @ base  # (b, h, c, d)
            if grad_sigma is not None:
                grad_sigma.add_((grad_unit * unit).sum(2, keepdim=True))
            grad_unit.mul_(sigma)  # through x -> x / |x|: (g - x^ (x^ . g)) / |x|
            return grad_unit.sub_(unit * (unit * grad_unit).sum(-1, keepdim=True)).div_(norm)

        for piece in row_slices(n, rows):
            unit, norm = _unit(query[:, :, piece])  # (b, h, c, d), (b, h, c, 1)
            sin_q, cos_q = _sin_cos(unit, weight_t)  # (b, h, c, m) each
            den_c = den[:, :, piece, None]  # (b, h, c, 1)
            grad_result = grad_out.new_empty(*unit.shape[:-1], d + 1)  # d loss / d [numerator, denominator]
            torch.div(grad_out[:, :, piece], den_c.abs().clamp_min(eps), out=grad_result[..., :d])
            grad_den = (grad_result[..., :d] * out[:, :, piece]).sum(-1, keepdim=True)  # (b, h, c, 1)
            grad_result[..., d:] = grad_den.mul_(-den_c.sign() * (den_c.abs() > eps))
            grad_result = _flat(grad_result)  # (b * h, c, d + 1)
            grad_sin.baddbmm_(_flat(sin_q).transpose(1, 2), grad_result)
            grad_cos.baddbmm_(_flat(cos_q).transpose(1, 2), grad_result)
            grad_of_sin = grad_result @ state_sin.transpose(1, 2)  # (b * h, c, m)
            grad_of_cos = grad_result @ state_cos.transpose(1, 2)
            grad_q[:, :, piece] = through_features(grad_of_sin, grad_of_cos, sin_q, cos_q, unit, norm)
        grad_sin.div_(m), grad_cos.div_(m)
        for piece in row_slices(n, rows):
            unit, norm = _unit(key[:, :, piece])
            sin_k, cos_k = _sin_cos(unit, weight_t)
            grad_value = torch.bmm(_flat(sin_k), grad_sin[..., :d]).baddbmm_(_flat(cos_k), grad_cos[..., :d])
            grad_v[:, :, piece] = grad_value.view(b, h, -1, d)
            v_one = _values_and_ones(value, mask, piece)  # zero rows where padded: no key gradient there
            grad_of_sin, grad_of_cos = v_one @ grad_sin.transpose(1, 2), v_one @ grad_cos.transpose(1, 2)
            grad_k[:, :, piece] = through_features(grad_of_sin, grad_of_cos, sin_k, cos_k, unit, norm)
        if mask is not None:
            grad_v.masked_fill_(~mask[:, None, :, None], 0.0)
        return grad_q, grad_k, grad_v, None, None if grad_sigma is None else grad_sigma.sum(0), None, None


@register_attention("rfa")
class RandomFeatureAttention(AttentionCore):
    config_class = RFAConfig
    capabilities = AttentionCapabilities(causal=True, permutation_equivariant=True)
    paper = "Peng et al. 2021, Random Feature Attention (ICLR)"
    cost = "O(n·m·d)"
    summary = "random Fourier features, gated causal form"
    small_config = {"num_features": 16, "causal_chunk": 8}

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
        u = _unit(x)[0] @ weight.transpose(1, 2)  # (b, h, n, m)
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

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        attention_mask = inputs.attention_mask
        if inputs.is_causal:
            out, _ = self._causal_in_float32(query, key, value, attention_mask)
            return AttentionOutput(out, None)
        base, sigma = self.random_weights.to(query.dtype), self.scales().to(query.dtype)
        attend = _non_causal_whole if is_tracing() else _NonCausalRFA.apply
        out = attend(query, key, value, base, sigma, attention_mask, self.config.eps)
        return AttentionOutput(out, None)

    def new_cache_layer(self) -> RecurrentStateLayer:
        return RecurrentStateLayer()

    def _attend_cached(self, query, key, value, inputs: AttentionInputs, layer) -> AttentionOutput:
        """One token through :meth:`step`, several (the prompt) through the parallel causal form; the layer
        keeps (S (b, h, 2m, d), z (b, h, 2m)) in float32 (or wider)."""
        mask, n = inputs.attention_mask, query.shape[2]
        if n == 1:
            real = None if mask is None else mask[:, 0]
            out, state = self.step(query[:, :, 0], key[:, :, 0], value[:, :, 0], layer.state, real)
            out = out[:, :, None]
        else:
            start = (
                None if layer.state is None else torch.cat([layer.state[0], layer.state[1][..., None]], -1)
            )
            out, sums = self._causal_in_float32(query, key, value, mask, start)  # sums (b, h, 2m, d + 1)
            state = (sums[..., :-1], sums[..., -1])
        layer.store(state, n)
        return AttentionOutput(out, None)

    def _causal_in_float32(self, query, key, value, mask, state=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The parallel causal form; the gated recurrence (cumulative log gates, decayed states, normaliser)
        runs in float32 for half-precision inputs: products of many gates leave float16's range and
        bfloat16's precision. Returns (output, [S | z] after the last token)."""
        self._check_gate_exists()
        work = torch.promote_types(query.dtype, torch.float32)
        out, state = self._causal(query.to(work), key.to(work), value.to(work), mask, state)
        return out.to(query.dtype), state

    def _check_gate_exists(self) -> None:
        if self.config.gate and not self.uses_gate:
            raise ValueError(
                "rfa: gate=True, but this core was built for a bidirectional model (AttentionSpec("
                "causal=False)), which has no recency gate. Build it for a causal model (AttentionSpec("
                "causal=True); EfficientBertConfig(is_decoder=True)) or set gate=False for plain causal RFA."
            )

    def _causal(self, query, key, value, mask, state=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks of ``causal_chunk`` tokens, batched over a group of blocks; state carried across blocks,
        starting from ``state`` ([S | z] (b, h, 2m, d + 1) of earlier tokens, or None). Returns (output, the
        [S | z] after the last token)."""
        if is_tracing():
            raise ValueError(
                "rfa: the causal (gated) form cannot be traced by torch.export / torch.compile: its state is "
                "carried from block to block by a Python loop whose length follows n. The bidirectional form "
                "(is_causal=False, what the encoders use) traces."
            )
        b, h, n, d = query.shape
        size, m2 = min(self.config.causal_chunk, n), 2 * self.config.num_features
        mask = extend_padding_mask(mask, b, n, size, query.device)
        query, key, value = (pad_to_multiple(t, size) for t in (query, key, value))  # (b, h, N, d)
        value = F.pad(value, (0, 1), value=1.0)  # (b, h, N, d + 1): ones accumulate z beside S
        if mask is not None:
            keep = mask[:, None, :, None]  # (b, 1, N, 1)
            key, value = key.masked_fill(~keep, 0.0), value.masked_fill(~keep, 0.0)  # padded: no contribution
        log_g, log_keep = self.log_gates(key, mask)  # (b, h, N); padded steps (the block's tail too): g = 1
        tril = torch.ones(size, size, dtype=torch.bool, device=query.device).tril()
        per_token = b * h * query.element_size() * (4 * m2 + 4 * size + 2 * m2 * (d + 1) // size)
        blocks = max(1, rows_per_chunk(per_token, query.shape[2]) // size)  # blocks per group
        if state is None:
            state = query.new_zeros(b, h, m2, d + 1)  # [S | z] before the current group
        state = state.to(query.dtype)
        # split (not slice): in backward each piece's gradient is joined once, not zero-padded per group
        pieces = zip(
            *(t.split(blocks * size, dim=2) for t in (query, key, value, log_g, log_keep)), strict=True
        )
        # each group is recomputed in backward (checkpoint): autograd keeps O(n d) instead of all features
        recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, log_g))
        outputs = []
        for part in pieces:
            if recompute:
                out, state = checkpoint(self._causal_group, state, *part, tril, use_reentrant=False)
            else:
                out, state = self._causal_group(state, *part, tril)
            outputs.append(out)
        return torch.cat(outputs, dim=2)[:, :, :n], state

    def _causal_group(self, state, q_part, k_part, v_part, log_g_part, log_keep_part, tril):
        """One group of g blocks of c tokens: outputs (b, h, g * c, d) and the [S | z] state after it."""
        (b, h, rows, d), size = q_part.shape, tril.shape[0]
        g, m2 = rows // size, state.shape[2]
        phi_q = self.feature_map(q_part).view(b, h, g, size, m2)  # (b, h, g, c, 2m)
        phi_k = self.feature_map(k_part).view(b, h, g, size, m2)  # (b, h, g, c, 2m)
        v_one = v_part.reshape(b, h, g, size, d + 1)  # (b, h, g, c, d + 1)
        cum = log_g_part.reshape(b, h, g, size).cumsum(-1)  # L_t within each block
        keep_log = log_keep_part.reshape(b, h, g, size)  # log(1 - g_j)
        # weight of key j at query t: (1 - g_j) prod_{j < l <= t} g_l = exp(L_t - L_j + log(1 - g_j))
        logits = cum[..., :, None] - cum[..., None, :] + keep_log[..., None, :]  # (b, h, g, c, c)
        scores = (phi_q @ phi_k.transpose(-1, -2)) * logits.masked_fill(~tril, -math.inf).exp()
        tail = (cum[..., -1:] - cum + keep_log).exp()[..., None]  # (b, h, g, c, 1): weight at block end
        local = (phi_k * tail).transpose(-1, -2) @ v_one  # (b, h, g, 2m, d + 1): each block's own state
        through = cum[..., -1].exp()[..., None, None]  # (b, h, g, 1, 1): decay across a whole block
        before = []
        # states at block starts: a short scan over small tensors (unbind: one stack in backward)
        for decay, own in zip(through.unbind(2), local.unbind(2), strict=True):
            before.append(state)
            state = decay * state + own
        before = torch.stack(before, 2)  # (b, h, g, 2m, d + 1)
        result = scores @ v_one + cum.exp()[..., None] * (phi_q @ before)  # (b, h, g, c, d + 1)
        out = result[..., :d] / result[..., d:].abs().clamp_min(self.config.eps)
        return out.reshape(b, h, g * size, d), state  # (b, h, g * c, d)

    def step(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor] | None = None,
        real: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One token of the causal recurrence (decoding), the RNN form of the causal core.

        Args:
            query, key, value: (b, h, d) heads of the current token.
            state: (S (b, h, 2m, d), z (b, h, 2m)) after the previous token, or None at the start.
            real: (b,) bool, False where this token is padding: its state is passed on unchanged.

        Returns:
            (out (b, h, d), new state), computed in float32 for half-precision inputs (as the parallel form).
        """
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
