#!/usr/bin/env bash
# The demo: set up the engine and registry, make the smoke target for this machine, then
# render, lock and build it exactly as a maintainer would build cu129. The last line printed
# is the pushed image reference REGISTRY/REPO@sha256:... (stdout); progress goes to stderr.
# K3_DEMO_ARM64=1: the smoke names linux/amd64 and linux/arm64 (arm64 under QEMU, which ci/setup.sh
# registers), and the reference printed is the image index naming both platforms' manifests.
set -euo pipefail
cd "$(dirname "$0")/.."
REGISTRY=${REGISTRY:-127.0.0.1:5000}
OUT=${OUT:-smoke}  # the smoke target's own tree: matrix, dockerfiles, locks, artifacts/, sources

bash ci/setup.sh
build=.venv/bin/build
arm64=()
[ "${K3_DEMO_ARM64:-0}" = 1 ] && arm64=(--arm64)
matrix=$("$build" smoke-init "${arm64[@]}" --out "$OUT" --registry "$REGISTRY")
"$build" --matrix "$matrix" render
"$build" --matrix "$matrix" lock --target smoke
"$build" --matrix "$matrix" --target smoke
