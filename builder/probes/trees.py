"""Probe: does every module of the named Python trees import in the image?

The trees are what CMake install steps and third-party sources put into the wheel (vLLM:
vllm.vllm_flash_attn with FA4's cute files, vllm.third_party, the K3 model package). Each
module found on disk under a tree (.py files and packages, compiled modules too) is imported in
this one process, after the set-up callables ran, in sorted order. A module matching a skip
pattern is listed as skipped, not imported. Run with the compat driver library on the path.
Request: {"trees": [...], "skip": [...], "setup": ["module:attr", ...]}.
"""

import fnmatch
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys

MARKER = "K3-PROBE "


def call(ref):
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj()


def modules_of(tree):
    """Every module name on disk under ``tree`` (a package), the package itself first."""
    spec = importlib.util.find_spec(tree)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {tree!r}")
    found = [tree]
    suffixes = tuple(importlib.machinery.all_suffixes())
    for location in spec.submodule_search_locations or ():
        for top, dirs, files in os.walk(location):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d.isidentifier())
            rel = os.path.relpath(top, location)
            prefix = tree if rel == "." else tree + "." + rel.replace(os.sep, ".")
            if rel != "." and not any(f.endswith(suffixes) for f in files):
                continue  # data-only directory (headers, kernels' sources)
            if rel != ".":
                found.append(prefix)
            for name in sorted(files):
                suffix = next((s for s in suffixes if name.endswith(s)), None)
                stem = name[: -len(suffix)] if suffix else ""
                if suffix and stem != "__init__" and stem.isidentifier():
                    found.append(f"{prefix}.{stem}")
    return sorted(set(found))


def skipped(name, pattern):
    """fnmatch on the dotted name; "pkg.*" also skips pkg itself."""
    return fnmatch.fnmatchcase(name, pattern) or (pattern.endswith(".*") and name == pattern[:-2])


def main(req):
    out = {"setup": {}, "trees": {}, "imported": {}, "skipped": {}}
    for ref in req["setup"]:
        try:
            call(ref)
            out["setup"][ref] = None
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: a probe never exits early
            out["setup"][ref] = f"{type(exc).__name__}: {exc}"
    for tree in req["trees"]:
        try:
            names = modules_of(tree)
            out["trees"][tree] = None
        except BaseException as exc:  # noqa: BLE001
            out["trees"][tree] = f"{type(exc).__name__}: {exc}"
            continue
        for name in names:
            pattern = next((p for p in req["skip"] if skipped(name, p)), None)
            if pattern:
                out["skipped"][name] = pattern
                continue
            try:
                importlib.import_module(name)
                out["imported"][name] = None
            except BaseException as exc:  # noqa: BLE001
                out["imported"][name] = f"{type(exc).__name__}: {exc}"[:300]
    return out


if __name__ == "__main__":
    try:
        facts = main(json.loads(sys.argv[1]))
    except BaseException as exc:  # noqa: BLE001 - reported, so the check says what broke
        facts = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    print(MARKER + json.dumps(facts))
