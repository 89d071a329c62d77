"""The GitHub Actions workflows: they parse, every action is pinned to a full commit SHA, every
`build ...` they run exists in the CLI with those options, and the test workflow, .ci/run and the
README agree on the test command."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from builder.cli import _parser
from tests.conftest import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def _steps(doc: dict):
    for job in doc["jobs"].values():
        yield from job["steps"]


def _build_invocations(script: str):
    for line in script.splitlines():
        for m in re.finditer(r"(?:^|\s)(?:\.venv/bin/)?build\s+(.*)", line):
            words = shlex.split(m.group(1), comments=True)
            cut = next((i for i, w in enumerate(words) if w in (">", ">>", "|", "&&", ";", "2>")), len(words))
            yield words[:cut]


def test_there_are_two_workflows():
    assert {p.name for p in WORKFLOWS} == {"k3-branch.yml", "tests.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_parses_and_pins_every_action(path):
    doc = yaml.safe_load(path.read_text())
    assert doc["jobs"] and True in doc  # YAML 1.1 reads the `on:` key as True
    text = path.read_text()
    uses = re.findall(r"^\s*-?\s*uses:\s*(\S+)(.*)$", text, re.M)
    assert uses
    for ref, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{ref} is not pinned to a full commit SHA"
        assert re.search(r"# v\d", comment), f"{ref}: say which release the SHA is"
    for step in _steps(doc):
        assert ("uses" in step) != ("run" in step)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_build_command_exists_with_its_options(path):
    doc = yaml.safe_load(path.read_text())
    parser = _parser()
    seen = 0
    for step in _steps(doc):
        for argv in _build_invocations(step.get("run", "")):
            if not argv or argv[0].startswith("bash"):
                continue
            parser.parse_args(argv)  # SystemExit on an unknown command or option
            seen += 1
    if path.name == "k3-branch.yml":
        commands = {w for step in _steps(doc) for argv in _build_invocations(step.get("run", ""))
                    for w in argv if w in ("track", "lock", "render", "test", "verify")}
        assert commands == {"track", "lock", "render", "test", "verify"} and seen >= 6


def test_the_branch_workflow_runs_on_schedule_dispatch_and_manual():
    doc = yaml.safe_load((REPO / ".github/workflows/k3-branch.yml").read_text())
    assert set(doc[True]) == {"schedule", "repository_dispatch", "workflow_dispatch"}
    text = (REPO / ".github/workflows/k3-branch.yml").read_text()
    assert "driver: docker-container" in text
    assert "secrets." not in re.sub(r"password: \$\{\{ secrets.GITHUB_TOKEN \}\}", "", text)  # only as an input


def test_readme_ci_and_test_workflow_agree_on_the_test_command():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Start here\n\n```sh\n(.*?)```", readme, re.S).group(1).splitlines()
    demo, tests = (line.split("#")[0].strip() for line in block[:2])
    assert demo == "ci/demo.sh"
    ci_run = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_run == tests, (ci_run, tests)
    workflow = (REPO / ".github/workflows/tests.yml").read_text()
    assert f"sudo bash -c '{tests}'" in workflow
