"""The tool's own environment is locked (ci/requirements.lock): every range in pyproject.toml and
ci/tooling.in has one pinned, hashed distribution in the lock that satisfies it, and ci/setup.sh
installs from the lock alone (`pip check` there covers what extras such as
cyclonedx-python-lib[json-validation] pull in). A dependency added to pyproject.toml without re-locking fails here
(run ci/lock-tools.sh)."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

LOCK = REPO / "ci" / "requirements.lock"
EXTRAS = ("test", "lint", "docs")  # the extras ci/lock-tools.sh resolves


def _locked() -> dict[str, list[tuple[Version, int]]]:
    """name -> [(version, hash count)] (a universal lock may pin a name twice, under markers)."""
    entries: dict[str, list[tuple[Version, int]]] = {}
    text = LOCK.read_text()
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        head = block.split("\\", 1)[0].strip()
        if not head or head.startswith("#"):
            continue
        name, _, rest = head.partition("==")
        version = rest.split(";", 1)[0].strip()
        entries.setdefault(canonicalize_name(name), []).append((Version(version), block.count("--hash=sha256:")))
    return entries


def _wanted() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in EXTRAS:
        lines += project["optional-dependencies"][extra]
    tooling = (REPO / "ci" / "tooling.in").read_text().splitlines()
    lines += [ln for ln in tooling if ln.strip() and not ln.startswith("#")]
    return [Requirement(ln) for ln in lines]


def test_every_range_has_a_pinned_hashed_distribution_that_satisfies_it():
    locked = _locked()
    problems = []
    for req in _wanted():
        pins = locked.get(canonicalize_name(req.name))
        if not pins:
            problems.append(f"{req.name}: not in ci/requirements.lock")
            continue
        if not any(req.specifier.contains(v, prereleases=True) for v, _ in pins):
            problems.append(f"{req}: locked at {[str(v) for v, _ in pins]}")
    assert not problems, problems + ["run ci/lock-tools.sh"]


def test_every_locked_distribution_is_pinned_by_hash():
    locked = _locked()
    assert len(locked) > 50
    unhashed = [name for name, pins in locked.items() if any(n == 0 for _, n in pins)]
    assert not unhashed, unhashed


def test_setup_installs_the_lock_alone_and_the_project_without_resolving():
    setup = (REPO / "ci" / "setup.sh").read_text()
    assert re.search(
        r"pip\" install -q --require-hashes --no-deps\s*\\\n\s*--index-url https://pypi.org/simple -r \"\$lockfile\"",
        setup,
    )
    assert '--no-deps --no-build-isolation -e "$here"' in setup
    assert "--upgrade" not in setup.split('lockfile="$here/ci/requirements.lock"', 1)[1].split("fi\n", 1)[0]
