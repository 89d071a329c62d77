#!/usr/bin/env bash
# What CI checks, in order, on an environment ci/setup.sh made: the linter and the formatter
# (ruff), the types (mypy on the package), the documentation site (mkdocs build --strict: a
# broken link or a page missing from the nav fails), then the whole test suite. Arguments go to
# pytest (`ci/check.sh tests/unit` for the fast suite alone). The first failure stops the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
step() { printf '== %s\n' "$*" >&2; }
step "ruff check";        "$bin/ruff" check --quiet .
step "ruff format";       "$bin/ruff" format --check --quiet .
step "mypy";              "$bin/mypy"
step "mypy (the fake)";   "$bin/mypy" tests/unit/fakeengine.py  # the unit tests' FakeEngine held to the seam
step "render --check";    "$bin/build" render --check >/dev/null
step "mkdocs --strict"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 "$bin/mkdocs" build --strict --quiet --site-dir "$site"
step "pytest"
if [ "$#" -eq 0 ]; then set -- --integration; fi
"$bin/python" -m pytest "$@"
