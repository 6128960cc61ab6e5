"""The mechanisms' kernels: faster ways to compute what a mechanism's reference computes.

A mechanism's file (``hf_efficient/attention/<name>.py``) holds its maths in one piece
(:meth:`~hf_efficient.attention.base.AttentionCore.reference`); the modules here hold its fast paths, one
module per mechanism (bigbird, full, long_short, longformer, reformer_lsh, rfa, window_2d) or per engine
several mechanisms share (:mod:`.flex`: FlexAttention block masks; :mod:`.kernelized`: the chunked
linear-attention engine of linear and performer; :mod:`.edges`: the CSR products of the edge cores;
:mod:`.fla`: flash-linear-attention's kernels for the causal forms of linear, performer and rfa, from the
optional ``gpu`` extra).
Each fast path is a :class:`~hf_efficient.attention.base.Kernel` that the mechanism lists in its
``kernels``; ``attention_config["implementation"]`` chooses among them ("auto", "reference" or a kernel's
name). Kernels import shared helpers, never a mechanism's module: the mechanism imports its kernels.
"""
