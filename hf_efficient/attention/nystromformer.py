"""Nystromformer: a Nystrom-based approximation of softmax attention (Xiong et al. 2021, arXiv:2102.03902).

With m landmarks Q~, K~ (segment means of the queries and keys):

    F = softmax(Q K~^T / sqrt(d))     (n x m)
    A = softmax(Q~ K~^T / sqrt(d))    (m x m)
    B = softmax(Q~ K^T / sqrt(d))     (m x n)
    Attention(Q, K, V) ~= F pinv(A) (B V)  [+ depthwise convolution of V over the sequence, optional]

pinv(A) is the paper's iterative Moore-Penrose approximation, Z0 = A^T / (||A||_1 ||A||_inf) and
Z <- Z (13 I - A Z (15 I - A Z (7 I - A Z))) / 4 for ``pinv_iterations`` steps, as transformers'
NystromformerSelfAttention. Cost O(n m d) time and O(n) memory: F and B are computed by torch's fused
``scaled_dot_product_attention`` (n queries over m landmark keys with values pinv(A) B V; m landmark
queries over n keys), so no n x m matrix is stored.

Deviations from the paper / transformers (which need n divisible by m and pad to a fixed length):
    * Segments are defined on each example's real tokens: real token number r (0-based, counted over
      the real tokens only) of an example with L real tokens belongs to segment floor(r m / L). With n
      divisible by m and no padding this is the paper's n/m contiguous tokens per segment; otherwise the
      segments differ in size by at most one token. Padding never enters a landmark mean, and appending
      padding leaves every segment unchanged (padding invariance).
    * When L < m some segments are empty. Their landmarks are excluded (masked out of the softmax over
      landmarks in F and A, and their rows of A zeroed), which makes pinv(A) block-diagonal with a zero
      block, so they change nothing and cannot create NaN.
    * Padded keys are masked in B (as transformers); padded queries/keys/values are zeroed first.
    * Attention dropout (``spec.dropout``) is applied to F during training; transformers applies none.
    * Z0 is normalised per (batch, head) matrix, as the paper. transformers' default ("original")
      divides by the largest column sum over the whole batch and all heads, which couples the examples
      of a batch; its other option ("exact") is ours.
    * A and pinv(A) are computed in at least float32 (they are m x m; the iteration is unstable in half).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec
from .config import AttentionConfig
from .dropout import sdpa
from .inputs import AttentionInputs, is_tracing
from .registry import register_attention


@dataclass
class NystromformerConfig(AttentionConfig):
    """Hyperparameters of :class:`NystromformerAttention`.

    Attributes:
        num_landmarks: m, the number of landmarks (segments) per example.
        pinv_iterations: iterations of the Moore-Penrose approximation of pinv(A).
        conv_kernel_size: odd length of the per-head depthwise convolution over values added to the
            output (the paper's skip connection); None disables it.
    """

    num_landmarks: int = 64
    pinv_iterations: int = 6
    conv_kernel_size: int | None = None

    def validate(self) -> None:
        if self.num_landmarks < 1:
            raise ValueError(f"num_landmarks must be >= 1, got {self.num_landmarks}.")
        if self.pinv_iterations < 1:
            raise ValueError(f"pinv_iterations must be >= 1, got {self.pinv_iterations}.")
        if self.conv_kernel_size is not None and (
            self.conv_kernel_size < 1 or self.conv_kernel_size % 2 == 0
        ):
            raise ValueError(
                f"conv_kernel_size must be an odd positive int or None, got {self.conv_kernel_size}."
            )


def segment_means(
    tensors: tuple[torch.Tensor, ...], mask: torch.Tensor | None, num_segments: int
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """Landmarks: means of the real tokens of each segment (see the module docstring for segments).

    Args:
        tensors: (b, h, n, d) tensors whose padded positions are already zero.
        mask: (b, n) bool, True = real token, or None.
        num_segments: m.

    Returns:
        The (b, h, m, d) means of each tensor, and a (b, m) bool mask of non-empty segments (None when
        every segment of every example holds a token; always the mask while tracing).
    """
    b, h, n, d = tensors[0].shape
    m = num_segments
    if mask is None and n % m == 0:
        # Paper case: n/m contiguous tokens per segment. A sum, then the division on the (b, h, m, d) means:
        # mean's backward writes grad / (n/m) over all n tokens and copies it back to (b, h, n, d); a sum's
        # is an expanded view, materialised once (the same values, one copy fewer).
        return tuple(x.reshape(b, h, m, n // m, d).sum(-2) / (n // m) for x in tensors), None  # (b, h, m, d)
    if mask is None:
        mask = torch.ones(b, n, dtype=torch.bool, device=tensors[0].device)
    lengths = mask.sum(-1, keepdim=True)  # (b, 1) real tokens per example
    rank = mask.cumsum(-1) - 1  # (b, n) index of each real token among the real tokens
    segment = torch.div(rank * m, lengths, rounding_mode="floor")  # (b, n)
    landmark_ids = torch.arange(m, device=mask.device)[None, :, None]  # (1, m, 1)
    member = (segment[:, None, :] == landmark_ids) & mask[:, None, :]  # (b, m, n)
    counts = member.sum(-1)  # (b, m)
    weights = member.to(tensors[0].dtype) / counts.clamp(min=1)[..., None].to(tensors[0].dtype)  # (b, m, n)
    means = tuple(torch.einsum("bmn,bhnd->bhmd", weights, x) for x in tensors)  # (b, h, m, d)
    nonempty = counts > 0
    return means, nonempty if is_tracing() or not bool(nonempty.all()) else None


def iterative_pinv(matrix: torch.Tensor, iterations: int) -> torch.Tensor:
    """The paper's Moore-Penrose approximation of pinv(A) for a batch of (m, m) matrices A.

    Z0 = A^T / (||A||_1 ||A||_inf) (max column sum times max row sum, per matrix), then
    Z <- 1/4 Z (13 I - A Z (15 I - A Z (7 I - A Z))).
    """
    max_col_sum = matrix.abs().sum(-2).amax(-1)  # (b, h)
    max_row_sum = matrix.abs().sum(-1).amax(-1)  # (b, h)
    z = matrix.transpose(-1, -2) / (max_col_sum * max_row_sum)[..., None, None]  # (b, h, m, m)
    # Batched as (b h, m, m), each "c I - X Y" one baddbmm: 5 ops per iteration instead of 11 (on a GPU
    # these small products are bound by the host's per-op work).
    shape, m = z.shape, z.shape[-1]
    a, z = matrix.reshape(-1, m, m), z.reshape(-1, m, m)
    identity = torch.eye(m, dtype=matrix.dtype, device=matrix.device)
    seven, fifteen, thirteen = 7 * identity, 15 * identity, 13 * identity
    for _ in range(iterations):
        az = torch.bmm(a, z)
        inner = torch.baddbmm(fifteen, az, seven - az, alpha=-1)  # 15 I - AZ (7 I - AZ)
        inner = torch.baddbmm(thirteen, az, inner, alpha=-1)  # 13 I - AZ (...)
        z = torch.baddbmm(z, z, inner, beta=0, alpha=0.25)  # 1/4 Z (...)
    return z.reshape(shape)


@register_attention("nystromformer")
class NystromformerAttention(AttentionCore):
    config_class = NystromformerConfig
    cross_attention_refusal = (
        "its landmarks average the queries as well as the keys, so a decoder token's cross-attention "
        "would depend on the later tokens (not causal) and change at every decoding step"
    )
    rotary_refusal = (
        "its landmarks are means of the queries and of the keys over segments of the sequence, and a mean "
        "of vectors turned by different positions has no position of its own to carry"
    )
    capabilities = AttentionCapabilities()
    paper = "Xiong et al. 2021, Nystromformer: A Nystrom-Based Algorithm for Approximating Self-Attention"
    cost = "O(n·m)"
    summary = "segment-mean landmarks, iterative pseudo-inverse"
    small_config = {"num_landmarks": 6, "conv_kernel_size": 3}
    export_note = "landmarks of each example's real tokens, computed in the graph"
    script_configs = {  # vision: 5 tokens a landmark; mqar: the default 64 is exact at 64 tokens
        "text": {"attention_config": {"num_landmarks": 64, "pinv_iterations": 6}},
        "listops": {"attention_config": {"num_landmarks": 64, "pinv_iterations": 6}},
        "mqar": {"attention_config": {"num_landmarks": 8}},
        "vision": {"attention_config": {"num_landmarks": 10, "pinv_iterations": 6}},
    }

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """8 n m d + 4 m^2 d + 8 m^3 T (+ 2 n d c): B V and F (...), A, pinv(A) B V, T pinv steps, conv c."""
        m, d = min(config.num_landmarks, n), head_dim
        flops = 8.0 * n * m * d + 4.0 * m * m * d + 8.0 * m**3 * config.pinv_iterations
        return flops + (2.0 * n * d * config.conv_kernel_size if config.conv_kernel_size else 0.0)

    def __init__(self, spec: AttentionSpec, config: NystromformerConfig | None = None):
        super().__init__(spec, config)
        size = self.config.conv_kernel_size
        # Named and shaped as transformers' NystromformerSelfAttention.conv: one (size x 1) kernel per head
        # over the (seq x head_dim) "image" of that head's values.
        self.conv = (
            nn.Conv2d(
                self.num_heads,
                self.num_heads,
                (size, 1),
                padding=(size // 2, 0),
                groups=self.num_heads,
                bias=False,
            )
            if size is not None
            else None
        )

    def init_weights(self) -> None:
        """Re-initialise the convolution (PyTorch's default Conv2d initialisation)."""
        if self.conv is not None:
            self.conv.reset_parameters()

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """F pinv(A) (B V) [+ conv(V)] with segment-mean landmarks (the module docstring's equations)."""
        attention_mask = inputs.attention_mask
        if attention_mask is not None:
            padded = ~attention_mask[:, None, :, None]  # (b, 1, n, 1)
            query, key, value = (x.masked_fill(padded, 0.0) for x in (query, key, value))
        (query_landmarks, key_landmarks), nonempty = segment_means(
            (query, key), attention_mask, self.config.num_landmarks
        )  # (b, h, m, d) each; nonempty (b, m) or None

        # A = softmax(Q~ K~^T / sqrt(d)) over non-empty landmarks; rows of empty landmarks are zero.
        work_dtype = torch.promote_types(query.dtype, torch.float32)
        scores = (
            query_landmarks.to(work_dtype) @ key_landmarks.to(work_dtype).transpose(-1, -2)
        ) * self.scaling
        if nonempty is not None:
            scores = scores.masked_fill(~nonempty[:, None, None, :], float("-inf"))  # (b, h, m, m)
        kernel = torch.softmax(scores, dim=-1)
        if nonempty is not None:
            kernel = kernel.masked_fill(~nonempty[:, None, :, None], 0.0)
        kernel_pinv = iterative_pinv(kernel, self.config.pinv_iterations)  # (b, h, m, m)

        # B V = softmax(Q~ K^T / sqrt(d)) V over the real keys.
        key_mask = None if attention_mask is None else attention_mask[:, None, None, :]  # (b, 1, 1, n)
        landmark_values = F.scaled_dot_product_attention(
            query_landmarks, key, value, attn_mask=key_mask, scale=self.scaling
        )  # (b, h, m, d)
        mixed_values = (kernel_pinv @ landmark_values.to(work_dtype)).to(value.dtype)  # (b, h, m, d)

        # F (pinv(A) B V) = softmax(Q K~^T / sqrt(d)) (pinv(A) B V) over the non-empty landmarks.
        landmark_mask = None if nonempty is None else nonempty[:, None, None, :]  # (b, 1, 1, m)
        dropout = self.spec.dropout if self.training else 0.0
        output = sdpa(
            query, key_landmarks, mixed_values, attn_mask=landmark_mask, dropout_p=dropout, scale=self.scaling
        )  # (b, h, n, d)
        if self.conv is not None:
            # (b, h, n, d): padded values are zero, like the border; the weight in the inputs' dtype
            weight = self.conv.weight.to(value.dtype)
            output = output + F.conv2d(value, weight, padding=self.conv.padding, groups=self.num_heads)
        return AttentionOutput(output, None)
