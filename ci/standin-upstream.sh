#!/usr/bin/env bash
# A stand-in for upstream's cu129 image, by hand (issue 37; not run by CI: ~4 GB from PyPI).
#
# Docker Hub is out of reach here, so `vllm/vllm-openai:v0.30.0-cu129` cannot be pulled. Its public
# defect (vLLM #56829) is CUDA 13 pieces beside cu129 ones; PyPI's plain torch 2.13.0 and vLLM 0.30.0
# are CUDA 13 builds, so this puts exactly those onto a CUDA 12.9 image:
#   - BASE (the demo image, `ci/demo.sh`'s last line: CUDA 12.9's runtime from nvidia-cuda-runtime-cu12);
#   - torch==2.13.0 from PyPI WITH its dependencies (the nvidia-* CUDA 13 wheels, triton, ...);
#   - vllm==0.30.0 from PyPI WITHOUT its dependencies (its ~100 others are left out to keep the
#     download small: findings that only say a vLLM dependency is missing are this stand-in's, not
#     upstream's), its console scripts dropped (pip --target writes them for this host's Python).
# Then vet it for cu129: .venv/bin/build vet --target cu129 --image TAG --no-source
#
# Usage: ci/standin-upstream.sh BASE [TAG]   prints TAG (default k3-standin-upstream:local)
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: ci/standin-upstream.sh BASE [TAG]}
tag=${2:-k3-standin-upstream:local}
work=$(mktemp -d /tmp/k3-standin.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Only PyPI: no pip.conf or find-links of this machine (they may hold a CPU torch of the same version).
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL
site=$(docker run --rm --network none --entrypoint python "$base" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pyver=$(docker run --rm --network none --entrypoint python "$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
common=(--quiet --only-binary :all: --python-version "$pyver" --index-url https://pypi.org/simple --target "$work/site")
for glibc in $(seq 35 -1 17); do common+=(--platform "manylinux_2_${glibc}_x86_64"); done
common+=(--platform manylinux2014_x86_64)
.venv/bin/pip install "${common[@]}" torch==2.13.0
.venv/bin/pip install "${common[@]}" --no-deps vllm==0.30.0
rm -rf "$work/site/bin"
printf 'FROM %s\nCOPY site/ %s/\n' "$base" "$site" >"$work/Dockerfile"
docker buildx build --load -q -t "$tag" "$work" >/dev/null
du -sh "$work/site" >&2
echo "$tag"
