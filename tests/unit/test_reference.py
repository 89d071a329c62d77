"""The commands reference (docs/reference/commands.md) is generated from the parser: it cannot
drift from `build --help`."""

from __future__ import annotations

from builder.cli import _parser
from builder.commands import reference
from tests.conftest import REPO

COMMITTED = REPO / "docs" / "reference" / "commands.md"


def test_the_committed_reference_is_what_the_parser_says():
    assert COMMITTED.read_text() == reference.markdown(), f"out of date; regenerate: {reference.COMMAND}"


def test_every_command_and_option_is_in_the_reference():
    text = reference.markdown()
    assert text.startswith("# Commands\n")
    parser = _parser()
    sub = reference._subparsers(parser)
    for name, command in sub.choices.items():
        assert f"\n## build {name}\n" in text and f"(#build-{name})" in text
        for action in command._actions:
            for flag in action.option_strings:
                assert flag in ("-h", "--help") or flag in text, (name, flag)
                if action.help and flag not in ("-h", "--help"):
                    assert reference._md(action.help) in text, (name, flag)


def test_help_text_is_markdown_safe_outside_code_spans():
    assert reference._md("dockerfiles/<target>/Dockerfile a*b") == r"dockerfiles/&lt;target&gt;/Dockerfile a\*b"
    assert (
        reference._md("the maintainer's `build --target <t>`\n  next") == "the maintainer's `build --target <t>` next"
    )
    assert reference._anchor("Build options (build, reproduce)") == "build-options-build-reproduce"
    assert reference._anchor("build smoke-init") == "build-smoke-init"


def test_the_reference_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    assert reference.markdown() == COMMITTED.read_text()
