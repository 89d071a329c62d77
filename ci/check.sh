#!/usr/bin/env bash
# What CI checks, on an environment ci/setup.sh made: the linter and the formatter (ruff), the
# types (mypy on the package), the rendered Dockerfiles, the documentation site (mkdocs build
# --strict: a broken link or a page missing from the nav fails), then the whole test suite.
# Arguments go to pytest (`ci/check.sh tests/unit` for the fast suite alone).
#
# With no arguments (CI), the static checks and the unit suite run beside the integration suite
# (itself in a few processes): the integration tests spend most of their time waiting on BuildKit,
# the registry and PyPI, so on a 2-core machine the rest fits in the gaps (measured:
# docs/ci-time.md). Each side's output is printed whole, one after the other, and the
# run fails if either side failed. ruff runs first and alone: a lint error stops the run at once.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
step() { printf '== %s\n' "$*" >&2; }

static_checks() {
  step "ruff format";       "$bin/ruff" format --check --quiet .
  step "mypy";              "$bin/mypy"
  step "mypy (the fake)";   "$bin/mypy" tests/unit/fakeengine.py  # the unit tests' FakeEngine held to the seam
  step "render --check";    "$bin/build" render --check >/dev/null
  step "mkdocs --strict"
  local site
  site=$(mktemp -d)
  NO_MKDOCS_2_WARNING=1 "$bin/mkdocs" build --strict --quiet --site-dir "$site"
  rm -rf "$site"
}

step "ruff check"; "$bin/ruff" check --quiet .

if [ "$#" -gt 0 ]; then
  static_checks
  step "pytest $*"
  exec "$bin/python" -m pytest "$@"
fi

side=$(mktemp -d)
trap 'rm -rf "$side"' EXIT
# The static checks and the unit suite, in the background, at a lower priority than the
# integration suite (whose builds are the critical path).
(
  set -e
  renice -n 5 -p "$BASHPID" >/dev/null 2>&1 || true
  static_checks
  step "pytest tests/unit"
  "$bin/python" -m pytest tests/unit -q -p no:cacheprovider --basetemp "$side/unit-tmp"
) >"$side/out" 2>&1 &
side_pid=$!

# The integration suite in K3_TEST_PROCESSES processes (pytest-xdist), whole files to a process
# (--dist loadfile: a file's tests share its fixtures and run in its order), handed out slowest
# file first (tests/integration/conftest.py, SLOWEST_FIRST; --no-loadscope-reorder keeps that
# order). Each process makes its own smoke; the test that prunes its own build cache runs alone.
processes=${K3_TEST_PROCESSES:-3}
step "pytest --integration tests/integration, $processes processes (static checks and unit tests beside it)"
integration=0
"$bin/python" -m pytest --integration tests/integration -p no:cacheprovider --durations=25 \
  -n "$processes" --dist loadfile --no-loadscope-reorder || integration=$?

side_rc=0
wait "$side_pid" || side_rc=$?
step "static checks and unit tests (ran beside the integration suite)"
cat "$side/out"
if [ "$side_rc" -ne 0 ] || [ "$integration" -ne 0 ]; then
  printf 'ci/check.sh: static checks and unit tests exit %s, integration tests exit %s\n' "$side_rc" "$integration" >&2
  exit 1
fi
