#!/usr/bin/env bash
# Re-resolve the tool's own environment (ci/requirements.lock) from pyproject.toml's ranges and
# ci/tooling.in: every distribution the tests, linters and docs need, hashed, for Python >= 3.11
# on every platform (a universal resolution). Commit the result; ci/setup.sh installs from it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
UV_NO_CONFIG=1 PIP_CONFIG_FILE=/dev/null .venv/bin/uv pip compile pyproject.toml ci/tooling.in \
  --extra test --extra lint --extra docs --universal --python-version 3.11 --generate-hashes \
  --index-url https://pypi.org/simple --no-header --quiet -o ci/requirements.lock
