#!/usr/bin/env bash
# Offline math for the book: install MathJax 3 from npm (once, into .cache/npm) and copy its
# es5/ bundle to book/mathjax/es5 (git-ignored). _config.yml lists book/mathjax as an HTML
# static path and sets mathjax_path: es5/tex-mml-chtml.js, so the rendered pages load
# _static/es5/tex-mml-chtml.js and never a CDN. Idempotent: does nothing when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

MATHJAX_VERSION=3.2.2
prefix=${PACT_NPM_PREFIX:-.cache/npm}
src=$prefix/node_modules/mathjax
dest=book/mathjax
stamp=$dest/.version

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$MATHJAX_VERSION" ] && [ -f "$dest/es5/tex-mml-chtml.js" ]; then
  exit 0
fi
if ! grep -qs "\"version\": \"$MATHJAX_VERSION\"" "$src/package.json"; then
  command -v npm >/dev/null || {
    echo "error: npm is needed once to fetch mathjax@$MATHJAX_VERSION (apt-get install -y npm)" >&2; exit 1; }
  echo ">> installing mathjax@$MATHJAX_VERSION into $prefix (npm)"
  npm install --prefix "$prefix" --no-audit --no-fund --silent "mathjax@$MATHJAX_VERSION" || {
    echo "error: npm could not install mathjax@$MATHJAX_VERSION into $prefix" >&2; exit 1; }
fi
[ -f "$src/es5/tex-mml-chtml.js" ] || { echo "error: $src/es5/tex-mml-chtml.js is missing" >&2; exit 1; }

# Copy to a temporary folder first, then swap it in, so a half copy is never used.
mkdir -p "$dest"
tmp=$(mktemp -d "$dest/.es5.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -R "$src/es5/." "$tmp/"
rm -rf "$dest/es5"
chmod 755 "$tmp"
mv "$tmp" "$dest/es5"
trap - EXIT
echo "$MATHJAX_VERSION" > "$stamp"
echo ">> MathJax $MATHJAX_VERSION copied to $dest/es5"
