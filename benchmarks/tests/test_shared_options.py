"""The pieces the benchmark CLIs share (benchmarks.harness, benchmarks.report): options, presets, versions."""

import argparse
from pathlib import Path

import pytest

from benchmarks import attention, generation, model_step, peers, serving
from benchmarks.harness import (
    ALLOCATORS,
    ProcessOptions,
    fill_from_preset,
    launch,
    package_version,
    sweep,
    use_allocator,
)
from benchmarks.report import ok_points
from benchmarks.studies import fidelity, graph_scale


@pytest.mark.parametrize(
    ("name", "parse"),
    [
        ("attention", lambda: attention.make_parser().parse_args([])),
        ("model_step", lambda: model_step.make_parser().parse_args([])),
        ("generation", lambda: generation.make_parser().parse_args([])),
        ("serving", lambda: serving.make_parser().parse_args([])),
        ("fidelity", lambda: fidelity.make_parser().parse_args([])),
        ("peers", lambda: peers.parse_args([])),
    ],
)
def test_each_benchmark_writes_to_its_own_results_folder(name, parse):
    args = parse()
    assert args.out == Path("benchmarks/results") / name
    if name not in ("fidelity", "peers"):  # the benchmarks with presets start from the full one
        assert args.preset == "full"


def test_in_process_is_an_option_of_every_harness_based_benchmark():
    """The test suite's smoke runs use it (no process start-up per point); the default runs workers."""
    for parser in (attention, model_step, generation, serving, graph_scale):
        assert parser.make_parser().parse_args(["--in_process"]).in_process
        assert not parser.make_parser().parse_args([]).in_process
    assert peers.parse_args(["--in_process"]).in_process


def test_a_point_in_process_leaves_the_allocator_alone_and_says_so(monkeypatch):
    """An allocator setting would outlive the point in the calling process (a test worker), so in process
    it is not applied; the record, or a failure's, says the point ran in process."""
    applied = []
    monkeypatch.setitem(ALLOCATORS, "keep", lambda: applied.append("keep"))

    def point_function(point):
        use_allocator(point)
        if point.fail:
            raise RuntimeError("boom")
        return {"status": "ok"}

    options = ProcessOptions(threads=1, timeout=10.0, in_process=True)
    record = launch(point_function, {"allocator": "keep", "fail": False}, {}, options)
    assert record == {"status": "ok", "in_process": True} and applied == []
    failed = launch(point_function, {"allocator": "keep", "fail": True}, {"n": 1}, options)
    assert failed == {"n": 1, "status": "error: RuntimeError: boom", "in_process": True}
    use_allocator(argparse.Namespace(allocator="keep"))  # in a worker it is applied
    assert applied == ["keep"]


def test_fill_from_preset_fills_only_what_the_user_left_unset():
    args = argparse.Namespace(lengths=None, repeats=2, model=None, heads=None, warmup=0)
    preset = {"lengths": [64], "repeats": 3, "model": {"hidden_size": 32}, "warmup": 4, "points": {"text": 1}}
    fill_from_preset(args, preset, heads=8, repeats=1)
    assert args.lengths == [64] and args.heads == 8
    assert args.repeats == 2 and args.warmup == 0  # given, even 0, stays
    assert args.model == '{"hidden_size": 32}'  # a dict becomes the JSON its option takes
    assert not hasattr(args, "points")  # a preset key that is no option is left alone


def test_sweep_shows_a_points_scalar_fields_not_its_lists(capsys):
    """The progress bar names the point by its scalar fields: a batch's example ids (the padding-free
    benchmark's ``rows``, 16 lists of review ids) made each update a terminal's worth of numbers."""
    points = [{"type": "full", "length": 32, "rows": [[24716, 22667, 23456], [104, 10065, 10570]]}]
    records = sweep(points, lambda p: {**p, "status": "failed"}, lambda p: p["type"], desc="b")
    assert records[0]["status"] == "failed"
    shown = "".join(capsys.readouterr())  # the bar on stderr, the failure written above it on stdout
    assert "full 32]" in shown and "full 32: failed" in shown and "24716" not in shown


def test_package_version_is_none_for_a_package_that_is_not_installed():
    assert package_version("no-such-distribution-for-this-test") is None
    assert package_version("torch")


def test_ok_points_leave_out_failed_points_and_unknown_values():
    records = [
        {"status": "ok", "length": 128, "mfu": 0.5},
        {"status": "ok", "length": 64, "mfu": 0.25},
        {"status": "ok", "length": 256, "mfu": None},  # no FLOP model: nothing to plot
        {"status": "timeout", "length": 512},
    ]
    assert ok_points(records, "length", "mfu") == [(64, 0.25), (128, 0.5)]


def test_the_benchmarks_package_stays_within_its_line_budget():
    """benchmarks/*.py (the benchmarks, their harness and report) stays at most 4,500 lines: a one-off
    measurement goes to benchmarks/studies/, which builds on them. The bound was once crossed unnoticed."""
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    lines = sum(len(path.read_text().splitlines()) for path in root.glob("*.py"))
    assert lines <= 4500, f"benchmarks/*.py holds {lines} lines: move what is a study to benchmarks/studies/"
