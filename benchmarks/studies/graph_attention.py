"""Graph attention types side by side on the offline graph tasks, and the attention each puts on a molecule.

Every setting (a row) trains the same model for the same budget on every task (a column) with
``scripts/train_graph.py``, once per seed through :mod:`benchmarks.seeds`; the table gives the held-out
metric's mean ± standard deviation over the seeds. Settings:

- ``gat`` / ``gatv2``: GAT's static and GATv2's dynamic additive attention over edges (PyG's GATConv and
  GATv2Conv, self loops added by the core);
- ``graph_sparse``: scaled dot-product (Transformer) attention over edges;
- ``multi_hop``: MAGNA's diffusion (4 hops, alpha 0.15) of the dot-product scores, and ``magna``: of GAT's
  additive scores, as published (``score="gat"``);
- ``graphormer``: exact attention over every node pair with Graphormer's spatial / edge bias and graph token;
- ``gps``: GraphGPS, graph-sparse attention along edges plus Performer over all nodes.

Tasks, each with its base config (model size, optimiser, budget): ``solubility`` (regression of logS on
1,025 / 257 molecules, test RMSE), ``karate`` and ``polblogs`` (node classification, test accuracy),
``mouse_connectomes`` (graph classification of 4 strains, 24 / 8 brains, test accuracy).

    python -m benchmarks.studies.graph_attention --out benchmarks/results/reference/graph_attention
    python -m benchmarks.studies.graph_attention --preset smoke --out /tmp/graph_attention  # minutes

A finished (task, setting, seed) is not run again (``benchmarks.seeds`` resumes), so an interrupted run
continues where it stopped; ``--report_only`` writes the table and picture from the seeds finished so far
(each cell says how many), running nothing. Then ``attention.png``: for one test molecule, each setting's
seed-0 model's last-layer attention averaged over heads, as the (atoms x atoms) matrix and on the
molecule's drawing (what one atom attends to). ``summary.md`` holds the table and the per-run commands,
``results.json`` every number.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import seeds
from benchmarks.report import pyplot, write_report
from hf_efficient.markdown import markdown_table

ROOT = Path(__file__).resolve().parents[2]  # the repository: benchmarks/studies/ is two levels down
SCRIPT = ROOT / "scripts" / "train_graph.py"

SETTINGS = {  # name -> train_graph.py arguments choosing the attention
    "gat": ["--attention_type", "gat"],
    "gatv2": ["--attention_type", "gatv2"],
    "graph_sparse": ["--attention_type", "graph_sparse"],
    "multi_hop": ["--attention_type", "multi_hop", "--attention_config", '{"score": "dot"}'],
    "magna": ["--attention_type", "multi_hop", "--attention_config", '{"score": "gat"}'],
    "graphormer": ["--attention_type", "full"],
    "gps": ["--attention_type", "performer"],
}


@dataclass(frozen=True)
class Task:
    """One column: its data, base config and budget, the metric shown, and per-setting extra arguments."""

    config: str
    arguments: list[str]
    metric: str
    lower_is_better: bool = False
    scale: float = 1.0  # 100: accuracy shown in percent
    extra: dict[str, list[str]] = field(default_factory=dict)


TASKS = {
    "solubility": Task(
        "configs/graph/base_molecules.json",
        ["--dataset_name", "solubility", "--num_train_epochs", "20"],
        "eval_rmse",
        lower_is_better=True,
    ),
    "karate": Task("configs/graph/base_tiny.json", ["--dataset_name", "karate"], "eval_accuracy", scale=100),
    "polblogs": Task(
        "configs/graph/base_tiny.json",
        ["--dataset_name", "polblogs", "--max_steps", "100"],
        "eval_accuracy",
        scale=100,
    ),
    "mouse_connectomes": Task(
        "configs/graph/base_connectomes.json",
        ["--dataset_name", "mouse_connectomes"],
        "eval_accuracy",
        scale=100,
        # Graphormer's edge encoding costs O(E n^2) per batch: 72,000 edges on 332 nodes (the base config)
        extra={"graphormer": ["--config_overrides", "edge_dim=null"]},
    ),
}
PRESETS = {
    "full": dict(seeds=[0, 1, 2], tasks=list(TASKS), settings=list(SETTINGS), budget=[]),
    # every setting on the smallest tasks, a few steps: the pipeline end to end
    "smoke": dict(seeds=[0], tasks=["karate"], settings=list(SETTINGS), budget=["--max_steps", "3"]),
}


def run_command(task: Task, setting: str, budget: list[str], shown: bool = False) -> list[str]:
    """The training command of one (task, setting), with benchmarks.seeds' {seed} and {output_dir};
    ``shown``: as the docs write it (``python``, paths from the repository root)."""
    python, script, config = sys.executable, str(SCRIPT), str(ROOT / task.config)
    if shown:
        python, script, config = "python", str(SCRIPT.relative_to(ROOT)), task.config
    command = [python, script, "--config", config, *task.arguments]
    command += [*SETTINGS[setting], *task.extra.get(setting, []), *budget]
    return command + ["--seed", "{seed}", "--output_dir", "{output_dir}", "--report_to", "none"]


def run_all(args: argparse.Namespace) -> dict:
    """Every (task, setting) over the seeds; {task: {setting: benchmarks.seeds results}}."""
    results: dict[str, dict] = {}
    for task_name in args.tasks:
        task = TASKS[task_name]
        for setting in args.settings:
            out = args.out / task_name / setting
            command = run_command(task, setting, args.budget)
            seed_args = ["--seeds", *map(str, args.seeds), "--out", str(out), "--label", setting]
            seed_args += seeds.in_process_flag(args)
            if args.dry_run:
                print(shlex.join(["python", "-m", "benchmarks.seeds", *seed_args, "--", *command]))
                continue
            if args.report_only:
                finished = finished_seeds(out, args.seeds)
                if finished:
                    results.setdefault(task_name, {})[setting] = finished
                continue
            try:
                outcome = seeds.main([*seed_args, "--metrics", task.metric, "train_runtime", "--", *command])
            except SystemExit as stop:
                if stop.code != 1:  # refused before running anything (the folder holds another command's
                    raise  # runs): its message says why; an old summary must not pass for this run's
                outcome = json.loads((out / "seeds.json").read_text())  # some seed failed: report the others
            results.setdefault(task_name, {})[setting] = outcome
    return results


def finished_seeds(out: Path, seed_list: list[int]) -> dict | None:
    """What ``benchmarks.seeds`` would report for the seeds of ``seed_list`` that have finished in ``out``
    (their results files), running nothing; None if none has."""
    runs = {}
    for seed in seed_list:
        metrics = seeds.run_metrics(out / f"seed_{seed}", None)
        if metrics is not None:
            runs[seed] = metrics
    if not runs:
        return None
    missing = [seed for seed in seed_list if seed not in runs]
    return {"label": out.name, "runs": runs, "missing": missing, "aggregate": seeds.aggregate(runs)}


def cell(outcome: dict | None, task: Task) -> str:
    stats = (outcome or {}).get("aggregate", {}).get(task.metric)
    if stats is None:
        return "failed" if outcome else "-"
    digits = 1 if task.scale == 100 else 3
    if stats["n"] == 1:  # no spread to show
        return f"{task.scale * stats['mean']:.{digits}f} (1 seed)"
    return seeds.mean_and_spread(stats, scale=task.scale, digits=digits).replace(" seeds)", ")")


def summarize(results: dict, args: argparse.Namespace) -> str:
    tasks = [t for t in args.tasks if t in results]
    header = ["setting"]
    for name in tasks:
        task = TASKS[name]
        unit = "RMSE, lower is better" if task.lower_is_better else "accuracy %"
        header.append(f"{name} ({unit})")
    header.append("train s / run (solubility)" if tasks and tasks[0] == "solubility" else "train s / run")
    rows = []
    for setting in args.settings:
        row = [f"`{setting}`"] + [cell(results[t].get(setting), TASKS[t]) for t in tasks]
        first = results[tasks[0]].get(setting, {}) if tasks else {}
        runtime = first.get("aggregate", {}).get("train_runtime")
        row.append(f"{runtime['mean']:.0f}" if runtime else "-")
        rows.append(row)
    lines = [
        f"### Graph attention types: held-out metric, mean ± std over seeds {args.seeds} (n runs)",
        "",
        *markdown_table(header, rows),
        "",
        "Commands: `python -m benchmarks.seeds --seeds ... --out <out>/<task>/<setting> -- ...` running:",
        "",
    ]
    for name in tasks:
        lines.append(f"- {name}: `{shlex.join(run_command(TASKS[name], 'gat', args.budget, shown=True))}`")
    lines.append("- settings: " + "; ".join(f"{s}: `{shlex.join(SETTINGS[s])}`" for s in args.settings))
    return "\n".join(lines)


# ---- the attention picture -------------------------------------------------------------------------------
def molecule_attention(model_dir: Path, smiles: str):
    """The last layer's attention of a trained solubility model on one molecule, averaged over heads:
    (atoms, atoms) [query, key], or None when the model forms no attention matrix. For GraphGPS, whose
    global Performer never forms one, the local attention along bonds (the layer's edge core)."""
    import numpy as np
    import torch
    from datasets import Dataset

    from hf_efficient import EfficientGraphForGraphClassification, GraphCollator
    from hf_efficient.data.graph_tasks import add_structural_features
    from hf_efficient.data.molecules import smiles_to_record

    model = EfficientGraphForGraphClassification.from_pretrained(model_dir).eval()
    config = model.config
    record = add_structural_features(Dataset.from_list([smiles_to_record(smiles)]), config)[0]
    batch = GraphCollator.for_config(config, add_self_loops=True)([record])
    last = model.graph.encoder.layer[-1]
    core = (last.local_attention if config.graph_layer_type == "gps" else last.attention).self.core
    captured = []

    def again_with_weights(module, args, output):  # the core once more (its forward: no hooks), with weights
        query, key, value, inputs = args
        asked = inputs.replace(output_attentions=True)
        captured.append(type(module).forward(module, query, key, value, asked).weights)

    if not core.capabilities.output_attentions:
        return None
    handle = core.register_forward_hook(again_with_weights)
    with torch.no_grad():
        model(**batch)
    handle.remove()
    weights = captured[-1]
    weights = weights.to_dense() if weights.is_sparse else weights  # (1, h, n', n')
    attention = weights[0].mean(0).numpy()  # (n', n')
    atoms = record["num_nodes"]
    return np.asarray(attention[-atoms:, -atoms:])  # without a virtual token (position 0)


def draw_attention(path: Path, smiles: str, maps: dict, query_atom: int) -> None:
    """Row 1: each setting's (atoms x atoms) attention; row 2: the molecule, atoms coloured and sized by
    what ``query_atom`` (ringed) attends to, bonds in grey."""
    import numpy as np
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.MolFromSmiles(smiles)
    AllChem.Compute2DCoords(mol)
    coords = np.array([list(mol.GetConformer().GetAtomPosition(i))[:2] for i in range(mol.GetNumAtoms())])
    symbols = [atom.GetSymbol() for atom in mol.GetAtoms()]
    plt = pyplot()
    fig, axes = plt.subplots(2, len(maps), figsize=(2.6 * len(maps), 5.6), squeeze=False)
    drawn = [a for a in maps.values() if a is not None]
    top_value = max([a.max() for a in drawn] + [1e-9])  # one colour scale for every panel
    image = None
    for column, (setting, attention) in enumerate(maps.items()):
        top, bottom = axes[0][column], axes[1][column]
        top.set_title(setting, fontsize=10)
        bottom.set_aspect("equal")
        bottom.axis("off")
        bottom.margins(0.15)
        if attention is None:
            top.text(0.5, 0.5, "forms no\nattention matrix", ha="center", va="center", fontsize=9)
            top.axis("off")
            continue
        image = top.imshow(attention, cmap="viridis", vmin=0, vmax=top_value)
        top.set_xlabel("key atom", fontsize=8)
        if column == 0:
            top.set_ylabel("query atom", fontsize=8)
        top.tick_params(labelsize=6)
        for bond in mol.GetBonds():
            a, b = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
            bottom.plot(*coords[[a, b]].T, color="0.75", linewidth=1.5, zorder=1)
        weights = attention[query_atom]
        sizes = 15 + 250 * weights / top_value
        bottom.scatter(*coords.T, s=sizes, c=weights, cmap="viridis", vmin=0, vmax=top_value, zorder=2)
        bottom.scatter(
            *coords[query_atom], s=300, facecolors="none", edgecolors="red", linewidths=1.2, zorder=3
        )
        for i, symbol in enumerate(symbols):
            if symbol != "C":
                bottom.annotate(symbol, coords[i], xytext=(4, 4), textcoords="offset points", fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="attention weight")
    fig.suptitle(
        f"Last-layer attention (mean over heads) of each trained model on {smiles}; bottom: what atom "
        f"{query_atom} ({symbols[query_atom]}, red ring) attends to",
        fontsize=10,
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def picture_molecule(cache_dir: str | None = None) -> tuple[str, int]:
    """The test molecule the picture shows (the first test molecule with 12 to 20 atoms, a ring and a
    heteroatom) and its query atom (the first heteroatom)."""
    from rdkit import Chem

    from hf_efficient.data.graphs import load_graph_splits

    test = load_graph_splits("solubility", cache_dir=cache_dir).eval
    for smiles in test["smiles"]:
        mol = Chem.MolFromSmiles(smiles)
        if mol is None or not 12 <= mol.GetNumAtoms() <= 20 or not mol.GetRingInfo().NumRings():
            continue
        hetero = [atom.GetIdx() for atom in mol.GetAtoms() if atom.GetSymbol() not in ("C", "H")]
        if hetero:
            return smiles, hetero[0]
    raise ValueError("No test molecule of 12 to 20 atoms with a ring and a heteroatom.")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS))
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/reference/graph_attention"))
    parser.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    seeds.add_in_process_argument(parser)
    parser.add_argument(
        "--report_only",
        action="store_true",
        help="run nothing: the table and picture from the seeds finished so far (each cell: its seed count)",
    )
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = make_parser().parse_args(argv)
    preset = PRESETS[args.preset]
    for name in ("seeds", "tasks", "settings"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    args.budget = preset["budget"]
    results = run_all(args)
    if args.dry_run:
        return {}
    plots = {}
    picture = None
    if "solubility" in results:
        smiles, query_atom = picture_molecule()
        maps = {}
        for setting in args.settings:
            model_dir = args.out / "solubility" / setting / f"seed_{args.seeds[0]}"
            if (model_dir / "config.json").exists():
                maps[setting] = molecule_attention(model_dir, smiles)
        picture = {"smiles": smiles, "query_atom": query_atom, "settings": list(maps)}
        plots["attention.png"] = lambda path: draw_attention(path, smiles, maps, query_atom)
    arguments = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.studies.graph_attention " + shlex.join(arguments)
    meta = {"command": command, "seeds": args.seeds, "tasks": args.tasks, "settings": args.settings}
    report = {"meta": meta, "results": results, "picture": picture}
    write_report(args.out, report, summarize(results, args), plots)
    return report


if __name__ == "__main__":
    main()
