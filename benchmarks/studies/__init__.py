"""One-off studies: measurements behind numbers the docs quote, kept so those numbers stay regenerable.

Each runs from the repository root as ``python -m benchmarks.studies.<name>``; its docstring says what it
measured and the command of its reference results (``benchmarks/results/reference/<name>/``). They build on
the product benchmarks (``benchmarks.harness``, ``benchmarks.report``, ``benchmarks.step_models``...), never
the other way round.

    python -m benchmarks.studies.graph_scale         # graph node classification up to 200k nodes, PyG peers
    python -m benchmarks.studies.graph_attention     # graph attention settings trained on the graph tasks
    python -m benchmarks.studies.fidelity            # error vs exact attention on MiniLM's real q/k/v
    python -m benchmarks.studies.minilm_conversion   # a pretrained BERT converted to every type, no training
    python -m benchmarks.studies.listops --results runs/listops      # table + plot of train_listops.py runs
    python -m benchmarks.studies.clm_perplexity --results runs/clm   # perplexity of pretrain_clm.py runs
    python -m benchmarks.studies.long_documents run --out runs/long_documents/majority3   # + summarize
    python -m benchmarks.studies.mqar run --types full linear --out runs/mqar   # MQAR grid (Zoology) + table
    python -m benchmarks.studies.rfa_trained_attention MODEL   # a trained RFA model's weights vs its kernel
    python -m benchmarks.studies.modernbert          # ModernBERT-base, ours vs transformers: step and forward
"""
