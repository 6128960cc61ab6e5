# Set-up and entry points. Every target creates .venv on first use and installs torch's CPU wheel first
# (an unpinned torch would pull a multi-GB CUDA build), then this package with its test extras.
VENV ?= .venv
PY := $(VENV)/bin/python
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: install test lint demo bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	$(PY) -m pytest -q

# Main job: attention benchmark at small sizes for every registered mechanism (JSON, table, plots),
# plus a picture of each mechanism's attention pattern.
demo: install
	$(PY) benchmarks/attention.py --preset demo --threads 2 --out benchmarks/results/demo
	$(PY) benchmarks/patterns.py --out benchmarks/results/demo/patterns.png

# The full attention benchmark (about half an hour on 2 cores).
bench: install
	$(PY) benchmarks/attention.py --preset full --threads 2 --out benchmarks/results/attention

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
