"""Our attention types as the benchmarks name and run them, all read from the registry.

Exact attention (the registry's ``full``) runs with two kernels, as ``full_eager`` and ``full_sdpa``;
``full_sdpa`` is the baseline of every speed-up. Every other registered type (plugins' included) runs under
its registry name with its core's ``benchmark_config`` over its defaults (empty for most types), and the sdpa
kernel for any dense sub-block it has.
"""

from __future__ import annotations

import json

EXACT = "full"  # the registry's exact softmax attention
EXACT_KERNELS = ("full_eager", "full_sdpa")
BASELINE = "full_sdpa"  # what speed-ups are measured against


def split_name(name: str) -> tuple[str, str]:
    """Benchmark name -> (attention_type, attn_implementation): ``full_eager`` -> ("full", "eager")."""
    if name.startswith(f"{EXACT}_"):
        return EXACT, name.removeprefix(f"{EXACT}_")
    return name, "sdpa"


def is_exact(name: str) -> bool:
    """Whether a benchmark name is exact attention (``full``, ``full_eager``, ``full_sdpa``): a baseline."""
    return split_name(name)[0] == EXACT


def benchmark_types(modality: str | None = None) -> list[str]:
    """Every registered type (for ``modality``), exact attention as its two kernels first."""
    from hf_efficient.attention import list_attention_types

    return [*EXACT_KERNELS, *(t for t in list_attention_types(modality) if t != EXACT)]


def benchmark_config(name: str) -> dict:
    """The settings a type is benchmarked with: its core's ``benchmark_config`` (none for exact attention
    or a name that is not registered)."""
    from hf_efficient.attention import ATTENTION_REGISTRY

    core = ATTENTION_REGISTRY.get(split_name(name)[0])
    return dict(core.benchmark_config) if core is not None else {}


def bench_configs() -> dict[str, dict]:
    """Every registered type with benchmark settings, for results' metadata."""
    from hf_efficient.attention import ATTENTION_REGISTRY

    return {
        name: dict(core.benchmark_config)
        for name, core in ATTENTION_REGISTRY.items()
        if core.benchmark_config
    }


def resolve(name: str, config_json: str | None = None) -> tuple[str, str, dict]:
    """Benchmark name -> (attention_type, attn_implementation, attention_config): the benchmark settings,
    then ``config_json`` (a --config option) over them; exact attention takes none."""
    attention_type, implementation = split_name(name)
    if attention_type == EXACT:
        return attention_type, implementation, {}
    return attention_type, implementation, {**benchmark_config(name), **json.loads(config_json or "{}")}


def build_model(model_class, name: str, config_json: str | None = None, **fields):
    """A model (``model_class``, e.g. ``EfficientBertForMaskedLM``) of benchmark type ``name``: its config
    class of ``fields`` with the type's attention (:func:`resolve`); (model, (attention_type,
    attn_implementation, attention_config))."""
    attention_type, implementation, attention_config = resolve(name, config_json)
    config = model_class.config_class(
        **fields, attention_type=attention_type, attention_config=attention_config or None
    )
    model = model_class._from_config(config, attn_implementation=implementation)
    return model, (attention_type, implementation, attention_config)
