"""The GitHub Actions workflows: they parse, every action is pinned to a full commit SHA, every
`build ...` they run exists in the CLI with those options, the test workflow, .ci/run and the
README agree on the test command, and the security shape a reviewer signs off holds: no
permission at the top level, each job's permissions exactly the reviewed ones and each explained,
no expression expanded inside a script, concurrency everywhere, candidate then promote, keyless
signing and provenance in one job with the only `id-token: write`, pull requests opened with a
GitHub App token, Dependabot for the action pins. (zizmor and actionlint: test_workflow_audit.py.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from builder.cli import _parser
from tests.conftest import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
BRANCH = REPO / ".github/workflows/k3-branch.yml"
PROMOTE = REPO / ".github/workflows/k3-promote.yml"
TESTS = REPO / ".github/workflows/tests.yml"

# Every permission any job holds, reviewed. Widening one is a change to this table, in review.
REVIEWED_PERMISSIONS = {
    ("k3-branch.yml", "track"): {"contents": "read"},
    ("k3-branch.yml", "build"): {"contents": "read", "packages": "write"},
    ("k3-branch.yml", "sign"): {"id-token": "write", "packages": "write", "attestations": "write"},
    ("k3-branch.yml", "verify"): {"contents": "read", "packages": "read"},
    ("k3-branch.yml", "pull-request"): {"contents": "read"},
    ("k3-branch.yml", "vet-upstream"): {"contents": "read", "packages": "read"},
    ("k3-branch.yml", "retire-bridge"): {"issues": "write"},
    ("k3-promote.yml", "promote"): {"contents": "read", "packages": "write"},
    ("tests.yml", "tests"): {"contents": "read"},
}


def _load(path) -> dict:
    return yaml.safe_load(path.read_text())


def _steps(doc: dict):
    for job in doc["jobs"].values():
        yield from job["steps"]


def _run(doc: dict, job: str) -> str:
    return "\n".join(step.get("run", "") for step in doc["jobs"][job]["steps"])


def _uses(doc: dict, job: str) -> list[str]:
    return [step["uses"].split("@")[0] for step in doc["jobs"][job]["steps"] if "uses" in step]


def _build_invocations(script: str):
    for line in script.splitlines():
        for m in re.finditer(r"(?:^|[\s(])(?:\.venv/bin/)?build\s+(.*)", line):
            lex = shlex.shlex(m.group(1), posix=True, punctuation_chars=";&|<>()")
            lex.whitespace_split = True
            words = list(lex)
            cut = next((i for i, w in enumerate(words) if set(w) <= set(";&|<>()")), len(words))
            yield words[:cut]


def test_the_workflows():
    assert {p.name for p in WORKFLOWS} == {"k3-branch.yml", "k3-promote.yml", "tests.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_parses_and_pins_every_action(path):
    doc = _load(path)
    assert doc["jobs"] and True in doc  # YAML 1.1 reads the `on:` key as True
    text = path.read_text()
    uses = re.findall(r"^\s*-?\s*uses:\s*(\S+)(.*)$", text, re.M)
    assert uses
    for ref, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{ref} is not pinned to a full commit SHA"
        assert re.search(r"# v\d", comment), f"{ref}: say which release the SHA is"
    for step in _steps(doc):
        assert ("uses" in step) != ("run" in step)


def test_one_action_one_pin_everywhere():
    pins: dict[str, set[str]] = {}
    for path in WORKFLOWS:
        for ref, comment in re.findall(r"uses:\s*(\S+)\s*(#.*)?$", path.read_text(), re.M):
            action, sha = ref.split("@")
            pins.setdefault(action, set()).add(f"{sha} {comment}")
    assert {a: p for a, p in pins.items() if len(p) > 1} == {}
    assert "peter-evans/create-pull-request" not in pins  # `gh pr create` with the App token instead


# How many `build ...` invocations each workflow runs, at least. tests.yml runs none: its one job is
# the README's test command (test_readme_ci_and_test_workflow_agree_on_the_test_command).
BUILD_CALLS = {"k3-branch.yml": 8, "k3-promote.yml": 4, "tests.yml": 0}


def _build_argvs(doc: dict) -> list[list[str]]:
    return [
        argv
        for step in _steps(doc)
        for argv in _build_invocations(step.get("run", ""))
        if argv and not argv[0].startswith("bash")
    ]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_build_command_exists_with_its_options(path):
    argvs = _build_argvs(_load(path))
    parser = _parser()
    for argv in argvs:
        parser.parse_args(argv)  # SystemExit on an unknown command or option
    if BUILD_CALLS[path.name]:
        assert len(argvs) >= BUILD_CALLS[path.name], argvs
    else:
        assert argvs == [], f"{path.name} runs `build` now: add it to BUILD_CALLS and check its options"
    if path.name == "k3-branch.yml":
        commands = {w for argv in argvs for w in argv if w in ("track", "lock", "render", "test", "verify", "plan")}
        assert commands == {"track", "lock", "render", "test", "verify", "plan"}


def test_the_build_call_finder_finds_calls_and_an_unknown_option_fails():
    script = (
        'set -e\n.venv/bin/build --json plan --target "$T" | jq .\nif build verify --registry; then :; fi\n'
        "echo rebuild nothing\n"
    )
    assert list(_build_invocations(script)) == [["--json", "plan", "--target", "$T"], ["verify", "--registry"]]
    with pytest.raises(SystemExit):
        _parser().parse_args(["verify", "--no-such-option"])
    assert set(BUILD_CALLS) == {p.name for p in WORKFLOWS}


def test_the_test_workflow_runs_only_the_readme_test_command():
    runs = [step["run"] for step in _steps(_load(TESTS)) if "run" in step]
    # CI (true on GitHub's runners) kept through sudo: under CI the arm64 leg fails where it cannot run.
    assert runs == ["sudo --preserve-env=CI bash -c 'ci/setup.sh && ci/check.sh'"]


def test_the_branch_workflow_runs_on_schedule_dispatch_and_manual():
    doc = _load(BRANCH)
    assert set(doc[True]) == {"schedule", "repository_dispatch", "workflow_dispatch"}
    assert (
        doc["jobs"]["build"]["steps"][[s.get("id") for s in doc["jobs"]["build"]["steps"]].index("buildx")]["with"][
            "driver"
        ]
        == "docker-container"
    )


# -- least privilege ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_nothing_is_granted_at_the_top_level(path):
    doc = _load(path)
    assert doc.get("permissions") == {}, f"{path.name}: the top level must say `permissions: {{}}`"
    assert not re.search(r"^permissions:.*write", path.read_text(), re.M)


def test_each_job_holds_exactly_the_reviewed_permissions():
    found = {}
    for path in WORKFLOWS:
        for name, job in _load(path)["jobs"].items():
            assert isinstance(job.get("permissions"), dict), f"{path.name}: job {name} must list its permissions"
            found[(path.name, name)] = job["permissions"]
    assert found == REVIEWED_PERMISSIONS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_permission_says_why(path):
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.fullmatch(r"\s+permissions:\s*", line):
            indent = len(line) - len(line.lstrip())
            for body in lines[i + 1 :]:
                if len(body) - len(body.lstrip()) <= indent:
                    break
                assert re.search(r":\s*(read|write)\s+#\s*\S", body), f"{path.name}: {body.strip()!r} needs a comment"


def test_only_the_signing_job_mints_oidc_tokens():
    holders = [key for key, perms in REVIEWED_PERMISSIONS.items() if perms.get("id-token") == "write"]
    assert holders == [("k3-branch.yml", "sign")]
    sign = _load(BRANCH)["jobs"]["sign"]
    assert "actions/checkout" not in _uses({"jobs": {"sign": sign}}, "sign")  # runs none of the repository's code


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_expression_is_expanded_inside_a_script(path):
    for step in _steps(_load(path)):
        assert "${{" not in step.get("run", ""), f"{path.name}: {step.get('name')}: pass it through env:"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_concurrency_is_limited(path):
    conc = _load(path).get("concurrency")
    assert isinstance(conc, dict) and conc.get("group")


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_job_is_named_and_times_out(path):
    for name, job in _load(path)["jobs"].items():
        assert job.get("name") and job.get("timeout-minutes"), f"{path.name}: {name}"


COMPILE_CACHE_SECRETS = {
    "K3_COMPILE_CACHE",
    "K3_COMPILE_CACHE_AWS_ACCESS_KEY_ID",
    "K3_COMPILE_CACHE_AWS_SECRET_ACCESS_KEY",
}


def test_secrets_reach_actions_only_as_inputs():
    # One exception: the shared compile cache's secrets reach the tool through the environment of
    # the one step that builds (it hands them to the compile step as a BuildKit secret), in a job
    # bound to its own deployment environment.
    for path in WORKFLOWS:
        for _name, job in _load(path)["jobs"].items():
            outside = {k: v for k, v in job.items() if k != "steps"}
            assert "secrets." not in json.dumps(outside), path.name
            for step in job["steps"]:
                rest = {k: v for k, v in step.items() if k not in ("with", "env")}
                assert "secrets." not in json.dumps(rest), f"{path.name}: {step.get('name')}"
                in_env = set(re.findall(r"secrets\.(\w+)", json.dumps(step.get("env", {}))))
                if in_env:
                    assert in_env <= COMPILE_CACHE_SECRETS and job.get("environment") == "k3-compile-cache", (
                        f"{path.name}: {step.get('name')}: {in_env}"
                    )
    text = BRANCH.read_text() + PROMOTE.read_text()
    assert set(re.findall(r"secrets\.(\w+)", text)) == {"GITHUB_TOKEN", "K3_APP_PRIVATE_KEY"} | COMPILE_CACHE_SECRETS
    assert _load(BRANCH)["jobs"]["pull-request"].get("environment")  # the App key is an environment secret


def test_every_checkout_drops_its_credentials():
    for path in WORKFLOWS:
        for step in _steps(_load(path)):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step.get("with", {}).get("persist-credentials") is False, path.name


# -- candidate, sign, verify, pull request ---------------------------------------------------------


def test_the_compile_job_takes_its_runner_from_a_variable_and_uses_the_registry_cache():
    build = _load(BRANCH)["jobs"]["build"]
    assert "vars.K3_COMPILE_RUNNER" in build["runs-on"]
    argv = [a for a in _build_invocations(_run(_load(BRANCH), "build")) if "--cache-to" in a]
    assert len(argv) == 1
    args = _parser().parse_args(argv[0])
    assert args.cache_from and all(spec.startswith("type=registry,ref=") for spec in args.cache_from)
    assert args.cache_to.startswith("type=registry,ref=") and "mode=max" in args.cache_to


def test_the_branch_job_pushes_only_a_candidate_tag():
    doc = _load(BRANCH)
    build = doc["jobs"]["build"]
    assert build["env"]["K3_TAG"] == "${{ needs.track.outputs.candidate-tag }}"
    assert build["steps"][[s.get("id") for s in build["steps"]].index("plan")]["run"].count("K3_TAG") >= 1
    assert "-candidate-" in _run(doc, "track")
    # The jobs that look at the registry look at the candidate, never the production tag.
    assert doc["jobs"]["verify"]["env"]["K3_TAG"] == build["env"]["K3_TAG"]
    assert "imagetools" not in BRANCH.read_text()


def test_signing_and_provenance_happen_in_the_signing_job():
    doc = _load(BRANCH)
    assert "sigstore/cosign-installer" in _uses(doc, "sign")
    assert re.search(r'cosign sign --yes "\$IMAGE"', _run(doc, "sign"))
    attest = [
        s
        for s in doc["jobs"]["sign"]["steps"]
        if s.get("uses", "").startswith(("actions/attest@", "actions/attest-build-provenance@"))
    ]
    assert len(attest) == 1 and attest[0]["with"]["push-to-registry"] is True
    assert attest[0]["with"]["subject-digest"] == "${{ needs.build.outputs.digest }}"
    verify = doc["jobs"]["verify"]
    assert verify["needs"] == ["track", "build", "sign"]
    assert "cosign verify --certificate-identity" in _run(doc, "verify")
    # The tool's provenance: keyless in CI, the recorded predicate attested and checked back.
    assert re.search(
        r'cosign attest --yes --type slsaprovenance1 --predicate predicate\.json "\$IMAGE"', _run(doc, "sign")
    )
    assert "cosign verify-attestation --type slsaprovenance1 --certificate-identity" in _run(doc, "verify")
    assert 'grep -qxF "$recorded"' in _run(doc, "verify")
    assert any("--registry" in a for a in _build_invocations(_run(doc, "verify")))


def test_the_pull_request_is_opened_with_a_github_app_token():
    doc = _load(BRANCH)
    job = doc["jobs"]["pull-request"]
    assert "actions/create-github-app-token" in _uses(doc, "pull-request")
    push = [s for s in job["steps"] if "gh pr create" in s.get("run", "")]
    assert len(push) == 1 and push[0]["env"]["GH_TOKEN"] == "${{ steps.app-token.outputs.token }}"
    assert "secrets.GITHUB_TOKEN" not in json.dumps(job) and "github.token" not in json.dumps(job)
    assert job["needs"] == ["track", "build", "sign", "verify"]


def test_promotion_verifies_the_candidate_then_retags_the_reviewed_digest():
    doc = _load(PROMOTE)
    assert doc[True]["push"] == {"branches": ["main"], "paths": ["locks/*/image.json"]}
    job = doc["jobs"]["promote"]
    assert "default_branch" in job["if"]
    script = _run(doc, "promote")
    candidate = script.index('K3_TAG="$candidate" .venv/bin/build verify --target "$target" --registry')
    cosign = script.index("cosign verify --certificate-identity")
    retag = script.index('docker buildx imagetools create --prefer-index=false --tag "$production" "$image"')
    after = script.index('.venv/bin/build verify --target "$target" --registry', retag)
    assert candidate < cosign < retag < after
    commands = {argv[0] if argv[0] != "--json" else argv[1] for argv in _build_invocations(script)}
    assert commands == {"verify", "plan"}  # no build, no lock: a retag, never a rebuild
    assert "k3-branch.yml@refs/heads/" in job["env"]["K3_SIGNING_IDENTITY"]


def test_candidate_tags_agree_between_the_two_workflows():
    track = _run(_load(BRANCH), "track")
    promote = _run(_load(PROMOTE), "promote")
    assert "f\"{os.environ['TARGET']}-candidate-{new[:12]}\"" in track
    assert 'candidate="$target-candidate-${commit:0:12}"' in promote


def test_dependabot_keeps_the_action_pins_fresh():
    doc = yaml.safe_load((REPO / ".github/dependabot.yml").read_text())
    assert doc["version"] == 2
    ecosystems = {u["package-ecosystem"]: u for u in doc["updates"]}
    assert ecosystems["github-actions"]["directory"] == "/"
    assert ecosystems["github-actions"]["schedule"]["interval"] in ("daily", "weekly")


# -- the pull request body -------------------------------------------------------------------------


def _body_script() -> str:
    step = next(
        s for s in _load(BRANCH)["jobs"]["pull-request"]["steps"] if s["name"] == "compose the pull request body"
    )
    return re.search(r"<<'PY'\n(.*?)\nPY\n", step["run"], re.S).group(1)


def test_the_pull_request_body_is_readable_markdown(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    locks = tmp_path / "locks" / "cu129"
    locks.mkdir(parents=True)
    (locks / "requirements.txt").write_text(
        "torch==2.13.0+cu129 \\\n    --hash=sha256:aa\nnumpy==2.1.0\nold-pkg==1.0\n"
    )
    (locks / "build-requirements.txt").write_text("cmake==4.0.0\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-qm", "old"], check=True)
    (locks / "requirements.txt").write_text("torch==2.13.0+cu129 \\\n    --hash=sha256:aa\nnumpy==2.2.0\nnew_pkg==3\n")
    digest = "sha256:" + "ab" * 32
    (locks / "image.json").write_text(json.dumps({"source": {"url": "https://github.com/vllm-project/vllm.git"}}))
    run = tmp_path / "k3-run"
    (run / "artifacts" / "cu129" / "b1").mkdir(parents=True)
    (run / "track.json").write_text(
        json.dumps({"subjects": ["abc1234 [Kernel] K3 decode <fast> path (#4242) by @someone", "def5678 Fix `x` | y"]})
    )
    (run / "build.json").write_text(
        json.dumps(
            {"builds": [{"image": f"ghcr.io/a/b@{digest}", "digest": digest, "size": 12_300_000, "seconds": 3600.5}]}
        )
    )
    (run / "verify.json").write_text(
        json.dumps(
            {
                "rows": [
                    {"check": "registry: image", "ok": True, "detail": "serves"},
                    {"check": "registry: signature", "ok": False, "detail": "a|b"},
                ]
            }
        )
    )
    (run / "artifacts" / "cu129" / "b1" / "checks.xml").write_text(
        '<testsuite><testcase name="cuda_runtime"/><testcase name="expiry"><failure message="x"/></testcase></testsuite>'
    )
    (run / "cosign-verify.json").write_text("[]")
    env = {
        **os.environ,
        "TARGET": "cu129",
        "OLD": "1" * 40,
        "NEW": "2" * 40,
        "IMAGE": f"ghcr.io/a/b@{digest}",
        "CANDIDATE_TAG": "cu129-candidate-222222222222",
        "RUN_URL": "https://github.com/o/r/actions/runs/1",
        "LOG_URL": "https://github.com/o/r/actions/runs/1/artifacts/9",
        "ATTESTATION_URL": "",
    }
    subprocess.run([sys.executable, "-c", _body_script()], cwd=tmp_path, env=env, check=True)
    body = (tmp_path / "pr-body.md").read_text()
    assert "[`abc1234`](https://github.com/vllm-project/vllm/commit/abc1234)" in body
    assert "[#4242](https://github.com/vllm-project/vllm/pull/4242)" in body  # upstream, not this repo's #4242
    assert "@\u200bsomeone" in body and "\\<fast\\>" in body and "Fix \\`x\\` \\| y" in body
    assert "/compare/" + "1" * 40 + "..." + "2" * 40 in body
    assert "**`requirements.txt`**: 3 pins; 1 added, 1 removed, 1 changed." in body
    assert "| numpy | 2.1.0 | 2.2.0 |" in body and "| new-pkg | - | 3 |" in body and "| old-pkg | 1.0 | - |" in body
    assert "**`build-requirements.txt`**: 1 pins; 0 added, 0 removed, 0 changed." in body
    assert f"`ghcr.io/a/b@{digest}`" in body and "12.3 MB" in body and "cu129-candidate-222222222222" in body
    assert "| verify: registry: signature | **FAIL** | a\\|b |" in body
    assert "| image: cuda\\_runtime | pass | |" in body and "| image: expiry | **FAIL** | |" in body
    assert "artifacts/9" in body and "provenance attestation" not in body


def test_readme_ci_and_test_workflow_agree_on_the_test_command():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Start here\n\n```sh\n(.*?)```", readme, re.S).group(1).splitlines()
    demo, tests = (line.split("#")[0].strip() for line in block[:2])
    assert demo == "ci/demo.sh"
    ci_run = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_run == tests, (ci_run, tests)
    workflow = TESTS.read_text()
    assert f"sudo --preserve-env=CI bash -c '{tests}'" in workflow


def test_a_not_ready_bump_opens_a_draft_that_carries_the_report(tmp_path):
    doc = _load(BRANCH)
    job = doc["jobs"]["pull-request"]
    assert "needs.track.outputs.ready == 'false'" in job["if"] and "needs.verify.result == 'success'" in job["if"]
    assert job["env"]["READY"] == "${{ needs.track.outputs.ready }}"
    push = _run(doc, "pull-request")
    assert "draft=(--draft)" in push and "gh pr ready --undo" in push
    assert "--report bump-report.md" in _run(doc, "track")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "k3-track").mkdir()
    (tmp_path / "k3-track" / "bump-report.md").write_text("### What the compile will fetch and build\n\n- UNPINNED x\n")
    (tmp_path / "k3-run").mkdir()
    (tmp_path / "k3-run" / "track.json").write_text(json.dumps({"subjects": []}))
    env = {**os.environ, "TARGET": "cu129", "OLD": "1" * 40, "NEW": "2" * 40, "IMAGE": "", "CANDIDATE_TAG": "t"}
    env.update({"RUN_URL": "https://github.com/o/r/actions/runs/1", "READY": "false", "CANDIDATE": "false"})
    subprocess.run([sys.executable, "-c", _body_script()], cwd=tmp_path, env=env, check=True)
    body = (tmp_path / "pr-body.md").read_text()
    assert "**Draft: not ready.**" in body and "- UNPINNED x" in body and "No candidate was built" in body
    assert "Merging promotes" not in body


def test_the_build_job_plans_the_kernels_of_every_platform_before_it_locks_or_compiles():
    # issue 52: the plan step reads the source (no --no-source), so each platform's kernel plan
    # runs at the moved pin before the lock and the compile, and fails the job there.
    build = _load(REPO / ".github" / "workflows" / "k3-branch.yml")["jobs"]["build"]
    ids = [s.get("id") or s.get("name") for s in build["steps"]]
    plan_step = build["steps"][ids.index("plan")]
    (argv,) = [a for a in _build_invocations(plan_step["run"]) if "plan" in a]
    assert "--no-source" not in argv and "--rehearse" not in argv
    assert ids.index("plan") < ids.index("lock") < ids.index("compile, push the candidate, check, record")
