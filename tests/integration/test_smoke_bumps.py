"""The smoke takes the bump path (issue 39): on the smoke's own stand-in source, the git repository
`build smoke-init` made from builder/smoke_assets/src (its vLLM-shaped cmake/utils.cmake, an
`a`-list intersection under a CUDA-version gate), an upstream commit that adds an unpinned fetch,
gates a required kernel behind CUDA 13, or drops an arch from the SM90+ `a` list is each named by
`build track --check` with its file and line, fails it, and is in the bump report (--json,
--report FILE, the job summary).

Reuses the session ``smoke`` fixture and builds nothing: track reads only the source. The bumps are
committed to a clone of the smoke's source repository (same commits, same branch), so the branch
the session's other tests build from never moves.
"""

from __future__ import annotations

import json
import os
import re

import git
import pytest

from tests.integration.conftest import cli

KERNEL = "CMakeLists.txt:FUSED_ADD_RMS_NORM_ARCHS"
SELECTION = 'cuda_archs_sm90plus(FUSED_ADD_RMS_NORM_ARCHS "${CUDA_ARCHS}")'
GATE = "if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13.0)"
A_LIST = '"9.0a;10.0a;10.3a;12.0a"'
NEW_FETCH = "FetchContent_Declare(k3extra GIT_REPOSITORY https://example.org/k3extra.git GIT_TAG main)"
ENV = {"GIT_AUTHOR_NAME": "k3 upstream", "GIT_AUTHOR_EMAIL": "u@example.org"}


