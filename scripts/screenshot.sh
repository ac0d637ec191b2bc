#!/usr/bin/env bash
# Headless-Chromium screenshots of the rendered book: the front page and the main-results
# chapter. Usage: scripts/screenshot.sh [HTML_DIR] [OUT_DIR]
#   HTML_DIR defaults to _build/html (the book built with PARAMS=default); OUT_DIR to _build/screenshots.
# Needs Debian's chromium (apt-get install -y chromium). Nothing is fetched: the book is local.
set -euo pipefail
cd "$(dirname "$0")/.."
html=${1:-_build/html}
out=${2:-_build/screenshots}
set_name=${PARAMS:-default}
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "error: chromium not found (apt-get install -y chromium)" >&2; exit 1; }
[ -f "$html/index.html" ] || { echo "error: $html/index.html not found: build the book first (make book)" >&2; exit 1; }
mkdir -p "$out"
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT

shot() {  # shot PAGE PNG
  local page=$1 png=$2
  [ -f "$page" ] || { echo "error: $page not found" >&2; exit 1; }
  timeout 60 "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
    --disable-component-update --no-first-run --hide-scrollbars --user-data-dir="$profile" \
    --window-size=1280,1600 --virtual-time-budget=4000 \
    --screenshot="$png" "file://$(realpath "$page")" >/dev/null 2>&1 || {
      echo "error: chromium could not screenshot $page" >&2; exit 1; }
  [ -s "$png" ] || { echo "error: chromium wrote no $png" >&2; exit 1; }
  echo ">> $png"
}

shot "$html/book/intro.html" "$out/index.png"   # index.html only redirects to the intro
shot "$html/book/_executed/$set_name/05_main_results.html" "$out/05_main_results.png"
