"""Node classification on one large graph: time and peak memory of a training step against node count.

A small ``EfficientGraphForNodeClassification`` (hidden 64, 2 layers, 4 heads) runs forward + backward of
the node-classification loss on synthetic graphs (uniformly random directed edges, ``--edges_per_node``
per node, fixed seed; a self loop added to every node) with one graph per batch:

- ``graph_sparse``: attention along the edges only, O(E).
- ``gps_performer``: GraphGPS layers, local ``graph_sparse`` over edges + global ``performer``, O(E + n m).
- ``full_sdpa`` / ``full_eager``: exact attention over all node pairs, O(n^2) time; the eager kernel also
  O(n^2) memory. At large n these fail (address-space cap) or time out, and that is recorded as the status.

Each (type, n) point runs in a fresh Python process under an address-space cap (``--memory_cap_gib``), so
an over-large point fails fast instead of swapping and no allocator state leaks between points.

    python benchmarks/graph_scale.py --threads 1                       # 1k..200k nodes, 10 edges per node
    python benchmarks/graph_scale.py --preset smoke --out /tmp/gs       # seconds
    python benchmarks/graph_scale.py --types graph_sparse --nodes 200000 --edges_per_node 10

Writes ``<out>/results.json``, ``<out>/summary.md`` and ``<out>/graph_scale.png`` (time and memory against
node count, log-log). Memory: ``peak_mib`` is the whole process's peak resident set (VmHWM: interpreter,
torch, data, model, collation and the step); ``step_mib`` is the training step's peak above the resident
size just before it (VmHWM reset there), i.e. what forward + backward need beyond inputs and parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/attention.py, also when imported
from attention import (  # noqa: E402
    cap_address_space,
    current_rss_bytes,
    machine_meta,
    peak_rss_bytes,
    reset_peak_rss,
)

MODEL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
TYPES = {  # benchmark name -> (config overrides, attn_implementation)
    "graph_sparse": ({"attention_type": "graph_sparse"}, None),
    "gps_performer": ({"graph_layer_type": "gps", "attention_type": "performer"}, None),
    "full_sdpa": ({"attention_type": "full"}, "sdpa"),
    "full_eager": ({"attention_type": "full"}, "eager"),
}
PRESETS = {
    "full": dict(
        nodes=[1000, 10000, 50000, 200000], types=list(TYPES), repeats=2, warmup=1, edges_per_node=10
    ),
    "smoke": dict(nodes=[64], types=list(TYPES), repeats=1, warmup=0, edges_per_node=4),
}


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


def run_point(args: argparse.Namespace) -> dict:
    """Measure one point in this process (called in a fresh subprocess)."""
    cap_address_space(args.memory_cap_gib)
    import torch

    import hf_efficient
    from hf_efficient.models.graph import (
        EfficientGraphConfig,
        EfficientGraphForNodeClassification,
        GraphCollator,
    )

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    overrides, impl = TYPES[args.type]
    config = EfficientGraphConfig(
        **MODEL, **overrides, node_feature_dim=args.feature_dim, num_labels=args.num_labels
    )
    if impl is not None:
        config._attn_implementation = impl
    model = EfficientGraphForNodeClassification(config).train()
    n, num_edges = args.nodes, args.nodes * args.edges_per_node
    record = synthetic_graph(n, num_edges, args.feature_dim, args.num_labels, args.seed)
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

    setup_peak = peak_rss_bytes()
    rss_before = current_rss_bytes()
    reset_peak_rss()  # the step's own peak, on top of data, parameters and imports
    times = []
    for i in range(args.warmup + args.repeats):
        start = time.perf_counter()
        step()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    step_peak = peak_rss_bytes()
    return {
        "type": args.type,
        "nodes": n,
        "edges": num_edges,
        "attended_edges": int(batch["edge_index"].shape[1]) if "edge_index" in batch else None,
        "status": "ok",
        "median_s": statistics.median(times),
        "times_s": times,
        "collate_s": collate_s,
        "peak_mib": max(setup_peak, step_peak) / 2**20,
        "step_mib": (step_peak - rss_before) / 2**20,
        "hf_efficient": hf_efficient.__version__,
    }


WORKER_ARGS = (
    "edges_per_node",
    "feature_dim",
    "num_labels",
    "seed",
    "threads",
    "warmup",
    "repeats",
    "memory_cap_gib",
)


def launch_point(args: argparse.Namespace, bench_type: str, n: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--type", bench_type, "--nodes", str(n)]
    for name in WORKER_ARGS:
        cmd += [f"--{name}", str(getattr(args, name))]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    base = {"type": bench_type, "nodes": n, "edges": n * args.edges_per_node}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**base, "status": f"timeout (> {args.timeout:g} s)"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        status = "out of memory" if "memory" in last.lower() or "alloc" in last.lower() else "error"
        return {**base, "status": f"{status}: {last[:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(records: list[dict]) -> str:
    """Markdown table: seconds per training step / process peak MiB, per type and node count."""
    nodes = sorted({r["nodes"] for r in records})
    edges = {r["nodes"]: r["edges"] for r in records}
    lines = ["### forward + backward: seconds / peak MiB (process) / step MiB (above inputs)", ""]
    header = [f"n={n:,}" + (f", E={edges[n]:,}" if n in edges else "") for n in nodes]
    lines.append("| type | " + " | ".join(header) + " |")
    lines.append("|---" * (len(nodes) + 1) + "|")
    for t in sorted({r["type"] for r in records}, key=list(TYPES).index):
        cells = []
        for n in nodes:
            r = next((x for x in records if x["type"] == t and x["nodes"] == n), None)
            if r is None:
                cells.append("-")
            elif r["status"] != "ok":
                cells.append(r["status"].split(":")[0])
            else:
                cells.append(f"{r['median_s']:.3g} / {r['peak_mib']:.0f} / {r['step_mib']:.0f}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(records: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, (key, label) in zip(
        axes, (("median_s", "seconds per step"), ("peak_mib", "peak MiB")), strict=True
    ):
        for t in [t for t in TYPES if any(r["type"] == t for r in records)]:
            pts = sorted((r["nodes"], r[key]) for r in records if r["type"] == t and r["status"] == "ok")
            if pts:
                style = "--" if t.startswith("full") else "-"
                ax.plot(*zip(*pts, strict=True), style, marker="o", label=t)
            failed = [r for r in records if r["type"] == t and r["status"].split()[0] in ("timeout", "out")]
            if pts and failed:  # mark where the type stopped, and why
                why = failed[0]["status"].split(":")[0].split(" (")[0]
                ax.annotate(f"{t}: {why} at n={failed[0]['nodes']:,}", pts[-1], fontsize=7)
        ax.set(xscale="log", yscale="log", xlabel="nodes n (one graph per batch)", ylabel=label)
        ax.set_title(f"{label}, node classification forward + backward")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "graph_scale.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--types", nargs="+", choices=list(TYPES))
    parser.add_argument("--nodes", nargs="+", type=int)
    parser.add_argument("--edges_per_node", type=int, help="random directed edges per node (+ a self loop)")
    parser.add_argument("--feature_dim", type=int, default=16)
    parser.add_argument("--num_labels", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument(
        "--memory_cap_gib", type=float, default=12.0, help="address-space cap per point (0: none)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per point")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/graph_scale"))
    parser.add_argument(
        "--append", action="store_true", help="add to <out>/results.json (same machine and settings)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--type", help=argparse.SUPPRESS)
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    for name in ("types", "nodes", "edges_per_node", "warmup", "repeats"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    if args.worker:
        args.nodes = args.nodes[0]
        print(json.dumps(run_point(args)))
        return

    args.out.mkdir(parents=True, exist_ok=True)
    records, failed = [], set()
    for t in args.types:
        for n in sorted(args.nodes):
            if t in failed:  # a larger graph cannot succeed where a smaller one failed
                records.append(
                    {
                        "type": t,
                        "nodes": n,
                        "edges": n * args.edges_per_node,
                        "status": "skipped (failed at smaller n)",
                    }
                )
                continue
            record = launch_point(args, t, n)
            print(f"{t} n={n}: {record['status']} {record.get('median_s', '')}", file=sys.stderr, flush=True)
            if record["status"] != "ok":
                failed.add(t)
            records.append(record)

    run = {
        "command": "python benchmarks/graph_scale.py " + " ".join(sys.argv[1:]),
        "types": {t: TYPES[t][0] | {"attn_implementation": TYPES[t][1] or "sdpa"} for t in args.types},
        "nodes": sorted(args.nodes),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "memory_cap_gib": args.memory_cap_gib,
        "timeout_s": args.timeout,
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
        "runs": [run],
    }
    results = args.out / "results.json"
    if args.append and results.exists():  # keep earlier runs' points that this run did not measure
        earlier = json.loads(results.read_text())
        new = {(r["type"], r["nodes"]) for r in records}
        records = [r for r in earlier["records"] if (r["type"], r["nodes"]) not in new] + records
        meta["runs"] = earlier["meta"]["runs"] + [run]
    results.write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    plot(records, args.out)
    table = summarize(records) + "\n\nCommands (threads, warmup + repeats per run):\n\n"
    table += "\n".join(f"- `{r['command']}` ({r['warmup']} + {r['repeats']})" for r in meta["runs"])
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    print(f"\nwrote {args.out}/results.json, summary.md, graph_scale.png")


if __name__ == "__main__":
    main()
