"""--json documents on stdout, and GitHub Actions log groups and step summary."""

from __future__ import annotations

import json
import os

from tests.integration.conftest import cli


def test_json_documents(pristine):
    smoke, ref = pristine  # "up to date" needs the registry as the record says (another test may have moved it)
    m = str(smoke.matrix)
    doc = json.loads(cli("--matrix", m, "--json", "--target", "smoke").out)
    assert doc["ok"] and doc["builds"][0]["digest"] == ref.split("@")[1]
    assert doc["builds"][0]["status"] == "up to date"
    doc = json.loads(cli("--matrix", m, "verify", "--json").out)
    assert doc["ok"] and {r["check"] for r in doc["rows"]} >= {"lock <-> SBOM", "matrix <-> Dockerfile"}
    doc = json.loads(cli("--matrix", m, "test", "--target", "smoke", "--json").out)
    assert doc["ok"] and {c["name"] for c in doc["checks"]} >= {"cuda_runtime", "expiry"}
    failed = cli("--matrix", m, "test", "--target", "smoke", "--json", "--image", "127.0.0.1:5000/k3/none:nope")
    doc = json.loads(failed.out)
    assert failed.code != 0 and doc["ok"] is False and doc["error"]


def test_github_actions_groups_and_step_summary(built, tmp_path):
    smoke, ref = built
    summary = tmp_path / "summary.md"
    env = dict(os.environ, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    r = cli("--matrix", str(smoke.matrix), "--target", "smoke", env=env)
    assert r.code == 0
    assert "::group::smoke: check the committed Dockerfile and locks" in r.err and "::endgroup::" in r.err
    table = summary.read_text()
    assert "| image | digest | size | time | status |" in table and ref.split("@")[1] in table
