#!/usr/bin/env bash
# The demo: set up the engine and registry, make the smoke target for this machine, then
# render, lock and build it exactly as a maintainer would build cu129. The last line printed
# is the pushed image reference REGISTRY/REPO@sha256:... (stdout); progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
REGISTRY=${REGISTRY:-127.0.0.1:5000}
OUT=${OUT:-smoke}  # the smoke target's own tree: matrix, dockerfiles, locks, artifacts/, sources

bash ci/setup.sh
build=.venv/bin/build
matrix=$("$build" smoke-init --out "$OUT" --registry "$REGISTRY")
"$build" --matrix "$matrix" render
"$build" --matrix "$matrix" lock --target smoke
"$build" --matrix "$matrix" --target smoke
