"""The shape issue 16 asked for, kept: no import cycle among builder modules (lazy imports
included), functions that fit a screen, a CLI that parses and prints, heavy imports deferred."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

BUILDER = Path(__file__).resolve().parents[2] / "builder"
STEP_MODULES = {"lock", "source", "render", "records", "buildcontext"}
LONG_FUNCTION_EXCEPTIONS = {("cli.py", "_parser")}  # the declarative argument parser


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "builder":
                found |= {a.name for a in node.names}
            elif node.module.startswith("builder."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("builder.")}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in BUILDER.glob("*.py")}
    return {p.stem: _imports(p) & modules - {p.stem} for p in BUILDER.glob("*.py")}


def test_no_import_cycle_even_through_lazy_imports():
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_functions_fit_a_screen():
    long = []
    for path in sorted(BUILDER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60 and (path.name, node.name) not in LONG_FUNCTION_EXCEPTIONS:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_the_cli_imports_no_step_module():
    assert not (_imports(BUILDER / "cli.py") & STEP_MODULES)


def test_heavy_imports_wait_until_an_image_exists():
    # The lazy-import policy (builder/__init__.py): the CLI's start-up, `plan`, `render` and the
    # "up to date" path must not pay for pytest, testinfra, cyclonedx or jsonschema.
    code = ("import sys, builder.cli, builder.pipeline, builder.plan; "
            "print(','.join(m for m in ('pytest', 'testinfra', 'cyclonedx', 'jsonschema', 'python_on_whales', "
            "'git', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"imported at start-up: {out}"
