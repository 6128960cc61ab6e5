"""Node classification on one large graph: time and peak memory of a training step against node count.

A small ``EfficientGraphForNodeClassification`` (hidden 64, 2 layers, 4 heads) runs forward + backward of
the node-classification loss on synthetic graphs (uniformly random directed edges, ``--edges_per_node``
per node, fixed seed; a self loop added to every node) with one graph per batch. Its setups (``--types``)
come from the registry:

- every graph type that attends along edges (``graph_sparse``, ``multi_hop``, ...): O(E).
- ``gps_performer``: GraphGPS layers, the default local attention over edges (``graph_sparse``) + global
  ``performer``, O(E + n m).
- ``full_sdpa`` / ``full_eager``: exact attention over all node pairs, O(n^2) time; the eager kernel also
  O(n^2) memory. At large n these fail (address-space cap) or time out, and that is recorded as the status.

Each (type, n) point runs in a fresh Python process under an address-space cap (``--memory_cap_gib``,
``benchmarks.harness``), so an over-large point fails fast instead of swapping and no allocator state leaks
between points.

    python -m benchmarks.graph_scale --threads 1                      # 1k..200k nodes, 10 edges per node
    python -m benchmarks.graph_scale --preset smoke --out /tmp/gs      # seconds
    python -m benchmarks.graph_scale --types graph_sparse --nodes 200000 --edges_per_node 10

Writes ``<out>/results.json``, ``<out>/summary.md`` and ``<out>/graph_scale.png`` (time and memory against
node count, log-log). Memory: ``peak_mib`` is the whole process's peak resident set (VmHWM: interpreter,
torch, data, model, collation and the step); ``step_mib`` is the training step's peak above the resident
size just before it (VmHWM reset there), i.e. what forward + backward need beyond inputs and parameters.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

from benchmarks.harness import (
    ProcessOptions,
    add_point_arguments,
    launch,
    machine_meta,
    measure,
    set_up_torch,
    sweep,
)
from benchmarks.mechanisms import EXACT_KERNELS, is_exact, split_name
from benchmarks.plugins import parse_args_with_plugins
from benchmarks.report import Panel, markdown_table, ok_points, plot_loglog, status_cell, write_report

MODEL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
GPS = {"gps_performer": {"graph_layer_type": "gps", "attention_type": "performer"}}
PRESETS = {
    "full": dict(nodes=[1000, 10000, 50000, 200000], repeats=2, warmup=1, edges_per_node=10),
    "smoke": dict(nodes=[64], repeats=1, warmup=0, edges_per_node=4),
}
POINT_SETTINGS = "edges_per_node feature_dim num_labels seed threads warmup repeats".split()


def setups() -> dict[str, tuple[dict, str | None]]:
    """Benchmark name -> (EfficientGraphConfig overrides, attn_implementation or None for the default): the
    registry's graph types that attend along edges, GraphGPS, exact attention with both kernels."""
    from hf_efficient.attention import get_attention_class, list_attention_types

    edge_types = [
        t for t in list_attention_types("graph") if get_attention_class(t).capabilities.requires_edges
    ]
    table = {t: ({"attention_type": t}, None) for t in edge_types}
    table.update({name: (overrides, None) for name, overrides in GPS.items()})
    for name in EXACT_KERNELS:
        attention_type, implementation = split_name(name)
        table[name] = ({"attention_type": attention_type}, implementation)
    return table


def synthetic_graph(num_nodes: int, num_edges: int, feature_dim: int, num_labels: int, seed: int) -> dict:
    """An OGB-style record: uniformly random directed edges, Gaussian node features, random node labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {
        "edge_index": rng.integers(0, num_nodes, size=(2, num_edges), dtype=np.int64),  # (2, E)
        "node_feat": rng.standard_normal((num_nodes, feature_dim), dtype=np.float32),  # (N, F)
        "num_nodes": num_nodes,
        "y": rng.integers(0, num_labels, size=num_nodes, dtype=np.int64),  # (N,)
    }


def run_point(point: argparse.Namespace) -> dict:
    """Point function: one (type, node count) training step, in this process."""
    import hf_efficient
    from hf_efficient.models.graph import (
        EfficientGraphConfig,
        EfficientGraphForNodeClassification,
        GraphCollator,
    )

    set_up_torch(point.threads)
    overrides, implementation = setups()[point.type]
    config = EfficientGraphConfig(
        **MODEL, **overrides, node_feature_dim=point.feature_dim, num_labels=point.num_labels
    )
    if implementation is not None:
        config._attn_implementation = implementation
    model = EfficientGraphForNodeClassification(config).train()
    n, num_edges = point.nodes, point.nodes * point.edges_per_node
    record = synthetic_graph(n, num_edges, point.feature_dim, point.num_labels, point.seed)
    start = time.perf_counter()
    collator = GraphCollator.for_config(config, label_level="node", add_self_loops=config.needs_edges())
    batch = collator([record])
    collate_s = time.perf_counter() - start
    if not config.needs_edges():
        batch.pop("edge_index")  # dense attention: the structure is not read
    del record

    def step():
        loss = model(**batch).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    timing = measure(step, point.warmup, point.repeats)
    return {
        "type": point.type,
        "nodes": n,
        "edges": num_edges,
        "attended_edges": int(batch["edge_index"].shape[1]) if "edge_index" in batch else None,
        **timing.fields(),
        "collate_s": collate_s,
        "peak_mib": timing.process_peak_mib,  # here the whole process's (set-up included)
        "step_mib": timing.peak_mib,
        "hf_efficient": hf_efficient.__version__,
    }


def _in_setup_order(records: list[dict]) -> list[str]:
    """The records' types, in the order of :func:`setups` (unknown names last)."""
    order = list(setups())
    types = {r["type"] for r in records}
    return sorted(types, key=lambda t: order.index(t) if t in order else len(order))