def _line(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


@pytest.fixture(scope="module")
def upstream(smoke, tmp_path_factory):
    """A clone of the smoke's source repository as the tracked remote, a matrix pointing at it, and
    ``bump(message, edit)``: a commit on the base pin, force-pushed to the tracked branch."""
    root = tmp_path_factory.mktemp("smoke-bumps")
    text = smoke.matrix.read_text()
    url = re.search(r"^\s+url: (file://\S+/k3smoke-src)$", text, re.M).group(1)
    branch = re.search(r"^\s+branch: (\S+)$", text, re.M).group(1)
    remote = git.Repo.clone_from(url.removeprefix("file://"), root / "upstream.git", bare=True)
    work = git.Repo.clone_from(str(root / "upstream.git"), root / "work", branch=branch)
    base = work.head.commit.hexsha
    assert base in text, "the smoke's pin is not its branch head"
    target = smoke.variant(root / "m", "bumps", lambda t: t.replace(url, f"file://{remote.git_dir}"))

    def bump(message: str, edit) -> dict[str, str]:
        work.git.reset("-q", "--hard", base)
        texts = {}
        for path, change in edit.items():
            file = root / "work" / path
            texts[path] = change(file.read_text())
            file.write_text(texts[path])
        work.git.add(A=True)
        with work.git.custom_environment(**ENV, GIT_COMMITTER_NAME="u", GIT_COMMITTER_EMAIL="u@example.org"):
            work.git.commit("-q", "--no-gpg-sign", "-m", message)
        work.git.push("-q", "--force", "origin", f"HEAD:refs/heads/{branch}")
        return texts

    return target, bump, root


def _check(upstream, summary: bool = False):
    """`build --json track --check --report FILE`: exit code, log (stderr), JSON report, Markdown."""
    target, _, root = upstream
    report = root / "report.md"
    env = {**os.environ, "K3_ALLOW_FILE_URLS": "1"}
    env.pop("GITHUB_STEP_SUMMARY", None)
    if summary:
        env["GITHUB_STEP_SUMMARY"] = str(root / "summary.md")
        (root / "summary.md").write_text("")
    r = cli(
        "--matrix", str(target.matrix), "--json", "track", "--target", "smoke", "--check", "--report", str(report),
        env=env,
    )  # fmt: skip
    assert r.out, r.err
    return r.code, r.err, json.loads(r.out)["report"], report.read_text()


def test_a_new_unpinned_fetch_is_named_with_file_and_line(upstream):
    _, bump, _ = upstream
    texts = bump(
        "k3smoke: a new dependency",
        {"CMakeLists.txt": lambda t: t.replace("include(FetchContent)\n", f"include(FetchContent)\n{NEW_FETCH}\n")},
    )
    where = f"CMakeLists.txt:{_line(texts['CMakeLists.txt'], NEW_FETCH)}: FetchContent_Declare k3extra"
    code, err, report, markdown = _check(upstream)
    assert code == 1, err
    assert f"not ready: unpinned fetch: {where} https://example.org/k3extra.git not in source.third_party" in err
    assert report["new_fetches"] == [
        f"UNPINNED: {where} https://example.org/k3extra.git not in source.third_party and no "
        "kernels.fetch_waivers entry 'CMakeLists.txt:k3extra'"
    ]
    assert not report["ready"] and report["blocking"][0].startswith(f"unpinned fetch: {where}")
    assert report["new_gates"] == report["arch_changes"] == []  # the kernels are as they were
    assert "**Not ready:**" in markdown and "k3extra" in markdown


def test_a_required_kernel_gated_behind_cuda_13(upstream):
    _, bump, _ = upstream
    gated = f"{GATE}\n  {SELECTION}\nendif()"
    texts = bump("k3smoke: the SM90+ kernel needs CUDA 13", {"CMakeLists.txt": lambda t: t.replace(SELECTION, gated)})
    gate_line = _line(texts["CMakeLists.txt"], gated)  # GATE's text also opens the supported-archs block
    line = gate_line + 1
    code, err, report, markdown = _check(upstream, summary=True)
    assert code == 1, err
    gate = f"(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13.0) at CMakeLists.txt:{gate_line}"
    for cc, gpus in (("9.0", "H100, H200"), ("10.0", "B200, GB200"), ("10.3", "B300, GB300")):
        assert (
            f"not ready: kernels.required.FUSED_ADD_RMS_NORM_ARCHS: nothing loads on {cc} ({gpus}): "
            f"planned not built ({KERNEL}:{line}); gates: {gate}"
        ) in err
    assert f"{KERNEL} (line {line}): {gate}" in report["new_gates"]
    assert f"{KERNEL} (line {line}): no longer built under CUDA 12.9.1: {gate}" in report["new_gates"]
    assert {(c["family"], c["was"], c["now"]) for c in report["arch_changes"] if c["kernel"] == KERNEL} == {
        ("9.0", "9.0a", ""),
        ("10.0", "10.0a", ""),
        ("10.3", "10.3f", ""),
    }
    assert not report["ready"]
    assert "**New CUDA gates**" in markdown and "| CMakeLists.txt:FUSED\\_ADD\\_RMS\\_NORM\\_ARCHS | 10.3 |" in markdown
    assert (upstream[2] / "summary.md").read_text() == markdown  # the job summary carries the same report


def test_an_arch_dropped_from_the_a_list_loses_b300(upstream):
    _, bump, _ = upstream
    texts = bump(
        "k3smoke: trim the SM90+ list",
        {"cmake/utils.cmake": lambda t: t.replace(A_LIST, '"9.0a;10.0a;12.0a"')},
    )
    assert A_LIST not in texts["cmake/utils.cmake"]
    line = _line((upstream[2] / "work" / "CMakeLists.txt").read_text(), SELECTION)
    code, err, report, markdown = _check(upstream)
    assert code == 1, err
    # Named where the build computes it: the selection's file and line in CMakeLists.txt, whose
    # cuda_archs_sm90plus() lost 10.3a from its `a` list in cmake/utils.cmake.
    assert "not ready: kernels.required.FUSED_ADD_RMS_NORM_ARCHS: nothing loads on 10.3 (B300, GB300)" in err
    assert re.search(rf"planned (9\.0a 10\.0a|10\.0a 9\.0a) \({re.escape(KERNEL)}:{line}\)", err), err
    assert report["arch_changes"] == [{"kernel": KERNEL, "family": "10.3", "was": "10.3f", "now": ""}]
    assert report["new_fetches"] == report["new_gates"] == []
    assert not report["ready"]
    assert "| CMakeLists.txt:FUSED\\_ADD\\_RMS\\_NORM\\_ARCHS | 10.3 | 10.3f | - |" in markdown


def test_the_smoke_at_its_pin_plans_clean(upstream):
    """The control: the same matrix and source at the pin plan without a failure (so each failure
    above is the bump's), every required kernel reaching the families it must."""
    target, _, _ = upstream
    r = cli("--matrix", str(target.matrix), "--json", "plan", "--target", "smoke")
    assert r.code == 0, r.err
    plan = json.loads(r.out)["kernel_plan"]
    assert plan["failures"] == [] and plan["origin"].startswith("git file://")
    kernels = {k["name"]: k["families"] for k in plan["kernels"]}
    assert kernels[KERNEL] == {"8.0": "", "9.0": "9.0a", "10.0": "10.0a", "10.3": "10.3f"}
    assert kernels["CMakeLists.txt:RMS_NORM_ARCHS"] == {"8.0": "8.0+PTX", "9.0": "9.0a", "10.0": "10.0", "10.3": "10.0"}


def test_a_nested_helper_that_would_write_a_marker_is_refused_and_writes_nothing(upstream):
    """Issue 49: the bump hides the command two helpers deep; the plan refuses it before any CMake
    runs (and would run it only in the sandbox): track says why, and no marker appears."""
    _, bump, root = upstream
    marker = root / "k3-marker"
    helpers = (
        f'function(k3_deep)\n  execute_process(COMMAND touch "{marker}")\n  file(WRITE "{marker}" x)\nendfunction()\n'
        "function(k3_mid)\n  k3_deep()\nendfunction()\n"
    )
    bump(
        "k3smoke: a helper for the SM90+ list",
        {
            "cmake/utils.cmake": lambda t: (
                helpers
                + t.replace(
                    "function(cuda_archs_sm90plus OUT_CUDA_ARCHS TGT_CUDA_ARCHS)\n",
                    "function(cuda_archs_sm90plus OUT_CUDA_ARCHS TGT_CUDA_ARCHS)\n  k3_mid()\n",
                )
            )
        },
    )
    code, err, report, _ = _check(upstream)
    assert code == 1, err
    assert "k3_deep() runs execute_process(), which the kernel plan does not run from an untrusted tree" in err
    assert not report["ready"]
    assert not marker.exists()
