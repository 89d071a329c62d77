#!/usr/bin/env bash
# The demo: set up the engine and registry, make the smoke target for this machine, then
# render, lock and build it exactly as a maintainer would build cu129. The last line printed
# is the pushed image reference REGISTRY/REPO@sha256:... (stdout); progress goes to stderr.
# The smoke names linux/amd64 and linux/arm64, as cu129 does (arm64 under QEMU off arm64, which
# ci/setup.sh registers), and the reference printed is the OCI image index naming both platforms'
# manifests. K3_DEMO_ARM64=0, or a machine that cannot run linux/arm64 (said on stderr), builds
# linux/amd64 alone and prints that image's reference. K3_DEMO_REPOSITORY (default k3/smoke) is the
# registry repository it pushes to: the suite's test of this script passes one of its own, so the
# user's demo image in k3/smoke is never replaced or deleted by a test run.
# At the end (or on a failure) it prints to stderr where its time went: the tool's own step
# timings (each command appends them to K3_STEP_TIMES) and its total time; stdout's last line
# stays the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
REGISTRY=${REGISTRY:-127.0.0.1:5000}
OUT=${OUT:-smoke}  # the smoke target's own tree: matrix, dockerfiles, locks, artifacts/, sources
REPOSITORY=${K3_DEMO_REPOSITORY:-k3/smoke}

started=$SECONDS
K3_STEP_TIMES=$(mktemp "${TMPDIR:-/tmp}/k3-demo-times.XXXXXX")
export K3_STEP_TIMES
timings() {
  local code=$? took=$((SECONDS - started))
  {
    echo "ci/demo.sh: where the time went (the tool's steps of 1 s or more, in the order they ended; an outer step includes the steps inside it, and steps side by side overlap):"
    awk -F '\t' '$1 >= 1 { printf "  %7.1fs  %-11s %s\n", $1, $2, $3 }' "$K3_STEP_TIMES"
    echo "ci/demo.sh: setup ${setup_took:-?} s; total $((took / 60)) min $((took % 60)) s ($took s)$([ "$code" = 0 ] || echo ", FAILED with exit $code")"
  } >&2
  rm -f "$K3_STEP_TIMES"
}
trap timings EXIT

bash ci/setup.sh
setup_took=$((SECONDS - started))
build=.venv/bin/build
arm64=(--arm64)
if [ "${K3_DEMO_ARM64:-1}" = 0 ]; then
  arm64=()
elif [ "$(uname -m)" != aarch64 ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  echo "ci/demo.sh: linux/arm64 cannot run here (qemu-aarch64 is not registered with binfmt_misc): linux/amd64 only" >&2
  arm64=()
fi
matrix=$("$build" smoke-init "${arm64[@]}" --out "$OUT" --registry "$REGISTRY" --repository "$REPOSITORY")
"$build" --matrix "$matrix" render
"$build" --matrix "$matrix" lock --target smoke
"$build" --matrix "$matrix" --target smoke
