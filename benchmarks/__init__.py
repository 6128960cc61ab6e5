"""Benchmarks of hf_efficient's attention types. Run each from the repository root as a module:

    python -m benchmarks.attention            # attention cores alone: time, memory, GFLOP/s, error vs exact
    python -m benchmarks.model_step           # a whole training step: tokens/s, MFU, memory, per component
    python -m benchmarks.peers                # ours against third-party implementations of a mechanism
    python -m benchmarks.patterns             # which keys each query draws on (one PNG)
    python -m benchmarks.generation           # causal decoding: time per token and cache size vs context
    python -m benchmarks.serving              # serving engines (eager, compile, ONNX Runtime) vs length
    python -m benchmarks.gpu --out DIR        # one CUDA GPU: every type vs sdpa, bf16 (gpu_check.sh runs it)
    python -m benchmarks.seeds --seeds 0 1 2 --out DIR -- CMD {seed} {output_dir}   # mean ± std over seeds

One-off studies behind numbers the docs quote run as ``python -m benchmarks.studies.<name>``
(:mod:`benchmarks.studies`).

Shared pieces: :mod:`benchmarks.harness` (a fresh process per measured point, memory and time readings,
address-space cap, sgemm peak, machine metadata), :mod:`benchmarks.report` (results.json, summary.md,
plots), :mod:`benchmarks.mechanisms` (which of our types run, read from the registry, and with what
settings), :mod:`benchmarks.flops` (FLOPs of a point from each core's FLOP model) and
:mod:`benchmarks.plugins` (``--plugin MODULE``: types registered outside the package run too).
"""
