"""The commands reference, docs/reference/commands.md, written from the argparse parser itself so
it cannot drift from `build --help` (tests/unit/test_reference.py fails when the committed file
does). Regenerate it with::

    python -m builder.commands.reference > docs/reference/commands.md
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Set

from builder.commands._build_options import BUILD_OPTIONS
from builder.commands._common import GLOBAL_OPTIONS
from builder.commands.parser import DEFAULT, build_parser

COMMAND = "python -m builder.commands.reference > docs/reference/commands.md"
WIDTH = 88  # usage lines are wrapped here, whatever the terminal that runs this is
_GLOBAL = {flag for flag, _ in GLOBAL_OPTIONS}
_BUILD = {flag for flag, _ in BUILD_OPTIONS}


def markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole reference: `build` itself, the shared options, then one section per command."""
    parser = parser or build_parser()
    sub = _subparsers(parser)
    helps = {a.dest: a.help or "" for a in sub._choices_actions}  # the one-line help of each command
    out = [
        "# Commands",
        "",
        f"Generated from the command line's parser by `{COMMAND.split(' >')[0]}`; "
        "edit the parser (builder/commands/), not this page.",
        "",
        *_section(parser, "build", level=2, skip=_GLOBAL | _BUILD, shared=_shares(parser)),
        "Commands:",
        "",
        *(f"- [`{name}`](#{_anchor(f'build {name}')}): {_md(helps[name])}" for name in sub.choices),
        "",
        "## Options of every command",
        "",
        "They may stand before or after the command (`smoke-init` takes none of them).",
        "",
        *_options(parser, only=_GLOBAL),
        f"## Build options ({DEFAULT}, reproduce)",
        "",
        "How a build runs this time; the matrix says what is built.",
        "",
        *_options(parser, only=_BUILD),
    ]
    for name, command in sub.choices.items():
        flags = {f for a in command._actions for f in a.option_strings}
        # A command's own option that shares a build option's name (`test --platform`) is its own.
        skip = _GLOBAL | (_BUILD if _BUILD <= flags else set())
        out += _section(command, f"build {name}", level=2, skip=skip, shared=_shares(command))
    return "\n".join(out).rstrip("\n") + "\n"


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _shares(parser: argparse.ArgumentParser) -> list[str]:
    flags = {f for a in parser._actions for f in a.option_strings}
    shared = []
    if _GLOBAL <= flags:
        shared.append("[the options of every command](#options-of-every-command)")
    if _BUILD <= flags:
        shared.append(f"[the build options](#{_anchor(f'Build options ({DEFAULT}, reproduce)')})")
    return shared


def _section(
    parser: argparse.ArgumentParser, title: str, level: int, skip: Set[str], shared: list[str] | None = None
) -> list[str]:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    lines = ["#" * level + f" {title}", "", "```text", formatter.format_help().strip("\n"), "```", ""]
    if parser.description:
        lines += [_md(part) + "\n" for part in parser.description.split("\n\n")]
    if parser.epilog:
        lines += ["```text", parser.epilog, "```", ""]
    lines += _options(parser, skip=skip)
    if shared:
        lines += [f"Also takes {' and '.join(shared)}.", ""]
    return lines


def _options(parser: argparse.ArgumentParser, only: Set[str] | None = None, skip: Set[str] = frozenset()) -> list[str]:
    lines = []
    for action in parser._actions:
        flags = set(action.option_strings)
        if not flags or "-h" in flags or flags & skip or (only is not None and not flags & only):
            continue
        lines.append(f"- `{_invocation(action)}`: {_md(action.help or '')}")
    return lines + [""] if lines else []


def _invocation(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    if action.choices:
        value = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        value = str(action.metavar or action.dest.upper())
    return ", ".join(f"{flag} {value}" for flag in action.option_strings)


def _md(text: str) -> str:
    """Help text as Markdown: one line; outside `code` spans, <, > and & are text, * is no emphasis."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")
    return "`".join(parts)


def _anchor(title: str) -> str:
    """The id MkDocs gives a heading (Python-Markdown's toc slugify), for links within the page."""
    slug = re.sub(r"[^\w\s-]", "", title).strip().lower()
    return re.sub(r"[-\s]+", "-", slug)


if __name__ == "__main__":
    sys.stdout.write(markdown())
