"""Mutation testing of the probes (builder/checks/probes/*.py), which mutmut cannot reach: the checks
and their tests run each probe as text in another interpreter (`python -c <script>`).

    .venv/bin/python -m tests.unit.probe_mutation                   # the functions in SCOPE
    .venv/bin/python -m tests.unit.probe_mutation elf:search        # one function
    .venv/bin/python -m tests.unit.probe_mutation --workers 2

Each mutant is one small change to one function (a comparison flipped, `and` for `or`, a `not`
dropped, a condition negated, a number off by one, a string altered, `continue` for `break`),
written into the probe file of a copy of this checkout, where the probe's unit tests then run
(-x: the first failure kills it). Prints killed / run per function and every survivor with its
line and change. Exit 1 below --threshold. Not part of the default test run (not collected).
"""

from __future__ import annotations

import argparse
import ast
import copy
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBES = REPO / "builder" / "checks" / "probes"
# probe:function -> the unit tests that run it. The rules each check relies on.
_ELF = (
    "tests/unit/test_elf_ld.py",
    "tests/unit/test_elf_search.py",
    "tests/unit/test_probes.py::test_elf_resolves_runpath_origin_and_reports_what_nothing_provides",
)
_HYGIENE = (
    "tests/unit/test_probes_links_and_trees.py",
    "tests/unit/test_probes_search_paths.py",
    "tests/unit/test_probes.py::test_hygiene_finds_dangling_links_links_into_build_paths_and_named_build_paths",
)
_TREES = (
    "tests/unit/test_probes_links_and_trees.py",
    "tests/unit/test_probes_search_paths.py",
    "tests/unit/test_probes.py::test_trees_imports_every_module_and_names_what_fails",
)
# The least-privilege probe as an unprivileged user (as root every "can write" is yes, so its rules
# would hide); test_privilege_uid.py skips unless run as root, which it needs to become uid 65534.
_PRIVILEGE = (
    "tests/unit/test_privilege_uid.py",
    "tests/unit/test_checks_image.py::test_least_privilege_finds_set_id_files_and_paths_the_user_can_write",
)
SCOPE = {
    "elf:search": _ELF,
    "elf:main": _ELF,
    "hygiene:pattern": _HYGIENE,
    "hygiene:under": _HYGIENE,
    "hygiene:scanned": _HYGIENE,
    "hygiene:main": _HYGIENE,
    "hygiene:search_paths": _HYGIENE,
    "privilege:writable": _PRIVILEGE,
    "privilege:cache_problem": _PRIVILEGE,
    "privilege:caches": _PRIVILEGE,
    "privilege:main": _PRIVILEGE,
    "trees:modules_of": _TREES,
    "trees:skipped": _TREES,
}
SWAP = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


def _sites(func: ast.FunctionDef) -> list[tuple[int, str]]:
    """(index of the node in ast.walk order, what changes) for every mutation in ``func``."""
    out = []
    docstring = func.body[0].value if isinstance(func.body[0], ast.Expr) else None
    for i, node in enumerate(ast.walk(func)):
        if node is docstring:
            continue  # what the function says of itself changes nothing it does
        if isinstance(node, ast.Compare) and type(node.ops[0]) in SWAP:
            out.append((i, f"{type(node.ops[0]).__name__} -> {SWAP[type(node.ops[0])].__name__}"))
        elif isinstance(node, ast.BoolOp):
            out.append((i, "and <-> or"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((i, "not dropped"))
        elif isinstance(node, ast.If | ast.IfExp | ast.While):
            out.append((i, "condition negated"))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append((i, f"{node.value} -> {node.value + 1}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
            out.append((i, f"{node.value[:20]!r} altered"))
        elif isinstance(node, ast.Continue | ast.Break):
            out.append((i, "continue <-> break"))
    return out


def _mutate(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Compare):
        node.ops[0] = SWAP[type(node.ops[0])]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):
        return node.operand
    elif isinstance(node, ast.If | ast.IfExp | ast.While):
        node.test = ast.UnaryOp(ast.Not(), node.test)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        node.value += 1
    elif isinstance(node, ast.Constant):
        node.value = f"XX{node.value}XX"
    elif isinstance(node, ast.Continue):
        return ast.Break()
    elif isinstance(node, ast.Break):
        return ast.Continue()
    return node


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def mutants(probe: str, function: str) -> list[tuple[str, str]]:
    """(description, mutated source of the whole probe file)."""
    text = (PROBES / f"{probe}.py").read_text()
    tree = ast.parse(text)
    out = []
    for index, what in _sites(_function(tree, function)):
        mutated = copy.deepcopy(tree)
        nodes = list(ast.walk(_function(mutated, function)))
        target = nodes[index]
        line = getattr(target, "lineno", "?")
        replacement = _mutate(target)
        if replacement is not target:  # swap the node in its parent
            for parent in ast.walk(_function(mutated, function)):
                for field, value in ast.iter_fields(parent):
                    if value is target:
                        setattr(parent, field, replacement)
                    elif isinstance(value, list) and any(v is target for v in value):
                        value[[i for i, v in enumerate(value) if v is target][0]] = replacement
        out.append((f"{probe}.{function} line {line}: {what}", ast.unparse(ast.fix_missing_locations(mutated))))
    return out


def _checkout() -> Path:
    work = Path(tempfile.mkdtemp(prefix="k3-probe-mutation-"))
    for name in ("builder", "tests"):
        shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "matrix.yaml"):
        shutil.copy(REPO / name, work / name)
    return work


def run(specs: list[str], workers: int) -> list[tuple[str, bool]]:
    jobs = []
    for spec in specs:
        probe, function = spec.split(":")
        jobs += [(spec, probe, what, source) for what, source in mutants(probe, function)]
    checkouts = [_checkout() for _ in range(workers)]
    free = list(checkouts)

    def one(job) -> tuple[str, bool]:
        spec, probe, what, source = job
        work = free.pop()
        try:
            (work / "builder" / "checks" / "probes" / f"{probe}.py").write_text(source)
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *SCOPE[spec]],
                cwd=work,
                capture_output=True,
                timeout=600,
            )
            return what, proc.returncode not in (0, 5)
        except subprocess.TimeoutExpired:
            return what, True
        finally:
            shutil.copy(PROBES / f"{probe}.py", work / "builder" / "checks" / "probes" / f"{probe}.py")
            free.append(work)

    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, jobs))
    finally:
        for work in checkouts:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.unit.probe_mutation", description=__doc__)
    parser.add_argument("specs", nargs="*", metavar="PROBE:FUNCTION", help=f"default: {' '.join(SCOPE)}")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=0.85)
    args = parser.parse_args(argv)
    results = run(args.specs or list(SCOPE), args.workers)
    killed = sum(k for _, k in results)
    for spec in args.specs or list(SCOPE):
        probe, function = spec.split(":")
        mine = [k for what, k in results if what.startswith(f"{probe}.{function} ")]
        print(f"{spec:<20} {sum(mine):>4} / {len(mine):<4}")
    print(f"{'total':<20} {killed:>4} / {len(results):<4} {killed / max(len(results), 1):.1%}")
    for what, k in results:
        if not k:
            print(f"  survived: {what}")
    return 0 if killed >= args.threshold * len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
