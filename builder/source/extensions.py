"""Compiled modules the pinned source declares, derived from its build files at the commit.

vLLM lists its kernels as ``CMakeExtension(name=...)`` calls in setup.py and its Rust artifacts as
``RustExtension(target=...)`` calls in tools/build_rust.py (the smoke source uses the same
shapes). The calls sit under platform conditions that cannot be evaluated without a build, so
every literal name is collected and the matrix waives, with a reason, the ones that do not apply
to this build (ROCm- or CPU-only modules, a Rust frontend that is not built). ``optional=True``
modules (or an ``optional=`` the file computes) are reported, not required: vLLM skips them when
their toolchain or architecture is missing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from builder.config.matrix import Extensions
from builder.errors import SourceError

_CALLS = {"Extension", "CMakeExtension", "RustExtension"}
_NAME_KEYWORDS = ("name", "target")


@dataclass(frozen=True)
class Declared:
    module: str
    optional: bool


def declared(setup_py: bytes, where: str = "setup.py") -> list[Declared]:
    try:
        tree = ast.parse(setup_py, filename=where)
    except SyntaxError as exc:
        raise SourceError(f"{where}: cannot parse to find ext_modules: {exc.msg} (line {exc.lineno})") from None
    found: dict[str, Declared] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in _CALLS:
            continue
        module = None
        if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            module = node.args[0].value
        optional = False
        for kw in node.keywords:
            if kw.arg in _NAME_KEYWORDS and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                module = kw.value.value
            if kw.arg == "optional":
                # A computed optional= (vLLM: not VLLM_REQUIRE_RUST_FRONTEND) is optional by default.
                optional = bool(kw.value.value) if isinstance(kw.value, ast.Constant) else True
        if module:
            prev = found.get(module)
            # Declared twice (e.g. once per platform): required if any declaration is.
            found[module] = Declared(module, optional and (prev.optional if prev else True))
    return sorted(found.values(), key=lambda d: d.module)


@dataclass(frozen=True)
class ModulePlan:
    required: tuple[str, ...]
    optional: tuple[str, ...]
    waived: tuple[tuple[str, str], ...]  # (module, reason)


def plan(files: dict[str, bytes | None], policy: Extensions) -> ModulePlan:
    """Which modules the image must import: declared (in every file of ``files``) + added - waived."""
    decl: list[Declared] = []
    for where, data in files.items():
        if data is None:
            raise SourceError(f"source: {where} (source.extensions.declared_in) does not exist at the pinned commit")
        decl += declared(data, where)
    required = {d.module for d in decl if not d.optional} | set(policy.add)
    optional = {d.module for d in decl if d.optional} - required
    waived = tuple(sorted((m, r) for m, r in policy.waive.items()))
    for module, _ in waived:
        required.discard(module)
        optional.discard(module)
    return ModulePlan(tuple(sorted(required)), tuple(sorted(optional)), waived)
