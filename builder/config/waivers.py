"""Waivers of the whole-image checks (matrix key ``runtime.waivers``): per check, per path, with a reason.

The checks in builder/checks/checklist_image.py hold over everything under the application
prefix, never over a list of names, so the only way past one is to name the path it failed on
here, with why. Each waiver that matched is shown in the check's output; one that matched nothing
is shown too (a stale waiver hides nothing today and would hide a new defect tomorrow).

    runtime:
      waivers:
        everything_loads:
          /opt/k3/venv/lib/python3.12/site-packages/torchcodec/libtorchcodec_core4.so: FFmpeg 4 variant
        container_runtime:
          /config/Env/NVIDIA_REQUIRE_CUDA: only ever run on r580 hosts

A finding about a variable of the image config (the runtime's view: builder/checks/checklist_runtime.py)
is named by its place in the OCI image config, ``/config/Env/NAME``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from builder.config.patterns import PathPattern, Reason

# The checks a path can be waived from (contract.CHECKS holds what each proves).
WaivableCheck = Literal[
    "installed_files",
    "everything_loads",
    "loaded_libraries",
    "image_starts",
    "least_privilege",
    "bytecode_matches",
    "image_hygiene",
    "package_files",
    "page_alignment",
    "container_runtime",
    "interpreter_options",
    "startup_hooks",
    "runtime_user",
    "system_files",
    "base_whiteouts",
    "cpu_level",
]
Waivers = dict[WaivableCheck, dict[PathPattern, Reason]]


def waived(waivers: Mapping[str, Mapping[str, str]], check: str, path: str) -> tuple[str, str] | None:
    """(pattern, reason) of the first waiver of ``check`` whose pattern matches ``path``, else None."""
    for pattern, reason in sorted(waivers.get(check, {}).items()):
        if fnmatch.fnmatchcase(path, pattern):
            return pattern, reason
    return None


def unwaived(
    waivers: Mapping[str, Mapping[str, str]],
    check: str,
    findings: Iterable[tuple[str, str]],
    report: Callable[[str], object],
) -> list[tuple[str, str]]:
    """The (path, what) ``findings`` no waiver of ``check`` matches. Each waived one is reported with
    its pattern and reason, and so is each waiver that matched nothing (it would hide a new defect)."""
    left, used = [], set()
    for path, what in findings:
        hit = waived(waivers, check, path)
        if hit:
            used.add(hit[0])
            report(f"{check}: {path}: {what}; waived ({hit[0]}): {hit[1]}")
        else:
            left.append((path, what))
    for pattern in sorted(set(waivers.get(check, {})) - used):
        report(f"{check}: waiver {pattern} matched nothing: drop it from runtime.waivers.{check}")
    return left
