"""The padding-free benchmark (benchmarks/studies/padding_free.py) at its smoke size: every distribution,
type, side and mode measured on the same real batch, the ratios and the ideal printed, the report written."""

import json

import pytest

from benchmarks.studies import padding_free


def test_padding_free_benchmark_smoke(tmp_path):
    """In process (``--in_process``): IMDB reviews through the text encoder (and transformers' ModernBERT),
    molecules through the graph encoder, padded and padding-free, training step and inference. The
    long-document distribution runs the same text code on other rows (its rows are the next test's; building
    its documents counts the tokens of 25,000 reviews, 20 s)."""
    options = ["--preset", "smoke", "--threads", "1", "--in_process", "--types", "full", "linear"]
    options += ["--distributions", "imdb", "molecules"]
    results = padding_free.main([*options, "--out", str(tmp_path)])
    records = results["records"]
    assert {r["status"] for r in records} == {"ok"}, records
    points = {(r["distribution"], r["attention_type"], r["side"], r["mode"]) for r in records}
    ours = {(d, t, s, m) for d in ("imdb", "molecules") for t in ("full", "linear")
            for s in ("padded", "padding_free") for m in padding_free.MODES}  # fmt: skip
    modernbert = {("imdb", padding_free.MODERNBERT_ROW, "modernbert_sdpa", m) for m in padding_free.MODES}
    paired = {(d, t, "paired", "forward") for d in ("imdb", "molecules") for t in ("full", "linear")}
    assert points == ours | modernbert | paired
    for distribution in ("imdb", "molecules"):  # every side of a distribution ran the same examples
        same = {
            (r["real_tokens"], tuple(r["padded_shape"])) for r in records if r["distribution"] == distribution
        }
        assert len(same) == 1
    for r in records:
        assert 0 < r["padding_share"] < 1  # the drawn batches hold padding
        if r["side"] != "paired":
            assert r["tokens_per_s"] == pytest.approx(r["real_tokens"] / r["median_s"])
            continue
        medians, times = r["medians_s"], r["times_s"]  # both sides' calls in one process, in turn
        repeats = padding_free.REPEATS_FACTOR.get(r["distribution"], 1)  # x the smoke preset's 1
        assert len(times["padded"]) == len(times["padding_free"]) == repeats
        assert r["ratio"] == pytest.approx(medians["padded"] / medians["padding_free"])
    meta = json.loads((tmp_path / "results.json").read_text())["meta"]
    assert meta["batch"] == 4 and meta["type_configs"] == {"full": {}, "linear": {}}
    summary = (tmp_path / "summary.md").read_text()
    assert "### imdb, training step" in summary and "### molecules, inference" in summary
    share = next(r["padding_share"] for r in records if r["distribution"] == "imdb")
    assert f"| {share:.0%} | x{1 / (1 - share):.2f} |" in summary
    assert summary.count("paired: the speed ratio") == 2  # under imdb's and molecules' inference tables
    assert (tmp_path / "padding_free.png").stat().st_size > 1000


def test_long_document_rows_become_documents_joined_as_the_set_joins_them():
    """A long-document row is a list of IMDB review ids: its text is those reviews joined by the set's
    separator (one [SEP] token between reviews), cut at the distribution's 4,096 tokens."""
    batch = padding_free.text_batch([[0, 1, 2], [3]], padding_free.MAX_LENGTHS["long_documents"])
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    separators = [int((row[real] == 102).sum()) for row, real in zip(ids, mask, strict=True)]  # [SEP] = 102
    assert separators == [3, 1]  # two between the three reviews and the last; one review alone
    assert mask[0].sum() > mask[1].sum() and 512 < ids.shape[1] <= 4096  # not cut at IMDB's 512


def test_rounds_give_each_cell_its_median_and_each_ratio_its_range():
    """Three rounds of one point's two sides: a cell holds the median time's tokens/s and the median peak;
    the speed-up is the median of the rounds' own ratios (not the ratio of the medians), their range beside
    it; a side that failed in any round is reported failed."""

    def record(side, round_index, seconds, peak):
        return {"distribution": "imdb", "attention_type": "full", "side": side, "mode": "forward",
                "round": round_index, "status": "ok", "median_s": seconds, "peak_mib": peak,
                "real_tokens": 100, "padding_share": 0.5}  # fmt: skip

    padded = [record("padded", i, t, 10.0 + i) for i, t in enumerate((2.0, 3.0, 4.0))]
    free = [record("padding_free", i, t, 5.0) for i, t in enumerate((1.0, 2.0, 1.0))]
    meta = {"model": {}, "batch": 2, "threads": 1, "rounds": 3}
    summary = padding_free.summarize(padded + free, meta)
    assert "1 threads, 3 rounds" in summary
    # padded: median 3.0 s -> 33 tokens/s, peak 11; ratios 2.0, 1.5, 4.0 -> median 2.0, range 1.50-4.00
    assert "| full | 33 / 11 | 100 / 5 | - | x2.00 (1.50-4.00) / x0.45 | 50% | x2.00 |" in summary
    free[1] = {**free[1], "status": "out of memory", "median_s": None}
    row = next(
        line for line in padding_free.summarize(padded + free, meta).splitlines() if "| full |" in line
    )
    assert "out of memory" in row and "x2.00" not in row


def test_a_paired_point_gives_the_inference_ratio_and_the_sides_give_the_cells():
    """A molecule point's inference ratio is the median of its paired rounds' ratios (both sides' calls in
    turn in one process), not that of the two sides' separate points, whose tokens/s and memory fill the
    cells; a training step's ratio stays the separate points' even where paired records exist (an earlier
    run's: two models training in one process are not what a user runs)."""

    def record(side, mode, round_index, **fields):
        return {"distribution": "molecules", "attention_type": "full", "side": side, "mode": mode,
                "round": round_index, "status": "ok", "real_tokens": 100, "padding_share": 0.5,
                **fields}  # fmt: skip

    records = [
        record(side, mode, i, median_s=1.0, peak_mib=4.0)
        for side in ("padded", "padding_free")
        for mode in padding_free.MODES
        for i in range(3)
    ]
    records += [
        record("paired", m, i, ratio=r) for m in padding_free.MODES for i, r in enumerate((1.3, 1.2, 1.5))
    ]
    summary = padding_free.summarize(records, {"model": {}, "batch": 2, "threads": 1, "rounds": 3})
    training, inference = summary.split("### molecules, inference")
    assert "| full | 100 / 4 | 100 / 4 | - | x1.30 (1.20-1.50) paired / x1.00 | 50% | x2.00 |" in inference
    assert "| full | 100 / 4 | 100 / 4 | - | x1.00 (1.00-1.00) / x1.00 | 50% | x2.00 |" in training
    assert "paired: the speed ratio of both sides' calls in turn in one process." in inference
    assert "paired" not in training.split("### molecules, training step")[1]


def test_rounds_below_one_are_refused(capsys):
    with pytest.raises(SystemExit) as raised:
        padding_free.main(["--preset", "smoke", "--rounds", "0"])
    assert raised.value.code == 2 and "--rounds must be at least 1, got 0" in capsys.readouterr().err
