"""What a trained RFA image model's attention is: its random-feature weights against the kernel they estimate.

RFA (``hf_efficient.attention.rfa``) estimates the normalised Gaussian kernel over unit queries and keys,

    p_ij = k(q_i, k_j) / sum_l k(q_i, k_l),   k(q, k) = exp(-|sigma o (q^ - k^)|^2 / 2)

(softmax(sigma^2 q^ . k^) when sigma is the same in every dimension), with m sin/cos features whose kernel
estimate phi(q^) . phi(k^) has an absolute error of about 1/sqrt(2m), however small k is. This script runs
a trained ``EfficientViTForImageClassification`` with ``rfa`` attention on Fashion-MNIST test images,
captures every layer's queries and keys with a forward hook on the core, and reports per layer:

    exact entropy      mean entropy (nats) of the rows p_i of the exact kernel (uniform: log n)
    exact max weight   mean over rows of max_j p_ij
    estimated max      the same for the weights the core uses, phi(q^) . phi(k^) / |sum_l phi(q^) . phi(k^_l)|
    negative share     share of the estimates phi(q^) . phi(k^) below 0 (the exact kernel is positive)
    L1 distance        mean over rows of sum_j |estimated - exact|  (0: same weights, 2: disjoint)

    python -m benchmarks.studies.rfa_trained_attention runs/fm18s/rfa --out rfa_trained_attention.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from transformers import AutoImageProcessor

from hf_efficient import EfficientViTForImageClassification
from hf_efficient.attention.rfa import RandomFeatureAttention
from hf_efficient.data import load_fashion_mnist


def entropy(weights: torch.Tensor) -> torch.Tensor:
    """Row entropies of (..., n) probability rows."""
    return -torch.special.xlogy(weights, weights).sum(-1)


def layer_statistics(core: RandomFeatureAttention, query: torch.Tensor, key: torch.Tensor) -> dict:
    """Statistics of one core's weights on its captured (b, h, n, d) queries and keys."""
    estimate = core.feature_map(query) @ core.feature_map(key).transpose(-1, -2)  # (b, h, n, n)
    sigma = core.scales()  # (h, 1, d)
    q_scaled = torch.nn.functional.normalize(query, dim=-1) * sigma  # sigma o q^
    k_scaled = torch.nn.functional.normalize(key, dim=-1) * sigma
    exact = torch.softmax(-torch.cdist(q_scaled, k_scaled).square() / 2, dim=-1)  # (b, h, n, n)
    estimated = estimate / estimate.sum(-1, keepdim=True).abs().clamp_min(core.config.eps)
    return {
        "exact_entropy": entropy(exact).mean().item(),
        "uniform_entropy": math.log(query.shape[2]),
        "exact_max_weight": exact.amax(-1).mean().item(),
        "estimated_max_weight": estimated.amax(-1).mean().item(),
        "negative_share": (estimate < 0).float().mean().item(),
        "l1_distance": (estimated - exact).abs().sum(-1).mean().item(),
        "sigma_mean": sigma.mean().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="a saved EfficientViTForImageClassification with rfa attention")
    parser.add_argument("--num_images", type=int, default=256, help="the first N Fashion-MNIST test images")
    parser.add_argument("--out", type=Path, help="write the statistics here as JSON")
    args = parser.parse_args()

    model = EfficientViTForImageClassification.from_pretrained(args.model).eval()
    cores = [module for module in model.modules() if isinstance(module, RandomFeatureAttention)]
    if not cores:
        raise ValueError(
            f"{args.model} has no rfa attention core (attention_type {model.config.attention_type!r}): "
            "this script reads RFA's random features; pass a model trained with --attention_type rfa."
        )
    images = list(load_fashion_mnist()["test"].select(range(args.num_images))["image"])
    pixels = AutoImageProcessor.from_pretrained(args.model)(images, return_tensors="pt")["pixel_values"]

    captured = {}  # core -> (query, key), each (b, h, n, d)
    hooks = [
        core.register_forward_hook(lambda core, inputs, output: captured.update({core: inputs[:2]}))
        for core in cores
    ]
    with torch.no_grad():
        model(pixel_values=pixels)
        layers = [layer_statistics(core, *captured[core]) for core in cores]
    for hook in hooks:
        hook.remove()

    result = {"model": str(args.model), "num_images": args.num_images, "layers": layers}
    for index, stats in enumerate(layers):
        print(f"layer {index}: " + ", ".join(f"{name} {value:.3f}" for name, value in stats.items()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
