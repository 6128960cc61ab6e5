"""benchmarks.studies.graph_attention: the commands docs/graphs.md quotes (dry run, report only, a smoke run
on solubility writing the table and the attention picture) and the picture's matrix on untrained models."""

import json

import numpy as np
import pytest

from benchmarks.studies import graph_attention as bench
from hf_efficient import EfficientGraphConfig, EfficientGraphForGraphClassification


def test_dry_run_prints_one_seeds_command_per_task_and_setting(tmp_path, capsys):
    bench.main(["--dry_run", "--out", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(bench.TASKS) * len(bench.SETTINGS)
    assert all(line.startswith("python -m benchmarks.seeds --seeds 0 1 2 --out ") for line in lines)
    magna = next(line for line in lines if "/solubility/magna " in line)
    assert '--attention_type multi_hop --attention_config \'{"score": "gat"}\'' in magna
    assert "--num_train_epochs 20" in magna
    # GraphGPS is the performer global core beside the base config's graph_sparse local one
    assert "--attention_type performer" in next(line for line in lines if "/karate/gps " in line)
    assert not (tmp_path / "summary.md").exists()  # nothing run, nothing written


@pytest.mark.slow  # three settings trained
def test_smoke_run_on_solubility_writes_the_table_and_the_attention_picture(tmp_path):
    """Three settings trained on the real solubility set at the smoke preset's sizes (the table needs every
    setting), all in this process (``--in_process``: a fresh interpreter per setting was 20 of this test's 31
    CPU-seconds; the seeds runner's fresh-interpreter path is test_long_documents_study.py's fine-tune
    test)."""
    options = ["--preset", "smoke", "--tasks", "solubility", "--settings", "gat", "graphormer", "gps"]
    options += ["--in_process"]
    bench.main([*options, "--out", str(tmp_path)])
    report = json.loads((tmp_path / "results.json").read_text())
    for setting in ("gat", "graphormer", "gps"):
        runs = report["results"]["solubility"][setting]
        assert runs["aggregate"]["eval_rmse"]["mean"] > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| `gat` |" in summary and "| `gps` |" in summary
    assert "solubility (RMSE, lower is better)" in summary
    picture = report["picture"]
    assert picture["settings"] == ["gat", "graphormer", "gps"] and 0 <= picture["query_atom"]
    assert (tmp_path / "attention.png").stat().st_size > 10_000


def test_molecule_attention_rows_are_distributions_over_atoms(tmp_path):
    # untrained solubility-shaped models (the molecule records' 9 atom categories, 6 bond features): the
    # picture's matrix has one probability row per atom, Graphormer's graph token left out
    smiles = "c1ccncc1O"  # 7 atoms: 3-hydroxypyridine, N is atom 3 (bonded to atoms 2 and 4), O atom 6
    molecule = dict(node_feature_dim=9, node_vocab_size=119, edge_dim=6, max_degree=8, rw_pe_dim=8)
    tiny = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    graphormer = dict(graph_bias="graphormer", add_virtual_token=True, graph_pooling="virtual_token")
    for attention_type, extra in (("gat", {}), ("full", graphormer)):
        core = {"edge_dim": 6} if attention_type == "gat" else {}  # gat's edge features: the bonds'
        config = EfficientGraphConfig(
            attention_type=attention_type, attention_config=core, num_labels=1, problem_type="regression",
            **molecule, **tiny, **extra,
        )  # fmt: skip
        EfficientGraphForGraphClassification(config).save_pretrained(tmp_path / attention_type)
        attention = bench.molecule_attention(tmp_path / attention_type, smiles)
        assert attention.shape == (7, 7)
        if attention_type == "gat":  # a distribution over bonded atoms and itself: N (3) has C 2, C 4
            assert attention.sum(1) == pytest.approx(np.ones(7), abs=1e-5)
            assert set(np.flatnonzero(attention[3])) == {2, 3, 4}
        else:  # every atom, and a share on the graph token that is not drawn
            assert (attention > 0).all() and (attention.sum(1) < 1).all()


def test_report_only_tables_the_finished_seeds_and_runs_nothing(tmp_path):
    # karate: gat finished seeds 0 and 2 (accuracies 0.5 and 0.7), seed 1 never wrote results; gatv2 seed 0;
    # graph_sparse nothing
    for setting, seed, accuracy in (("gat", 0, 0.5), ("gat", 2, 0.7), ("gatv2", 0, 0.8)):
        folder = tmp_path / "karate" / setting / f"seed_{seed}"
        folder.mkdir(parents=True)
        (folder / "eval_results.json").write_text(json.dumps({"eval_accuracy": accuracy}))
    (tmp_path / "karate" / "gat" / "seed_1").mkdir()
    settings = ["--settings", "gat", "gatv2", "graph_sparse"]
    options = ["--report_only", "--tasks", "karate", *settings, "--out", str(tmp_path)]
    report = bench.main(options)
    gat = report["results"]["karate"]["gat"]
    assert sorted(gat["runs"]) == [0, 2] and gat["missing"] == [1]
    assert gat["aggregate"]["eval_accuracy"]["mean"] == pytest.approx(0.6)
    summary = (tmp_path / "summary.md").read_text()
    assert "| `gat` | 60.0 ± 14.1 (2) |" in summary and "| `gatv2` | 80.0 (1 seed) |" in summary
    assert "| `graph_sparse` | - |" in summary
    assert not (tmp_path / "karate" / "graph_sparse").exists()  # nothing was run


def test_a_folder_of_another_command_is_refused_not_reported_from_its_old_summary(tmp_path):
    # karate/gat holds runs (and a summary) of a command that differs from what this run would give
    folder = tmp_path / "karate" / "gat"
    folder.mkdir(parents=True)
    (folder / "command.json").write_text(json.dumps(["python", "other_script.py", "--seed", "{seed}"]))
    old_summary = {"label": "gat", "runs": {}, "failed": [], "aggregate": {}}
    (folder / "seeds.json").write_text(json.dumps(old_summary))
    options = ["--tasks", "karate", "--settings", "gat", "--seeds", "0", "--out", str(tmp_path)]
    with pytest.raises(SystemExit, match="holds runs of another command"):
        bench.main(options)
    assert not (tmp_path / "summary.md").exists()
