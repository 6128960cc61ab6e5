"""What every benchmark writes: ``results.json``, a markdown summary, plots; and the pieces they are made of.

:func:`write_report` is the one writer: the results as JSON (``{"meta": ..., "records": [...]}`` for the
harness-based benchmarks), the summary as markdown (also printed), then each plot. The tables are built
with :func:`markdown_table` (the package's, :mod:`hf_efficient.markdown`) and :func:`status_cell` (a failed
point shows its status), the log-log plots of time or memory against size with :func:`plot_loglog`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def write_report(
    out: Path,
    results: dict | list,
    summary: str,
    plots: dict[str, Callable[[Path], None]] | None = None,
    *,
    results_name: str = "results.json",
    summary_name: str = "summary.md",
) -> dict | list:
    """Write ``<out>/<results_name>``, ``<out>/<summary_name>`` and every plot, print the summary; returns
    ``results`` (what a benchmark's ``main`` returns).

    Args:
        plots: file name -> function drawing the plot into that path.
    """
    plots = plots or {}
    out.mkdir(parents=True, exist_ok=True)
    (out / results_name).write_text(json.dumps(results, indent=1))
    for name, draw in plots.items():
        draw(out / name)
    (out / summary_name).write_text(summary + "\n")
    print(summary)
    print(f"\nwrote {out}/" + ", ".join([results_name, summary_name, *plots]))
    return results


# ---- tables ---------------------------------------------------------------------------------------------
def status_cell(record: dict | None, show: Callable[[dict], str]) -> str:
    """A table cell: ``show(record)`` for a measured point, its status (up to a colon) for a failed or
    skipped one, "-" for a point that is not in the run."""
    if record is None:
        return "-"
    if record["status"] != "ok":
        return record["status"].split(":")[0]
    return show(record)


# ---- plots ----------------------------------------------------------------------------------------------
@dataclass
class Panel:
    """One log-log panel: a line per label, each a list of (x, y) points.

    Attributes:
        dashed: labels drawn dashed (baselines: exact attention, peers).
        notes: (text, (x, y)) annotations, e.g. where a series stopped and why.
    """

    title: str
    xlabel: str
    ylabel: str
    lines: dict[str, list[tuple[float, float]]]
    dashed: set[str] = field(default_factory=set)
    notes: list[tuple[str, tuple[float, float]]] = field(default_factory=list)


def ok_points(records: list[dict], x: str, y: str, **match) -> list[tuple[float, float]]:
    """Sorted (record[x], record[y]) of the measured records whose fields equal ``match`` (y known and > 0:
    log)."""
    return sorted(
        (r[x], r[y])
        for r in records
        if r["status"] == "ok"
        and (r.get(y) or 0) > 0
        and all(r[key] == value for key, value in match.items())
    )


def length_panel(records: list[dict], key: str, title: str, label: str, series: dict, dashed=()) -> Panel:
    """A panel of ``records[key]`` against the sequence length: a line per series name, of the measured
    records whose fields equal its match (a dict, as :func:`ok_points`'); ``dashed``: the baselines."""
    lines = {name: ok_points(records, "length", key, **match) for name, match in series.items()}
    return Panel(title, "sequence length n", label, lines, set(dashed))


TIME_AND_MEMORY = {"time.png": ("median_s", "seconds"), "memory.png": ("peak_mib", "peak MiB")}


def time_and_memory_plots(draw: Callable[[str, str, Path], None]) -> dict[str, Callable[[Path], None]]:
    """``time.png`` (median seconds) and ``memory.png`` (peak MiB) for :func:`write_report`, each drawn by
    ``draw(record key, axis label, path)``."""
    return {name: functools.partial(draw, key, label) for name, (key, label) in TIME_AND_MEMORY.items()}


def pyplot():
    """matplotlib.pyplot drawing into files only (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loglog(path: Path, grid: list[list[Panel]], panel_size: tuple[float, float], dpi: int = 110) -> None:
    """Draw rows of log-log panels into ``path``; a label has the same colour in every panel."""
    plt = pyplot()
    labels = list(dict.fromkeys(label for row in grid for panel in row for label in panel.lines))
    palette = plt.cm.tab10 if len(labels) <= 10 else plt.cm.tab20  # tab10 would repeat beyond ten labels
    colors = dict(zip(labels, palette(range(len(labels))), strict=True))
    rows, cols = len(grid), max(len(row) for row in grid)
    width, height = panel_size
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for row, panels in zip(axes, grid, strict=True):
        for ax, panel in zip(row, panels, strict=False):
            for label, points in panel.lines.items():
                if points:
                    style = "--" if label in panel.dashed else "-"
                    ax.plot(*zip(*points, strict=True), style, marker="o", color=colors[label], label=label)
            for text, xy in panel.notes:
                ax.annotate(text, xy, fontsize=7)
            ax.set(xscale="log", yscale="log", xlabel=panel.xlabel, ylabel=panel.ylabel, title=panel.title)
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            else:  # every point failed or was skipped (the summary says why)
                ax.text(0.5, 0.5, "no measured points", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
