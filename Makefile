# pact-book: `make book` renders the book from its committed records; `make reproduce` recomputes
# them; `make test` runs the tests (mk/book.mk lists the book's targets).
# Each target does its own setup and skips what is already up to date.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.pact-setup
PARAMS  ?= default
export PACT_CACHE ?= $(CURDIR)/.cache

# `make zoo` builds the model zoos the default book uses: Lite0 (pactlib.testbeds.lite0.testbed.BOOK_ZOO):
# 3 seeds of full and LoRA fine-tunes on the 8-task suite, one seed of full fine-tunes on the
# 20-task suite (the 14-task suite is its prefix); MiniLM (pactlib.testbeds.minilm.testbed.BOOK_ZOO):
# 3 seeds of full and LoRA fine-tunes on the 8 text tasks, one seed of full fine-tunes on the 14.
# Finished runs are kept; an interrupted build resumes.
.PHONY: help setup sources test data zoo data-lite0 data-minilm zoo-lite0 zoo-minilm bench clean

help:
	@echo "make book       - set up (venv, book assets), render every chapter from its committed records into _build/html"
	@echo "                  [PARAMS=<set in params/>] [THREADS=<torch threads per kernel; default cores/BOOK_JOBS>]"
	@echo "make reproduce  - prepare data and the model zoo, recompute stale or missing chapters [NB=05_main_results], render"
	@echo "make chapter    - recompute one chapter NB=... [ARGS=\"-p name=value\"], render"
	@echo "make publish    - push _build/html to the gh-pages branch;  make readme - the README's verdict table"
	@echo "make test   - set up, then run the test suite (includes the smoke book)"
	@echo "make bench  - engine benchmarks (bench/)"

$(STAMP): requirements.txt requirements.lock requirements-nodeps.txt pyproject.toml
	@command -v python3 >/dev/null || { echo "error: python3 (3.11) is needed to create $(VENV)" >&2; exit 1; }
	@test -x $(PY) || python3 -m venv $(VENV) || { echo "error: could not create $(VENV) (apt-get install python3-venv?)" >&2; exit 1; }
	@echo ">> installing pinned Python packages into $(VENV) (first time: a few minutes, ~6 GB)"
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r requirements.txt -c requirements.lock || { echo "error: pip could not install the pinned set in requirements.txt" >&2; exit 1; }
	$(PIP) install --quiet --no-deps -r requirements-nodeps.txt || { echo "error: pip could not install requirements-nodeps.txt" >&2; exit 1; }
	$(PIP) install --quiet --no-deps --no-build-isolation -e . || { echo "error: could not install pactlib" >&2; exit 1; }
	@touch $@

setup: $(STAMP) sources book-assets

sources: $(STAMP)
	@bash scripts/setup_sources.sh

# One testbed family's inputs: data-lite0 zoo-lite0 (images), data-minilm zoo-minilm (texts);
# `make reproduce NB=...` builds only the family its chapter names (scripts/run_notebooks.py --needs).
data: data-lite0 data-minilm
zoo: zoo-lite0 zoo-minilm

data-lite0: setup
	$(VENV)/bin/pact data prepare --suite 20

data-minilm: setup
	$(VENV)/bin/pact text prepare --suite 14

zoo-lite0: data-lite0
	$(PY) -m pactlib.testbeds.lite0.testbed default

zoo-minilm: data-minilm
	$(PY) -m pactlib.testbeds.minilm.testbed default

include mk/book.mk

# The suite runs on every core (pytest-xdist; -n auto: one worker per core); each module stays on
# one worker (--dist loadfile), so its module-scoped fixtures are built once.
test: setup
	$(PY) -m pytest -q -n auto --dist loadfile

# bench_reference compares with the public reference code: clone each repository and name it, e.g.
# make bench REF_TIES=~/ties-merging REF_TSV=~/task_singular_vectors REF_ISO=~/iso-merging REF_TASK_VECTORS=~/task_vectors
# bench_mergekit times `pact merge` beside mergekit on the same files when MERGEKIT names a mergekit-yaml.
# mergekit is never a dependency of pactlib: give it a venv of its own, outside this repository, e.g.
#   python3 -m venv ~/mergekit-venv && ~/mergekit-venv/bin/pip install mergekit
#   make bench MERGEKIT=~/mergekit-venv/bin/mergekit-yaml
bench: setup
	$(PY) bench/bench_filter.py
	$(PY) bench/bench_pact_floor.py
	$(PY) bench/bench_zoo.py
	$(PY) bench/bench_merge_scale.py --full --blocks 1 --tasks 2 8 20 --old-path-max-tasks 0
	$(PY) bench/bench_merge_scale.py --append --full --model vit_l14 --blocks 1 --tasks 2 20 --methods task_arithmetic iso_c --modes none pact-rsvd --old-path-max-tasks 0
	$(PY) bench/bench_reference.py $(if $(REF_TASK_VECTORS),--task-vectors-repo $(REF_TASK_VECTORS)) \
		$(if $(REF_TIES),--ties-repo $(REF_TIES)) $(if $(REF_TSV),--tsv-repo $(REF_TSV)) $(if $(REF_ISO),--iso-repo $(REF_ISO))
	$(if $(MERGEKIT),$(PY) bench/bench_mergekit.py --mergekit $(MERGEKIT),@echo "bench_mergekit skipped: set MERGEKIT=<venv>/bin/mergekit-yaml")

clean:
	rm -rf _build book/_executed .pytest_cache
