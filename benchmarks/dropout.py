"""CPU dropout, torch's against hf_efficient's (hf_efficient.attention.dropout), side by side in one process.

For each shape and thread count, forward + backward of ``F.dropout`` against ``fast_dropout``, and of
``F.scaled_dot_product_attention`` with attention dropout against ``hf_efficient.attention.dropout.sdpa``,
interleaved call by call (median of ``--repeats``), with the fraction of the machine's copy bandwidth the fast
dropout reaches (its traffic: 4 bytes read + 4 written + 1 of mask per element forward, 4 + 4 + 1 backward,
2 bytes of draws per element written and read). The default shapes are the demo's (make demo: MiniLM, 12
heads, batch 8 x 128 tokens): the attention probabilities (8, 12, 128, 128) and the hidden states
(8, 128, 384). JSON, a table and a bar plot of the speed-ups.

    python -m benchmarks.dropout --out benchmarks/results/reference/dropout
    python -m benchmarks.dropout --preset smoke --out runs/dropout_smoke
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import hf_efficient
from benchmarks.harness import bandwidth_point, benchmark_parser, machine_meta
from benchmarks.report import pyplot, write_report
from hf_efficient.attention.dropout import fast_dropout, sdpa

PRESETS = {
    "full": {"batch": 8, "heads": 12, "length": 128, "hidden": 384, "repeats": 21, "threads": [1, 2]},
    "smoke": {"batch": 2, "heads": 2, "length": 16, "hidden": 32, "repeats": 3, "threads": [1]},
}
P = 0.1  # BERT's attention_probs_dropout_prob and hidden_dropout_prob
BYTES_PER_ELEMENT = 4 + 4 + 1 + 4 + 4 + 1 + 2 * 2  # forward, backward and the draws (see the docstring)


def forward_backward(function, *inputs):
    """A call that runs ``function`` forward and backward (gradient of the sum) on fresh-gradient inputs."""

    def call():
        for x in inputs:
            x.grad = None
        function(*inputs).sum().backward()

    return call


def interleaved_medians(calls: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each call, the calls alternating so that drift hits all of them alike."""
    times = {name: [] for name in calls}
    for call in calls.values():  # warm-up
        call()
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(shape: dict, threads: int, repeats: int, copy_gbps: float | None) -> list[dict]:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    b, h, n, hidden = shape["batch"], shape["heads"], shape["length"], shape["hidden"]
    probs = torch.rand(b, h, n, n, requires_grad=True)
    states = torch.randn(b, n, hidden, requires_grad=True)
    q, k, v = (torch.randn(b, h, n, hidden // h, requires_grad=True) for _ in range(3))
    cases = {
        f"dropout {tuple(probs.shape)}": (
            probs,
            forward_backward(lambda x: F.dropout(x, P), probs),
            forward_backward(lambda x: fast_dropout(x, P), probs),
        ),
        f"dropout {tuple(states.shape)}": (
            states,
            forward_backward(lambda x: F.dropout(x, P), states),
            forward_backward(lambda x: fast_dropout(x, P), states),
        ),
        f"sdpa with dropout {tuple(q.shape)}": (
            probs,
            forward_backward(lambda *t: F.scaled_dot_product_attention(*t, dropout_p=P), q, k, v),
            forward_backward(lambda *t: sdpa(*t, dropout_p=P), q, k, v),
        ),
    }
    records = []
    for name, (tensor, torch_call, ours_call) in cases.items():
        medians = interleaved_medians({"torch": torch_call, "ours": ours_call}, repeats)
        record = {"case": name, "threads": threads, "torch_ms": medians["torch"] * 1e3}
        record |= {"ours_ms": medians["ours"] * 1e3, "speedup": medians["torch"] / medians["ours"]}
        if name.startswith("dropout") and copy_gbps:
            achieved = tensor.numel() * BYTES_PER_ELEMENT / medians["ours"] / 1e9
            record["fraction_of_copy_bandwidth"] = achieved / copy_gbps
        records.append(record)
    return records


def summarize(records: list[dict]) -> str:
    lines = [
        "| case | threads | torch ms | ours ms | speed-up | of copy bandwidth |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        fraction = r.get("fraction_of_copy_bandwidth")
        share = f"{fraction:.0%}" if fraction is not None else "-"
        lines.append(
            f"| {r['case']} | {r['threads']} | {r['torch_ms']:.2f} | {r['ours_ms']:.2f} | "
            f"{r['speedup']:.2f}x | {share} |"
        )
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    labels = [f"{r['case']}\n{r['threads']} thread(s)" for r in records]
    ax.barh(labels, [r["speedup"] for r in records], color="tab:blue")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("speed-up of forward + backward (torch's time / ours)")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    args = benchmark_parser(__doc__, "dropout", PRESETS).parse_args(argv)
    preset = PRESETS[args.preset]
    records = []
    for threads in preset["threads"]:
        gib = 1 / 32 if args.preset == "smoke" else 1.0
        copy = bandwidth_point(argparse.Namespace(threads=threads, gib=gib, allocator="glibc"))["copy_gbps"]
        records += measure(preset, threads, preset["repeats"], copy)
    results = {
        "meta": machine_meta(max(preset["threads"]))
        | {"hf_efficient": hf_efficient.__version__, "preset": preset, "p": P},
        "records": records,
    }
    write_report(args.out, results, summarize(records), {"speedup.png": lambda path: plot(records, path)})
    return records


if __name__ == "__main__":
    main()
