"""`build track`: follow --target's branch, and move the commit pin when the branch moved."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder import log
from builder.commands._common import Output, add_globals, per_target
from builder.config.matrix import load

NAME = "track"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME,
        help="follow --target's branch: move the commit pin when the branch moved",
        description="Resolve refs/heads/<branch> with ls-remote (no clone). When it moved past the "
        "pin, update targets.<t>.source.commit in the matrix (that line only; comments "
        "and order kept), re-render the Dockerfile and list the commits in between. "
        "A deleted branch, a rewritten (force-pushed) history or a file:// URL without "
        "K3_ALLOW_FILE_URLS=1: exit 2; an unreachable remote: exit 3; the matrix untouched.",
    )
    add_globals(p)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when the pin is behind, 0 when current")
    p.add_argument(
        "--report",
        metavar="FILE",
        type=Path,
        help="write the bump report (fetches, CUDA gates, planned archs per family, extension modules, "
        "requirements) as Markdown to FILE; it is also appended to $GITHUB_STEP_SUMMARY when set",
    )


def run(args: argparse.Namespace, out: Output) -> int:
    return per_target(args, out, lambda plan, o: _track(args, plan.target.name, o))


def _track(args: argparse.Namespace, name: str, out: Output) -> int:
    from builder.commands.plan import cmake_sandbox
    from builder.source.track import track

    result = track(args.matrix, load(args.matrix), name, check=args.check, sandbox=cmake_sandbox())
    out.data.update(result.to_json())
    if not result.moved:
        log.info(f"{name}: {result.branch} is at the pin {result.old[:12]}; nothing to do")
        out.line(f"{name}: current {result.old}")
        return 0
    log.info(
        f"{name}: {result.branch} moved {result.old[:12]} -> {result.new[:12]} "
        f"({len(result.subjects)} commit{'s' if len(result.subjects) != 1 else ''})"
    )
    for subject in result.subjects:
        log.info(f"    {subject}")
    if result.report:
        _report(result.report, args.report, out)
    for tp, names in result.third_party_changed.items():
        log.warn(
            f"{name}: third-party {tp!r}: the new commit's build files no longer name the pinned ref; they "
            f"name {', '.join(names)}: re-pin source.third_party.{tp} (ref and commit) before `build lock`"
        )
    if args.check:
        out.line(f"{name}: behind {result.old} -> {result.new}")
        return 1
    log.info(
        f"{args.matrix}: targets.{name}.source.commit updated; Dockerfile re-rendered; "
        f"next: `build lock --target {name}` and `build --target {name}`"
    )
    out.line(f"{name}: {result.old} -> {result.new}")
    return 0


def _report(report, path: Path | None, out: Output) -> None:
    """The bump report: to the log (each blocking finding as a warning), FILE and the job summary."""
    from builder.fsutil import atomic_write

    for line in report.lines():
        log.info(line)
    for why in report.blocking:
        log.warn(f"not ready: {why}")
    markdown = report.markdown()
    if path:
        atomic_write(path, markdown)
    log.step_summary(markdown)