def summarize(records: list[dict]) -> str:
    """Markdown table: seconds per training step / process peak MiB, per type and node count."""
    nodes = sorted({r["nodes"] for r in records})
    edges = {r["nodes"]: r["edges"] for r in records}
    by_point = {(r["type"], r["nodes"]): r for r in records}

    def step_cell(r: dict) -> str:
        return f"{r['median_s']:.3g} / {r['peak_mib']:.0f} / {r['step_mib']:.0f}"

    header = [f"n={n:,}" + (f", E={edges[n]:,}" if n in edges else "") for n in nodes]
    rows = [
        [t, *(status_cell(by_point.get((t, n)), step_cell) for n in nodes)] for t in _in_setup_order(records)
    ]
    lines = ["### forward + backward: seconds / peak MiB (process) / step MiB (above inputs)", ""]
    return "\n".join(lines + markdown_table(["type", *header], rows))


def plot(records: list[dict], path: Path) -> None:
    """Seconds per step and peak MiB against node count, log-log; where a type stopped, and why."""
    types = _in_setup_order(records)
    panels = []
    for key, label in (("median_s", "seconds per step"), ("peak_mib", "peak MiB")):
        lines = {t: ok_points(records, "nodes", key, type=t) for t in types}
        notes = []
        for t in types:
            failed = [r for r in records if r["type"] == t and r["status"].split()[0] in ("timeout", "out")]
            if lines[t] and failed:
                why = failed[0]["status"].split(":")[0].split(" (")[0]
                notes.append((f"{t}: {why} at n={failed[0]['nodes']:,}", lines[t][-1]))
        title = f"{label}, node classification forward + backward"
        exact = {t for t in types if is_exact(t)}
        panels.append(Panel(title, "nodes n (one graph per batch)", label, lines, exact, notes))
    plot_loglog(path, [panels], panel_size=(6.5, 5))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--types", nargs="+", choices=list(setups()), help="default: all of them")
    parser.add_argument("--nodes", nargs="+", type=int)
    parser.add_argument("--edges_per_node", type=int, help="random directed edges per node (+ a self loop)")
    parser.add_argument("--feature_dim", type=int, default=16)
    parser.add_argument("--num_labels", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/graph_scale"))
    parser.add_argument(
        "--append", action="store_true", help="add to <out>/results.json (same machine and settings)"
    )
    add_point_arguments(parser, threads=1, memory_cap_gib=12.0, timeout=300.0, warmup=None)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_args_with_plugins(make_parser, argv)
    preset = PRESETS[args.preset]
    for name in ("nodes", "edges_per_node", "warmup", "repeats"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    args.types = args.types or list(setups())
    options = ProcessOptions.from_args(args)
    settings = {name: getattr(args, name) for name in POINT_SETTINGS}

    def run(base: dict) -> dict:
        point = {**settings, "type": base["type"], "nodes": base["nodes"]}
        return launch(run_point, point, base, options)

    bases = [
        {"type": t, "nodes": n, "edges": n * args.edges_per_node}
        for t in args.types
        for n in sorted(args.nodes)
    ]
    records = sweep(
        bases, run, lambda p: p["type"], desc="graph scale benchmark", skipped="skipped (failed at smaller n)"
    )
    table = setups()
    run_meta = {
        "command": "python -m benchmarks.graph_scale " + " ".join(sys.argv[1:] if argv is None else argv),
        "types": {t: table[t][0] | {"attn_implementation": table[t][1] or "sdpa"} for t in args.types},
        "nodes": sorted(args.nodes),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "memory_cap_gib": args.memory_cap_gib,
        "timeout_s": args.timeout,
        "plugins": args.plugin,
    }
    meta = {
        **machine_meta(args.threads),
        "model": MODEL,
        "edges_per_node": args.edges_per_node,
        "self_loops": "one added to every node lacking one, for types that attend along edges",
        "feature_dim": args.feature_dim,
        "num_labels": args.num_labels,
        "dtype": "float32",
        "device": "cpu",
        "runs": [run_meta],
    }
    results_path = args.out / "results.json"
    if args.append and results_path.exists():  # keep earlier runs' points that this run did not measure
        earlier = json.loads(results_path.read_text())
        new = {(r["type"], r["nodes"]) for r in records}
        records = [r for r in earlier["records"] if (r["type"], r["nodes"]) not in new] + records
        meta["runs"] = earlier["meta"]["runs"] + [run_meta]
    summary = summarize(records) + "\n\nCommands (threads, warmup + repeats per run):\n\n"
    summary += "\n".join(f"- `{r['command']}` ({r['warmup']} + {r['repeats']})" for r in meta["runs"])
    results = {"meta": meta, "records": records}
    write_report(args.out, results, summary, {"graph_scale.png": functools.partial(plot, records)})
    return results


if __name__ == "__main__":
    main()
