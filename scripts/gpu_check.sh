#!/usr/bin/env bash
# GPU check: the paper path (PACT filter, merges, CLIP evaluation, α search, chapters 3 and 10 on a
# clip testbed: Fisher, masks, loss and scores of CPU weights on the GPU model) on ViT-B/32-shaped
# random weights, timed on cuda vs the CPU, with peak GPU memory; a table on stdout and
# gpu_check.json under $OUT (or results/). No GPU: says so and exits 0. Under 10 minutes.
#
#   bash scripts/gpu_check.sh                 # on a machine with a GPU
#   bash scripts/gpu_check.sh --cpu-smoke     # tiny shapes on the CPU, seconds (self-test)
#   bash scripts/gpu_check.sh --budget-s 300 --no-cpu --out /tmp/gc
#
# Arguments go to bench/gpu_check.py (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ]; then PY=python3; fi
exec "$PY" bench/gpu_check.py "$@"
