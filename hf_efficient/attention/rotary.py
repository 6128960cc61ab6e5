"""Rotary positions (RoPE: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding") in
the attention contract: what a call carries (:class:`RotaryPositions`) and the two ways a core carries it.

A model whose positions are rotary (ModernBERT) gives every layer's core the cos and sin of its tokens'
positions (``AttentionInputs.rotary``), computed once per forward and layer kind. R_i rotates each pair of
dimensions (f, f + d/2) of a head vector by the angle p_i theta_f of token i's position p_i (transformers'
``rotate_half`` convention), so that (R_i q_i)^T (R_j k_j) = q_i^T R_(p_j - p_i) k_j depends on the
relative position alone. A core declares how it carries them (``AttentionCapabilities.rotary``):

``ROTATE_QUERIES_AND_KEYS``
    queries and keys are rotated before the core's pattern, once, in ``AttentionCore.forward`` (every kernel
    then sees rotated heads): exact attention, the window (Longformer) and the block (BigBird) types, whose
    patterns pair tokens by index, so every score they form is a score of exact attention with RoPE.
``ROTATE_FEATURE_MAPS``
    the kernelized types (linear, Performer, RFA), as RoFormer does for linear attention (its eq. 19):

        out_i = sum_j (R_i phi(q_i))^T (R_j phi(k_j)) v_j / sum_j phi(q_i)^T phi(k_j)

    the feature maps are rotated in the numerator only (:func:`kernel_sums`), so the denominator
    stays a sum of positive terms. A feature map of m != d features rotates its pairs (f, f + m/2) by the
    head's frequencies in turn (frequency f mod d/2); the non-causal form only.
None
    refused with the core's ``rotary_refusal`` (the types that compress keys over positions: Linformer's
    projections, Nystromformer's landmarks, Transformer-LS's dynamic projections; Reformer's hash buckets).

Shapes: b = batch, h = heads, n = sequence length, d = head_dim, m = features of a feature map.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROTATE_QUERIES_AND_KEYS = "queries_and_keys"
ROTATE_FEATURE_MAPS = "feature_maps"
ROTARY_MODES = (ROTATE_QUERIES_AND_KEYS, ROTATE_FEATURE_MAPS)


def default_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """RoPE's frequencies theta_f = theta^(-2f / d), f < d / 2: (d / 2,) float32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


@dataclass(frozen=True)
class RotaryPositions:
    """The rotation of each token of one call: cos and sin of its angles, in transformers' layout.

    Attributes:
        cos, sin: (b | 1, n, d), each angle twice (dimensions f and f + d/2), in the model's dtype, times a
            rotary type's attention scaling where it has one (YaRN's); what transformers' rotary embedding
            modules return.
    """

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def at(
        cls, positions: torch.Tensor, inverse_frequencies: torch.Tensor, scaling: float = 1.0, dtype=None
    ) -> RotaryPositions:
        """The rotation of tokens at ``positions`` (b | 1, n) by ``inverse_frequencies`` (d / 2,): angles in
        float32, cos and sin times ``scaling``, cast to ``dtype`` (default float32)."""
        angles = positions[..., None].float() * inverse_frequencies.to(positions.device, torch.float)
        angles = torch.cat((angles, angles), dim=-1)  # (b | 1, n, d)
        dtype = dtype or torch.float32
        return cls((angles.cos() * scaling).to(dtype), (angles.sin() * scaling).to(dtype))

    def check(self, shape: tuple[int, ...], name: str) -> None:
        """Raise unless cos and sin suit queries of ``shape`` (b, h, n, d) (shapes only)."""
        b, _, n, d = shape
        for label, table in (("cos", self.cos), ("sin", self.sin)):
            if table.dim() != 3 or table.shape[0] not in (1, b) or tuple(table.shape[1:]) != (n, d):
                raise ValueError(
                    f"{name}: rotary {label} must have shape (batch or 1, seq, head_dim) = ({b} or 1, {n}, "
                    f"{d}) for queries of shape {tuple(shape)}, got {tuple(table.shape)}. Build it for this "
                    "call's positions: RotaryPositions.at(position_ids, inverse_frequencies)."
                )
        if d % 2:
            raise ValueError(f"{name}: rotary positions rotate pairs of dimensions; head_dim {d} is odd.")

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """R_i x_i for heads (b, h, n, d), computed in float32 and cast back (transformers'
        ``apply_rotary_pos_emb``, op for op)."""
        cos, sin = self.cos[:, None], self.sin[:, None]  # (b | 1, 1, n, d)
        wide = x.float()
        return (wide * cos + rotate_half(wide) * sin).to(x.dtype)

    def rotate_features(self, features: torch.Tensor) -> torch.Tensor:
        """R_i phi_i for feature maps (b, h, n, m), m even: pairs (f, f + m/2) turned by the angle of the
        head's frequency f mod d/2, on the unit circle (a rotary type's attention scaling left out: it would
        scale the numerator and not the denominator)."""
        m = features.shape[-1]
        if m % 2:
            raise ValueError(
                f"rotary positions rotate pairs of features; this feature map has an odd number, {m}. Use an "
                "even number of features (Performer's num_features)."
            )
        half = self.cos.shape[-1] // 2
        radius = torch.hypot(self.cos[..., :half].float(), self.sin[..., :half].float())
        turns = -(-(m // 2) // half)  # ceil: the head's frequencies, repeated over the feature pairs
        cos, sin = (
            (t[..., :half].float() / radius).repeat(1, 1, turns)[..., : m // 2] for t in (self.cos, self.sin)
        )
        cos, sin = (
            torch.cat((t, t), dim=-1)[:, None].to(features.dtype) for t in (cos, sin)
        )  # (b|1, 1, n, m)
        return features * cos + rotate_half(features) * sin


def kernel_sums(
    phi_q: torch.Tensor, phi_k: torch.Tensor, value_ones: torch.Tensor, rotary: RotaryPositions | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerator and denominator of non-causal kernelized attention: phi_q phi_k^T V, (b, h, n, d), and
    phi_q phi_k^T 1, (b, h, n, 1); with ``rotary``, RoFormer's eq. 19: (R phi_q) (R phi_k)^T V over the
    plain denominator.

    Args:
        phi_q, phi_k: (b, h, n, m) feature maps of the queries and keys.
        value_ones: (b, h, n, d + 1) the values and a column of ones, both 0 at padded keys (so they enter
            neither sum).
        rotary: the call's rotation, or None.
    """
    d = value_ones.shape[-1] - 1
    if rotary is None:  # [S | z] (b, h, m, d + 1): numerator and denominator in one product
        return (phi_q @ (phi_k.transpose(-1, -2) @ value_ones)).split([d, 1], dim=-1)
    values, ones = value_ones.split([d, 1], dim=-1)
    rotated = rotary.rotate_features(phi_k).transpose(-1, -2) @ values  # (b, h, m, d)
    numerator = rotary.rotate_features(phi_q) @ rotated
    denominator = phi_q @ (phi_k.transpose(-1, -2) @ ones)  # (b, h, n, 1)
    return numerator, denominator


__all__ = [
    "ROTARY_MODES",
    "ROTATE_FEATURE_MAPS",
    "ROTATE_QUERIES_AND_KEYS",
    "RotaryPositions",
    "default_inverse_frequencies",
    "kernel_sums",
    "rotate_half",
]
