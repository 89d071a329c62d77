"""The shape of the package, asserted rather than kept by hand (CONTRIBUTING.md, "The structure rules"):

- each subpackage's docstring says what it owns and, on a ``May import:`` line, which other
  subpackages it may import; those declarations form a layering with no cycle, and the code keeps
  to them (lazy imports inside functions included);
- the foundation modules (errors, log, fsutil) import nothing else of the tool;
- no import cycle between modules, no module over 500 lines (a command module over 130), no
  function over 60;
- the CLI parses and dispatches: it imports the commands and the foundation, nothing else;
- heavy third-party imports wait until an image exists.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

BUILDER = Path(__file__).resolve().parents[2] / "builder"
FOUNDATION = {"errors", "log", "fsutil", "__init__"}
MAX_MODULE_LINES = 500
MAX_COMMAND_LINES = 130  # a command parses and prints; what it decides lives in the package below
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(
        p
        for p in BUILDER.rglob("*.py")
        if "smoke_assets" not in p.parts
        and "templates" not in p.parts
        and "probes" not in p.parts
        and "__pycache__" not in p.parts
    )


def _module_name(path: Path) -> str:
    parts = path.relative_to(BUILDER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(dotted: str) -> bool:
    return (BUILDER.parent / dotted.replace(".", "/") / "__init__.py").is_file()


def _is_module(dotted: str) -> bool:
    return _is_package(dotted) or (BUILDER.parent / (dotted.replace(".", "/") + ".py")).is_file()


def _imported_modules(path: Path) -> set[str]:
    """Every builder module this file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and (node.module == "builder" or node.module.startswith("builder."))
        ):
            if _is_package(node.module):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if _is_module(sub) else node.module)
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("builder.")}
    return found


def _unit(dotted: str) -> str:
    """The layer a module belongs to: its subpackage, or the top-level module's own name."""
    parts = dotted.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _declared() -> dict[str, set[str]]:
    declared = {}
    for init in sorted(BUILDER.glob("*/__init__.py")):
        if init.parent.name in ("smoke_assets", "templates"):
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        match = re.search(r"^May import: (.*?)\.?$", doc, re.MULTILINE)
        assert doc and match, f"{init.relative_to(BUILDER.parent)}: no docstring with a 'May import:' line"
        allowed = match.group(1)
        declared[init.parent.name] = set() if allowed.startswith("nothing") else {w.strip() for w in allowed.split(",")}
    return declared


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_modules_even_through_lazy_imports():
    graph = {_module_name(p): _imported_modules(p) - {_module_name(p)} for p in _sources()}
    # A package's __init__ is imported by every import of its modules; it imports none of them.
    cycle = _cycle(
        {m: {d for d in deps if not (_is_package(d) and m.startswith(d + "."))} for m, deps in graph.items()}
    )
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_declared_layers_have_no_cycle_and_name_real_packages():
    declared = _declared()
    for package, allowed in declared.items():
        assert allowed <= set(declared), f"builder/{package}: May import names {sorted(allowed - set(declared))}"
    cycle = _cycle(declared)
    assert cycle is None, "the declared layers have a cycle: " + " -> ".join(cycle or [])


def test_each_subpackage_imports_only_what_it_declares():
    declared = _declared()
    wrong = []
    for path in _sources():
        unit = _unit(_module_name(path))
        if unit not in declared:
            continue
        for dep in _imported_modules(path):
            other = _unit(dep)
            if other != unit and other not in FOUNDATION and other not in declared[unit]:
                wrong.append(f"{path.relative_to(BUILDER.parent)} imports {dep} (builder/{other}: not declared)")
    assert not wrong, wrong


def test_the_foundation_imports_nothing_else_of_the_tool():
    for name in FOUNDATION:
        path = BUILDER / f"{name}.py"
        others = {_unit(d) for d in _imported_modules(path)} - FOUNDATION
        assert not others, f"builder/{name}.py imports {sorted(others)}"


def test_the_cli_parses_and_dispatches_to_the_commands():
    units = {_unit(d) for d in _imported_modules(BUILDER / "cli.py")}
    assert units <= FOUNDATION | {"commands"}, sorted(units - FOUNDATION - {"commands"})


def test_modules_are_short():
    long = [
        f"{p.relative_to(BUILDER.parent)} ({n} lines)"
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, long


def test_a_command_module_stays_thin():
    long = [
        f"{p.relative_to(BUILDER.parent)}: {n} lines"
        for p in sorted((BUILDER / "commands").glob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_COMMAND_LINES
    ]
    assert not long, f"move the domain part down (over {MAX_COMMAND_LINES} lines): {long}"


def test_functions_fit_a_screen():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(BUILDER.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_heavy_imports_wait_until_an_image_exists():
    # The lazy-import policy (builder/__init__.py): the CLI's start-up, `plan`, `render` and the
    # "up to date" path must not pay for pytest, testinfra, cyclonedx or jsonschema.
    code = (
        "import sys, builder.cli, builder.pipeline.build, builder.pipeline.plan; "
        "print(','.join(m for m in ('pytest', 'testinfra', 'cyclonedx', 'jsonschema', 'python_on_whales', "
        "'git', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"imported at start-up: {out}"


def test_the_smoke_is_a_package_of_its_own_that_the_pipeline_never_imports():
    """The smoke (builder/smoke/) is a miniature the pipeline builds, not part of it: it declares
    its own layers, and nothing in the tool but `build smoke-init` (commands) imports it."""
    declared = _declared()
    assert declared["smoke"] == {"config", "engine", "deps", "records"}
    assert "smoke" not in declared["pipeline"] and "smoke" in declared["commands"]
    importers = {
        _unit(_module_name(path))
        for path in _sources()
        if any(_unit(dep) == "smoke" for dep in _imported_modules(path))
    }
    assert importers <= {"smoke", "commands"}, importers
