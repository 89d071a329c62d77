"""`build plan`: everything a build of --target reads and produces, and the kernel plan (one per
platform, each under its own arch list) and the fetch inventory of the source at the pin (from the
local mirror when it holds the pinned commit, no network; else the git host; ``--rehearse``: PyPI's
sdist). ``--no-source``: local files only."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from builder import log
from builder.commands._common import Output, add_globals, per_target

if TYPE_CHECKING:
    from builder.pipeline.plan import Plan

NAME = "plan"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="show everything a build of --target reads and produces, and the kernel plan at the pin",
        description="Print bases with digests, source commit, versions, build args, locks "
        "and the output reference (from the matrix and local files), then the kernel plan "
        "(the archs each kernel's arch selection gives under cuda.version and each platform's arch list, "
        "computed by upstream's own cmake/utils.cmake with cmake -P in a sandbox container on the engine "
        "(never on this host: no engine reachable is exit 3), per GPU family the target "
        "claims; one table per platform the target names) and every fetch in the build files, read from "
        "the source at the pin: the local "
        "mirror when an earlier lock, build or track put the pinned commit there (no network), "
        "else fetched from the source's git host (unreachable: exit 3). Exit 1 when a "
        "kernels.required selection misses a claimed family on any platform or a fetch is neither pinned nor waived.",
    )
    add_globals(p)
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--source",
        action="store_true",
        help="fetch the branch from the git host even when the local mirror holds the pin (re-verifies the pin "
        "is on the branch)",
    )
    how.add_argument(
        "--rehearse",
        action="store_true",
        help="read the source from its PyPI sdist (machines that reach only PyPI)",
    )
    how.add_argument(
        "--no-source",
        action="store_true",
        help="read only the matrix and local files: no kernel plan, no network (what a script reading the "
        "output reference needs)",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    return per_target(args, out, lambda plan, o: _show(plan, o, args))


def _show(plan: Plan, out: Output, args: argparse.Namespace) -> int:
    from builder.source import planread

    width = max(len(k) for k, _ in plan.rows())
    for key, value in plan.rows():
        out.line(f"{key:<{width}}  {value}")
    out.data["plan"] = plan.to_json()
    if getattr(args, "no_source", False):
        out.line(f"{'kernel plan':<{width}}  not read (--no-source)")
        return 0
    how = planread.MIRROR
    if getattr(args, "rehearse", False):
        how = planread.SDIST
    elif getattr(args, "source", False):
        how = planread.GIT
    return _kernel_plan(plan, out, how)


def cmake_sandbox():
    """Where the kernel plan runs upstream's CMake: a container on the engine (builder/engine/sandbox.py),
    never this host; no engine reachable is exit 3 when the plan first runs."""
    from builder.commands._common import docker_engine
    from builder.pipeline.context import cmake_sandbox as engine_sandbox

    return engine_sandbox(docker_engine())  # the build's preflight makes its sandbox the same way


def _kernel_plan(plan: Plan, out: Output, how: str) -> int:
    """The kernel plan of every platform the target compiles for, each under its own arch list."""
    from builder.source import kernelmap, planread

    target = plan.target
    tree, origin = planread.read_source(target, how)
    results = kernelmap.per_platform(tree, plan.compiled_targets(), origin, cmake_sandbox())
    for line in kernelmap.render_platforms(results, target):
        out.line(line)
    out.data["kernel_plan"] = kernelmap.to_json(results[0])  # the first platform's, with the fetches
    names = [r.platform or target.platform_names()[0] for r in results]
    out.data["kernel_plans"] = {name: kernelmap.to_json(r) for name, r in zip(names, results, strict=True)}
    for name, result in zip(names, results, strict=True):
        for failure in result.failures:
            log.warn(f"{target.name}: FAIL: " + (f"{name}: " if len(results) > 1 else "") + failure)
    return 0 if all(r.ok for r in results) else 1
