"""CONTRIBUTING.md's module map ("Where things are") is complete: every module of the tool is named
in the entry of its subpackage, and every path the map names exists."""

from __future__ import annotations

import re

from tests.conftest import REPO

BUILDER = REPO / "builder"


def _entries() -> list[str]:
    """The map's entries: each bullet ("- **...**") with its continuation lines."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("### Where things are", 1)[1].split("\n## ", 1)[0]
    return ["- " + e for e in re.split(r"^- ", section, flags=re.M)[1:]]


def _modules() -> list:
    return sorted(
        p
        for p in BUILDER.rglob("*.py")
        if p.name != "__init__.py" and "smoke_assets" not in p.parts and "__pycache__" not in p.parts
    )


def test_every_module_is_in_the_entry_of_its_subpackage():
    entries = _entries()
    missing = []
    for path in _modules():
        rel = path.relative_to(BUILDER)
        if len(rel.parts) == 1:  # a top-level module: named by its path
            found = any(f"`builder/{rel}`" in e for e in entries)
        else:
            home = f"`builder/{rel.parts[0]}/"
            name = re.compile(rf"`(?:[\w./]*/)?{re.escape(path.name)}`")  # `x.py` or a path ending in it
            found = any(home in e and name.search(e) for e in entries)
        if not found:
            missing.append(str(rel))
    assert not missing, f"CONTRIBUTING.md, 'Where things are', names none of: {missing}"


def test_every_path_the_map_names_exists():
    named = {m for e in _entries() for m in re.findall(r"`(builder/[\w/]+\.py)`", e)}
    assert named, "the map names no module by its path"
    gone = sorted(n for n in named if not (REPO / n).is_file())
    assert not gone, f"CONTRIBUTING.md names modules that do not exist: {gone}"


def _find_your_way() -> list[list[str]]:
    """The rows of "Find your way": the question, its one file, what to read there."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## Find your way", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in section.splitlines() if line.startswith("| ")]
    return [r for r in rows[1:] if not r[0].startswith("---")]


def test_each_question_of_find_your_way_names_a_module_that_holds_what_it_says():
    """The four answers name a file that exists and the names they send the reader to are in it
    (a renamed function or a moved rule makes the guide lie, so this fails)."""
    rows = _find_your_way()
    assert len(rows) == 4, rows
    wanted = {
        "builder/host/verdicts.py": ("def evaluate(", "ORDER = "),
        "builder/config/targetplatform.py": ("class TargetPlatform", "def of(", "def index_manifests("),
        "builder/checks/gpurules.py": ("def loads_on(", "def floor(", "def coverage("),
        "builder/source/export.py": ("def plan(", "def write("),
    }
    named = {re.search(r"`(builder/[\w/]+\.py)`", r[1]).group(1) for r in rows}  # type: ignore[union-attr]
    assert named == set(wanted)
    for path, names in wanted.items():
        text = (REPO / path).read_text(encoding="utf-8")
        assert all(n in text for n in names), (path, names)
    # the second places the answers admit
    assert "def _choice(" in (BUILDER / "host" / "doctor.py").read_text(encoding="utf-8")
    assert "def runs_on(" in (BUILDER / "config" / "gpu.py").read_text(encoding="utf-8")


def test_every_section_of_contributing_the_docs_cite_is_there():
    """A page that sends the reader to a section of CONTRIBUTING.md (by its title or anchor) finds it:
    the measurements moved to docs/, and a pointer left behind would lead nowhere."""
    heads = re.findall(r"^#+ (.+)$", (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8"), flags=re.M)
    anchors = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}
    stale = []
    for path in [*(REPO / "docs").rglob("*.md"), REPO / "README.md", *(REPO / "tests").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        stale += [f"{path.name}: {t}" for t in re.findall(r'CONTRIBUTING\.md, "([^"]+)"', text) if t not in heads]
        stale += [f"{path.name}: #{a}" for a in re.findall(r"CONTRIBUTING\.md#([\w-]+)", text) if a not in anchors]
    assert not stale, stale
