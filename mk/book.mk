# The book pipeline, included from the Makefile (`include mk/book.mk`).
# Assumes: $(PY) (the venv's python), $(STAMP) (the file that says the venv is ready),
# $(PARAMS) (default: default) and a `setup` target that includes `book-assets`.
#
#   make book                      set up, prepare data + zoo, execute changed notebooks, render
#   make book PARAMS=smoke         the same with params/smoke.yaml (HTML in _build/smoke/_build/html)
#   make book PARAMS=paper-vitb32-8  chapters 3-12 on your CLIP checkpoints (edit the file's paths first)
#   make chapter NB=05_main_results [ARGS="-p alpha_points=5 --force"]
#   make book PARAMS=paper-vitb32-8 THREADS=16   torch threads of each kernel (default below)
#   make book-check [ARGS=...]     validate every notebook's parameters; builds and runs nothing
#   make book-screenshot           headless-Chromium PNGs of the front page and chapter 5
#
# `book` and `chapter` validate the parameters (params/$(PARAMS).yaml, ARGS) first, with the
# venv only, and build the data, the zoo and the rest of the setup only once that passed (a
# sub-make after the check, so the order holds under -j too): a wrong value fails in seconds.
#
# BOOK_DEPS: the targets that produce the notebooks' inputs (data, model zoo); empty to skip. The
# runner derives them from what the chapters (of `chapter`: chapter $(NB)) name under the set and
# ARGS (`scripts/run_notebooks.py --needs`): `data zoo` when a run names a built-in testbed that
# reads them (Lite0 with its default zoo, MiniLM), else nothing. So the default set builds both,
# while a set that runs on the user's CLIP files and on testbeds that build themselves in seconds
# (synthetic, Lite0's smoke zoo: params/paper-*.yaml, params/smoke.yaml) builds neither, whether
# PARAMS names it or gives its path (`make book PARAMS=$$PWD/params/paper-vitb32-8.yaml`). Without
# the venv (e.g. `make -n` on a fresh clone) the answer is `data zoo`.
# BOOK_INPUTS: globs of files whose content is part of every notebook's cache key (the data and
# zoo manifests): when they change, every notebook runs again.
BOOK_DEPS   ?= $(if $(wildcard $(PY)),$(shell $(PY) scripts/run_notebooks.py --params $(PARAMS) --needs $(BOOK_ONLY) $(ARGS)),data zoo)
BOOK_INPUTS ?= $(PACT_CACHE)/zoo/**/manifest.json $(PACT_CACHE)/zoo-minilm/manifest.json $(PACT_CACHE)/data/**/manifest.json
# BOOK_JOBS: notebooks executed at once (each kernel gets cores/BOOK_JOBS threads). On two cores
# two 1-thread kernels get more done than one 2-thread kernel (book/data/implementation_choices.jsonl).
BOOK_JOBS   ?= 2
# THREADS: torch threads of each kernel (the runner's --threads, a whole number >= 1). Empty: the
# set's `threads:` (common: or a chapter's section), else cores / BOOK_JOBS. Checked with the
# parameters, before anything is built; a new count re-executes no chapter (not in the cache key).
THREADS     ?=
BOOK_RUN     = PACT_BOOK_INPUTS="$(BOOK_INPUTS)" $(PY) scripts/run_notebooks.py --params $(PARAMS) --jobs $(BOOK_JOBS)$(if $(THREADS), --threads '$(THREADS)')

.PHONY: book chapter book-assets book-check chapter-check book-screenshot

book-assets:
	@bash scripts/setup_book_assets.sh

book: book-check
	@$(MAKE) --no-print-directory setup $(BOOK_DEPS)
	$(BOOK_RUN) $(ARGS)

chapter: BOOK_ONLY = --only $(NB)
chapter: chapter-check
	@$(MAKE) --no-print-directory setup $(BOOK_DEPS)
	$(BOOK_RUN) --only $(NB) $(ARGS)

# Validate the parameters (names, types and values: scripts/run_notebooks.py --check-only) of
# every notebook / of notebook $(NB), against params/$(PARAMS).yaml and ARGS; executes nothing.
book-check: $(STAMP)
	$(BOOK_RUN) --check-only $(ARGS)

chapter-check: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make chapter NB=05_main_results [PARAMS=default] [THREADS=N] [ARGS='-p alpha_points=5 --force']" >&2; exit 2; }
	$(BOOK_RUN) --only $(NB) --check-only $(ARGS)

book-screenshot:
	PARAMS=$(PARAMS) bash scripts/screenshot.sh $(if $(filter default,$(PARAMS)),_build/html,_build/$(PARAMS)/_build/html)
