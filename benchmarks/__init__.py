"""Benchmarks of hf_efficient's attention types. Run each from the repository root as a module:

    python -m benchmarks.attention            # attention cores alone: time, memory, GFLOP/s, error vs exact
    python -m benchmarks.text_model           # a whole EfficientBert training step: tokens/s, memory
    python -m benchmarks.graph_scale          # graph node classification up to 200k nodes
    python -m benchmarks.peers                # ours against third-party implementations of a mechanism
    python -m benchmarks.patterns             # which keys each query draws on (one PNG)
    python -m benchmarks.fidelity             # error vs exact attention on MiniLM's real queries/keys/values
    python -m benchmarks.minilm_conversion    # a pretrained BERT converted to every type, no training
    python -m benchmarks.listops --results runs/listops   # table + plot of scripts/train_listops.py runs
    python -m benchmarks.generation           # causal decoding: time per token and cache size vs context
    python -m benchmarks.clm_perplexity --results runs/clm   # perplexity table of pretrain_clm.py runs
    python -m benchmarks.rfa_trained_attention MODEL      # a trained RFA model's weights vs its kernel
    python -m benchmarks.gpu --out DIR        # one CUDA GPU: every type vs sdpa, bf16 (gpu_check.sh runs it)
    python -m benchmarks.seeds --seeds 0 1 2 --out DIR -- CMD {seed} {output_dir}   # mean ± std over seeds

Shared pieces: :mod:`benchmarks.harness` (a fresh process per measured point, memory and time readings,
address-space cap, sgemm peak, machine metadata), :mod:`benchmarks.report` (results.json, summary.md,
plots), :mod:`benchmarks.mechanisms` (which of our types run, and with what settings, read from the
registry), :mod:`benchmarks.flops` (FLOPs of a point from each core's FLOP model) and
:mod:`benchmarks.plugins` (``--plugin MODULE``: types registered outside the package run too).
"""
