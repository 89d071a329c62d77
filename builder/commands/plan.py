"""`build plan`: everything a build of --target reads and produces, from local files only; with
--source or --rehearse also the kernel plan and the fetch inventory of the source at the pin."""

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
        help="show everything a build of --target reads and produces (no network)",
        description="Print bases with digests, source commit, versions, build args, locks "
        "and the output reference. Reads only the matrix and local files. With --source "
        "(the pinned commit, fetched from the source's git host into the local mirror) or "
        "--rehearse (the PyPI sdist of source.package==source.version, tied to the pin by "
        "its _version.py): also the kernel plan (the archs each kernel's arch selection "
        "gives under cuda.version and cuda.arch_list, computed by upstream's own "
        "cmake/utils.cmake with cmake -P, per GPU family the target claims) and every "
        "fetch in the build files. Exit 1 when a kernels.required selection misses a "
        "claimed family or a fetch is neither pinned nor waived.",
    )
    add_globals(p)
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--source",
        action="store_true",
        help="read the source at the pin from its git host: add the kernel plan and the fetch inventory",
    )
    how.add_argument(
        "--rehearse",
        action="store_true",
        help="read the source from its PyPI sdist (machines that reach only PyPI): add the kernel plan "
        "and the fetch inventory",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    return per_target(args, out, lambda plan, o: _show(plan, o, args))


def _show(plan: Plan, out: Output, args: argparse.Namespace) -> int:
    width = max(len(k) for k, _ in plan.rows())
    for key, value in plan.rows():
        out.line(f"{key:<{width}}  {value}")
    out.data["plan"] = plan.to_json()
    if not (getattr(args, "source", False) or getattr(args, "rehearse", False)):
        out.line(f"{'kernel plan':<{width}}  not read (--source reads the pinned commit, --rehearse PyPI's sdist)")
        return 0
    return _kernel_plan(plan, out, rehearse=bool(getattr(args, "rehearse", False)))


def _kernel_plan(plan: Plan, out: Output, *, rehearse: bool) -> int:
    from builder.source import kernelmap

    target = plan.target
    tree, origin = kernelmap.read_source(target, rehearse=rehearse)
    result = kernelmap.compute(tree, target, origin)
    for line in kernelmap.render_lines(result, target):
        out.line(line)
    out.data["kernel_plan"] = kernelmap.to_json(result)
    for failure in result.failures:
        log.warn(f"{target.name}: FAIL: {failure}")
    return 0 if result.ok else 1
