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
- peers from PyG (pure-Python torch_geometric, its scatter/gather path): ``pyg_transformer_conv``
  (``TransformerConv``, the same scaled dot-product attention over edges as ``graph_sparse``) and
  ``pyg_gat_conv`` (``GATConv``, as ``gat``) in place of each layer's projections and core, so everything
  else in the model (embeddings, feed-forward, LayerNorm, head) is the same.

Per point also: the time per attended edge, and the attention module alone (layer 0's projections + core,
or the PyG layer) forward + backward on the same graph, with its achieved bandwidth: the bytes its edge
kernels must move (the core's ``edge_traffic_bytes``; a peer counts as the type it stands in for) over its
time. The machine's bandwidth is measured in the same run (``bandwidth`` in results.json): a 1 GiB copy
(stream) and a gather of random 256-byte rows from a 1 GiB table (the access pattern of edge kernels on a
graph without locality).

Allocator (``--allocator``): glibc hands every allocation above 32 MiB back to the system when freed and
page-faults it in again on the next use, a cost per byte paid only by tensors above that size, i.e. only on
large graphs (measured: a fresh 51 MB tensor costs ~20 ms of page faults, a 2M-edge training step ~40% of
its time). ``keep`` (the default) turns that off in each point's process, as ``MALLOC_MMAP_MAX_=0
MALLOC_TRIM_THRESHOLD_=2147483647`` would (docs/graphs.md); ``glibc`` keeps glibc's defaults.

Each (type, n) point runs in a fresh Python process under an address-space cap (``--memory_cap_gib``,
``benchmarks.harness``), so an over-large point fails fast instead of swapping and no allocator state leaks
between points.

    python -m benchmarks.studies.graph_scale --threads 1                  # 1k..200k nodes, 10 edges per node
    python -m benchmarks.studies.graph_scale --preset smoke --out /tmp/gs  # seconds
    python -m benchmarks.studies.graph_scale --types graph_sparse --nodes 200000 --edges_per_node 10
    python -m benchmarks.studies.graph_scale --types graph_sparse gat pyg_transformer_conv pyg_gat_conv \
        --nodes 10000 50000 200000 --allocator glibc                       # glibc's defaults

Reference results: ``benchmarks/results/reference/graph_scale*/``, each with the command that regenerates it
in ``benchmarks/results/reference/README.md`` (docs/graphs.md quotes them).

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

import torch

from benchmarks.harness import (
    ProcessOptions,
    add_allocator_argument,
    add_point_arguments,
    launch,
    machine_meta,
    measure,
    measure_bandwidth,
    set_up_torch,
    sweep,
    use_allocator,
)
from benchmarks.mechanisms import EXACT_KERNELS, is_exact, split_name
from benchmarks.plugins import parse_args_with_plugins
from benchmarks.report import Panel, ok_points, plot_loglog, status_cell, write_report
from benchmarks.step_models import synthetic_graph
from hf_efficient.markdown import markdown_table

MODEL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
GPS = {"gps_performer": {"graph_layer_type": "gps", "attention_type": "performer"}}
# PyG peers: benchmark name -> (our type they stand in for, torch_geometric.nn layer)
PEERS = {"pyg_transformer_conv": ("graph_sparse", "TransformerConv"), "pyg_gat_conv": ("gat", "GATConv")}
PRESETS = {
    "full": dict(nodes=[1000, 10000, 50000, 200000], repeats=2, warmup=1, edges_per_node=10),
    "smoke": dict(nodes=[64], repeats=1, warmup=0, edges_per_node=4),
}
POINT_SETTINGS = "edges_per_node feature_dim num_labels seed threads warmup repeats allocator".split()


def setups() -> dict[str, tuple[dict, str | None]]:
    """Benchmark name -> (EfficientGraphConfig overrides, attn_implementation or None for the default): the
    registry's graph types that attend along edges, GraphGPS, exact attention with both kernels."""
    from hf_efficient.attention import get_attention_class, list_attention_types

    edge_types = [
        t for t in list_attention_types("graph") if get_attention_class(t).capabilities.requires_edges
    ]
    table = {t: ({"attention_type": t}, None) for t in edge_types}
    table.update({name: ({"attention_type": ours}, None) for name, (ours, _) in PEERS.items()})
    table.update({name: (overrides, None) for name, overrides in GPS.items()})
    for name in EXACT_KERNELS:
        attention_type, implementation = split_name(name)
        table[name] = ({"attention_type": attention_type}, implementation)
    return table


class PygAttention(torch.nn.Module):
    """A torch_geometric attention layer in place of an encoder layer's projections + core: the same
    ``(hidden (b, n, D), inputs) -> (context (b, n, D), None)`` as ``EfficientSelfAttention``, its edges the
    inputs' (flattened positions, as PyG's). ``core`` is the class of the type it stands in for: the encoder
    layer reads its capabilities (it attends along edges) to hand it the edges."""

    def __init__(self, layer: torch.nn.Module, stands_for: type):
        super().__init__()
        self.layer = layer
        self.core = stands_for

    def forward(self, hidden_states, inputs):
        b, n, hidden = hidden_states.shape
        out = self.layer(hidden_states.reshape(b * n, hidden), inputs.edges.edge_index)  # (b n, D)
        return out.view(b, n, hidden), None


def pyg_layer(name: str, hidden: int, heads: int) -> torch.nn.Module:
    """The PyG layer of a peer at the model's sizes: heads of hidden / heads channels, concatenated; no root
    weight (TransformerConv's skip is the block's residual); GATConv adds self loops as ``gat`` does."""
    import torch_geometric.nn as pyg

    _, layer = PEERS[name]
    if layer == "TransformerConv":
        return pyg.TransformerConv(hidden, hidden // heads, heads=heads, root_weight=False)
    return getattr(pyg, layer)(hidden, hidden // heads, heads=heads)


def attention_module_point(model, batch: dict, point: argparse.Namespace) -> dict:
    """Layer 0's attention module alone (projections + core, or the PyG layer), forward + backward on the
    batch's graph, and its achieved bandwidth under the core's traffic model."""
    from hf_efficient.attention import AttentionInputs, GraphEdges

    config = model.config
    module = model.graph.encoder.layer[0].attention.self
    n, hidden = batch["node_feat"].shape[1], config.hidden_size
    states = torch.randn(1, n, hidden, requires_grad=True)
    inputs = AttentionInputs(edges=GraphEdges(batch["edge_index"])).prepare(1, n)
    grad = torch.randn(1, n, hidden)

    def step():
        context, _ = module(states, inputs)
        context.backward(grad)

    timing = measure(step, point.warmup, point.repeats)
    if isinstance(module, PygAttention):  # a peer moves at least what the type it stands in for would
        core_class, core_config = module.core, module.core.config_class()
    else:
        core_class, core_config = type(module.core), module.core.config
    num_edges = int(batch["edge_index"].shape[1])
    traffic = core_class.edge_traffic_bytes(num_edges, hidden, config.num_attention_heads, core_config)
    return {
        "attention_s": timing.median_s,
        "attention_gbps": traffic / timing.median_s / 1e9,
        "traffic_gb": traffic / 1e9,
    }


def run_point(point: argparse.Namespace) -> dict:
    """Point function: one (type, node count) training step, in this process."""
    import hf_efficient
    from hf_efficient.attention import get_attention_class
    from hf_efficient.models.graph import (
        EfficientGraphConfig,
        EfficientGraphForNodeClassification,
        GraphCollator,
    )

    use_allocator(point)
    set_up_torch(point.threads)
    overrides, implementation = setups()[point.type]
    config = EfficientGraphConfig(
        **MODEL, **overrides, node_feature_dim=point.feature_dim, num_labels=point.num_labels
    )
    if implementation is not None:
        config._attn_implementation = implementation
    model = EfficientGraphForNodeClassification(config).train()
    if point.type in PEERS:
        for layer in model.graph.encoder.layer:
            layer.attention.self = PygAttention(
                pyg_layer(point.type, MODEL["hidden_size"], MODEL["num_attention_heads"]),
                get_attention_class(config.attention_type),
            )
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
    attended = int(batch["edge_index"].shape[1]) if "edge_index" in batch else None
    over_edges = get_attention_class(config.attention_type).capabilities.edges and attended is not None
    attention = attention_module_point(model, batch, point) if over_edges and point.type not in GPS else {}
    return {
        "type": point.type,
        "nodes": n,
        "edges": num_edges,
        "attended_edges": attended,
        **timing.fields(),
        "ns_per_edge": timing.median_s / attended * 1e9 if attended else None,
        **attention,
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


def summarize(records: list[dict], bandwidth: dict | None = None) -> str:
    """Markdown tables per type and node count: seconds per training step / process peak MiB / step MiB;
    nanoseconds per attended edge (and the ratio to the smallest graph's); the attention module alone and
    its achieved bandwidth; the machine's bandwidth."""
    nodes = sorted({r["nodes"] for r in records})
    edges = {r["nodes"]: r["edges"] for r in records}
    by_point = {(r["type"], r["nodes"]): r for r in records}
    types = _in_setup_order(records)

    def step_cell(r: dict) -> str:
        return f"{r['median_s']:.3g} / {r['peak_mib']:.0f} / {r['step_mib']:.0f}"

    def per_edge_cell(r: dict) -> str:
        if not r.get("ns_per_edge"):
            return "-"
        first = next((by_point[t, m] for t, m in ((r["type"], m) for m in nodes) if (t, m) in by_point), None)
        ratio = r["ns_per_edge"] / first["ns_per_edge"] if first and first.get("ns_per_edge") else None
        return f"{r['ns_per_edge']:.0f}" + (f" (x{ratio:.2f})" if ratio and first is not r else "")

    def attention_cell(r: dict) -> str:
        return f"{r['attention_s']:.3g} s, {r['attention_gbps']:.2f} GB/s" if "attention_s" in r else "-"

    header = ["type", *(f"n={n:,}" + (f", E={edges[n]:,}" if n in edges else "") for n in nodes)]
    lines = []
    for title, show in (
        ("forward + backward: seconds / peak MiB (process) / step MiB (above inputs)", step_cell),
        (
            "forward + backward: nanoseconds per attended edge (x ratio to the first node count's)",
            per_edge_cell,
        ),
        ("layer 0's attention module alone, forward + backward: seconds, achieved GB/s", attention_cell),
    ):
        rows = [[t, *(status_cell(by_point.get((t, n)), show) for n in nodes)] for t in types]
        lines += [f"### {title}", "", *markdown_table(header, rows), ""]
    if bandwidth:
        lines.append(
            f"Machine bandwidth, {bandwidth['threads']} thread(s), same run: copy "
            f"{bandwidth['copy_gbps']:.1f} GB/s (bytes read + written, {bandwidth['copy_gib']:g} GiB), "
            f"random 256-byte rows gathered from a {bandwidth['table_gib']:g} GiB table "
            f"{bandwidth['gather_gbps']:.1f} GB/s."
        )
    return "\n".join(lines)


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
    add_allocator_argument(parser, default="keep")
    parser.add_argument(
        "--bandwidth_gib", type=float, default=1.0, help="size of the bandwidth test (0: none)"
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
    bandwidth = measure_bandwidth(args.bandwidth_gib, options, allocator=args.allocator)
    table = setups()
    arguments = sys.argv[1:] if argv is None else argv
    run_meta = {
        "command": " ".join(["python -m benchmarks.studies.graph_scale", *arguments]),
        "types": {t: table[t][0] | {"attn_implementation": table[t][1] or "sdpa"} for t in args.types},
        "nodes": sorted(args.nodes),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "memory_cap_gib": args.memory_cap_gib,
        "timeout_s": args.timeout,
        "plugins": args.plugin,
        "allocator": args.allocator,
        "bandwidth": bandwidth,
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
    summary = summarize(records, bandwidth) + "\n\nCommands (threads, warmup + repeats per run):\n\n"
    summary += "\n".join(f"- `{r['command']}` ({r['warmup']} + {r['repeats']})" for r in meta["runs"])
    results = {"meta": meta, "records": records}
    write_report(args.out, results, summary, {"graph_scale.png": functools.partial(plot, records)})
    return results


if __name__ == "__main__":
    main()
