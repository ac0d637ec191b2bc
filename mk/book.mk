# The book pipeline, included from the Makefile (`include mk/book.mk`).
# Assumes: $(PY) (the venv's python), $(STAMP) (the file that says the venv is ready),
# $(PARAMS) (default: default) and the targets `setup` (venv, data sources, book assets), `data`, `zoo`.
#
# A chapter's results are records committed under book/records/<set>/<run>/<chapter>/ with their
# provenance (scripts/run_notebooks.py, pactlib/book/provenance.py). Reading and computing are apart:
#
#   make book                      venv + book assets only (no data, no zoo), then every chapter and
#                                  variant executed by papermill in present mode (figures, tables and
#                                  verdicts from the records; compute cells shown, not run; stale or
#                                  missing records say so at the chapter's top), render, check the HTML,
#                                  and (PARAMS=default) the README's verdict table
#   make reproduce [NB=05_main_results]   the data the chapters need, then compute mode for every stale
#                                  or missing chapter (or NB), resumable, with the time left; the
#                                  runner builds or completes the zoos they read as jobs of its pool
#                                  (one family's zoo trains beside the other family's chapters);
#                                  then present + render. ARGS="--force" recomputes current ones
#   make chapter NB=05_main_results ARGS="-p alpha_points=5"   compute that chapter, then render.
#                                  RUN=main (or a variant: RUN=minilm) computes that run only, and
#                                  builds only the zoo of its family (reproduce takes RUN= too)
#                                  With -p the records go to book/records/_scratch/<set>/ and the book to
#                                  _build/_scratch/<set>/: other parameters never overwrite a set's records
#   make book PARAMS=smoke         the same with params/smoke.yaml (HTML in _build/smoke/_build/html;
#                                  records of sets other than default are not committed)
#   make publish                   push _build/html to the gh-pages branch (ghp-import)
#   make readme                    regenerate README.md's verdict table from book/records/default
#   make book-check [ARGS=...]     validate every notebook's parameters; builds and runs nothing
#   make book-screenshot           headless-Chromium PNGs of the front page, chapter 5 and the Verdicts page
#                                  (also 420 px wide);
#                                  fails when a page makes a network request
#
# Parameters are validated first (book-check / chapter-check / reproduce-check, with the venv only):
# a wrong value fails in seconds, before any data or zoo is built.
# BOOK_DEPS: the targets that produce the computed chapters' inputs: `data-<family> zoo-<family>` for
# each built-in family a run names a testbed of (Lite0 with its default zoo, MiniLM; `data zoo` when
# both; scripts/run_notebooks.py --needs), else nothing. Without the venv (e.g. `make -n` on a fresh clone) the answer is `data zoo`.
BOOK_DEPS   ?= $(if $(wildcard $(PY)),$(shell $(PY) scripts/run_notebooks.py --params $(PARAMS) --needs $(BOOK_ONLY) $(ARGS)),data zoo)
# BOOK_JOBS: notebooks executed at once (each kernel gets cores/BOOK_JOBS threads). On two cores
# two 1-thread kernels get more done than one 2-thread kernel (book/data/implementation_choices.jsonl).
BOOK_JOBS   ?= 2
# THREADS: torch threads of each kernel (--threads); empty: the set's `threads:`, else cores / BOOK_JOBS.
THREADS     ?=
BOOK_RUN     = $(PY) scripts/run_notebooks.py --params $(PARAMS) --jobs $(BOOK_JOBS)$(if $(THREADS), --threads '$(THREADS)')
GHP_IMPORT   = $(dir $(PY))ghp-import

.PHONY: book reproduce chapter publish readme book-setup book-assets book-check chapter-check reproduce-check book-screenshot

book-assets:
	@bash scripts/setup_book_assets.sh

# what `make book` needs: the venv and the offline assets, no data and no zoo
book-setup: $(STAMP) book-assets

book: book-check
	@$(MAKE) --no-print-directory book-setup
	$(BOOK_RUN) --mode present $(ARGS)
	$(if $(filter default,$(PARAMS)),$(PY) scripts/readme_verdicts.py)

reproduce: BOOK_ONLY = $(if $(NB),--only $(NB))$(if $(RUN), --run $(RUN))
reproduce: reproduce-check
	@$(MAKE) --no-print-directory setup $(filter data%,$(BOOK_DEPS))
	$(BOOK_RUN) --mode compute $(BOOK_ONLY) $(ARGS)

chapter: BOOK_ONLY = --only $(NB)$(if $(RUN), --run $(RUN))
chapter: chapter-check
	@$(MAKE) --no-print-directory setup $(filter data%,$(BOOK_DEPS))
	$(BOOK_RUN) --mode compute $(BOOK_ONLY) $(ARGS)

publish:
	@test -f _build/html/index.html || { echo "error: no _build/html/index.html: run make book first" >&2; exit 1; }
	$(GHP_IMPORT) -n -p -f _build/html

readme: $(STAMP)
	$(PY) scripts/readme_verdicts.py

# Validate the parameters (names, types and values: scripts/run_notebooks.py --check-only) of
# every notebook / of notebook $(NB), against params/$(PARAMS).yaml and ARGS; executes nothing.
book-check: $(STAMP)
	$(BOOK_RUN) --check-only $(ARGS)

reproduce-check: $(STAMP)
	$(BOOK_RUN) $(if $(NB),--only $(NB))$(if $(RUN), --run $(RUN)) --check-only $(ARGS)

chapter-check: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make chapter NB=05_main_results [PARAMS=default] [THREADS=N] [ARGS='-p alpha_points=5 --force']" >&2; exit 2; }
	$(BOOK_RUN) --only $(NB)$(if $(RUN), --run $(RUN)) --check-only $(ARGS)

book-screenshot:
	$(PY) scripts/screenshot.py --set $(PARAMS) --html $(if $(filter default,$(PARAMS)),_build/html,_build/$(PARAMS)/_build/html)
