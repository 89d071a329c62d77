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
