"""`build track` against a real local upstream: a bare repository whose branch the tests advance,
force-push and delete (git only, no Docker)."""

from __future__ import annotations

import contextlib
import io
import json
import re

import git
import pytest

from builder import cli
from tests.conftest import REPO
from tests.unit.cmakehost import HostCMake, host_cmake  # noqa: F401 - the module's fixture

PIN = "ced6857afa0ea7b2e3f0846a62e1394e90f15607"

pytestmark = pytest.mark.usefixtures("host_cmake")


@pytest.fixture()
def upstream(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("K3_ALLOW_FILE_URLS", "1")
    git.Repo.init(tmp_path / "upstream.git", bare=True, initial_branch="k3")
    work = git.Repo.clone_from(str(tmp_path / "upstream.git"), tmp_path / "work")
    work.git.checkout("-q", "-b", "k3")

    def commit(message: str) -> str:
        (tmp_path / "work" / "f.txt").write_text(message)
        work.git.add(A=True)
        with work.git.custom_environment(
            GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e.org", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e.org"
        ):
            work.git.commit("-q", "-m", message)
        work.git.push("-q", "origin", "HEAD:refs/heads/k3", "--force")
        return work.head.commit.hexsha

    first = commit("K3: first")
    matrix = tmp_path / "matrix.yaml"
    text = (REPO / "matrix.yaml").read_text()
    text = text.replace("https://github.com/vllm-project/vllm.git", f"file://{tmp_path}/upstream.git")
    text = text.replace("branch: releases/v0.30.0", "branch: k3").replace(PIN, first)
    matrix.write_text(text)
    assert _run("--matrix", str(matrix), "render")[0] == 0
    return {"matrix": matrix, "commit": commit, "work": work, "first": first, "bare": tmp_path / "upstream.git"}


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_current_pin_is_exit_0(upstream):
    code, out, _ = _run("--matrix", str(upstream["matrix"]), "track", "--target", "cu129", "--check")
    assert code == 0 and "current" in out


def test_moved_branch_updates_one_line_and_rerenders(upstream):
    matrix = upstream["matrix"]
    upstream["commit"]("K3: fix MLA kernel for CUDA 12")
    new = upstream["commit"]("K3: bump NCCL")
    before = matrix.read_text()
    code, out, err = _run("--matrix", str(matrix), "track", "--target", "cu129", "--check")
    assert code == 1 and "behind" in out and matrix.read_text() == before
    code, out, err = _run("--matrix", str(matrix), "--json", "track", "--target", "cu129")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["moved"] and doc["updated"] and doc["new"] == new
    assert [s.split(" ", 1)[1] for s in doc["subjects"]] == ["K3: bump NCCL", "K3: fix MLA kernel for CUDA 12"]
    after = matrix.read_text()
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=False) if a != b]
    assert changed == [(f"      commit: {upstream['first']}", f"      commit: {new}")]  # comments, order kept
    dockerfile = (matrix.parent / "dockerfiles" / "cu129" / "Dockerfile").read_text()
    assert f'"org.opencontainers.image.revision"="{new}"' in dockerfile
    assert _run("--matrix", str(matrix), "render", "--check")[0] == 0
    code, out, _ = _run("--matrix", str(matrix), "track", "--target", "cu129", "--check")
    assert code == 0 and "current" in out  # tracking again finds nothing to do


def test_force_push_is_refused_and_matrix_untouched(upstream):
    matrix = upstream["matrix"]
    work = upstream["work"]
    upstream["commit"]("K3: second")
    assert _run("--matrix", str(matrix), "track", "--target", "cu129")[0] == 0  # pin moves to "second"
    before = matrix.read_text()
    work.git.reset("-q", "--hard", upstream["first"])  # rewrite history: "second" disappears
    upstream["commit"]("K3: rewritten")
    code, _, err = _run("--matrix", str(matrix), "track", "--target", "cu129")
    assert code == 2 and "was rewritten" in err and "force-push" in err
    assert matrix.read_text() == before


def test_deleted_branch_is_exit_2(upstream):
    matrix = upstream["matrix"]
    before = matrix.read_text()
    git.Repo(upstream["bare"]).git.symbolic_ref("HEAD", "refs/heads/other")  # so k3 may be deleted
    upstream["work"].git.push("-q", "origin", "--delete", "k3")
    code, _, err = _run("--matrix", str(matrix), "track", "--target", "cu129")
    assert code == 2 and "no longer exists" in err
    assert matrix.read_text() == before


def test_unreachable_remote_and_dangerous_urls(upstream, monkeypatch):
    matrix = upstream["matrix"]
    text = matrix.read_text()
    matrix.write_text(re.sub(r"url: file://\S+", "url: https://127.0.0.1:9/vllm.git", text))
    code, _, err = _run("--matrix", str(matrix), "track", "--target", "cu129")
    assert code == 3 and "cannot reach the remote" in err  # unreachable is exit 3, not bad input
    matrix.write_text(re.sub(r"url: file://\S+", "url: ext::sh -c touch% /tmp/pwned", text))
    code, _, err = _run("--matrix", str(matrix), "track", "--target", "cu129")
    assert code == 2 and "source.url" in err
    matrix.write_text(text)
    monkeypatch.delenv("K3_ALLOW_FILE_URLS")
    code, _, err = _run("--matrix", str(matrix), "track", "--target", "cu129")
    assert code == 2 and "K3_ALLOW_FILE_URLS=1" in err
    assert matrix.read_text() == text


def test_track_says_which_third_party_pins_the_new_commit_moved(upstream, tmp_path):
    from builder.config import matrix as matrix_mod

    target = matrix_mod.load(upstream["matrix"]).target("cu129")
    root = tmp_path / "work"
    files: dict[str, str] = {}
    for _name, spec in target.source.third_party.items():
        files[spec.declared_in] = files.get(spec.declared_in, "") + f"  GIT_TAG {spec.ref}\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    first = upstream["commit"]("K3: vendor the CMake files as they are at the pin")
    matrix_text = upstream["matrix"].read_text().replace(upstream["first"], first)
    upstream["matrix"].write_text(matrix_text)
    assert _run("--matrix", str(upstream["matrix"]), "render")[0] == 0
    deepgemm = root / "cmake/external_projects/deepgemm.cmake"
    deepgemm.write_text('  set(_DEEPGEMM_UPSTREAM_TAG "' + "f" * 40 + '")\n')
    upstream["commit"]("K3: bump DeepGEMM")
    code, out, err = _run("--matrix", str(upstream["matrix"]), "--json", "track", "--target", "cu129", "--check")
    assert code == 1
    doc = json.loads(out)
    assert doc["third_party_changed"] == {"deepgemm": ["f" * 40]}
    assert "third-party 'deepgemm'" in err and "re-pin source.third_party.deepgemm" in err


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


@pytest.mark.parametrize("make", ["cve_2025_4517_tree", "duplicate_link_and_tree", "escaping_link_chain"])
def test_track_refuses_to_move_the_pin_to_a_malformed_tree(upstream, tmp_path, make):
    """Issue 32: `build track` moved the pin to the CVE-2025-4517 commit without complaint. git's
    fsck refuses the duplicate entries at the fetch; the link chain is refused on the listing."""
    from pathlib import Path

    from tests.unit import test_export

    matrix = upstream["matrix"]
    before = matrix.read_text()
    getattr(test_export, make)(test_export.Plumber(Path(upstream["bare"])), tmp_path / "out")
    code, _, err = _run("--matrix", str(matrix), "track", "--target", "cu129")
    assert code == 2, err
    assert len(_error_lines(err)) == 1 and "refused" in _error_lines(err)[0] and "Traceback" not in err
    assert matrix.read_text() == before


def test_commit_subjects_reach_the_terminal_and_json_with_control_characters_escaped(upstream):
    matrix = upstream["matrix"]
    upstream["commit"]("K3: fix \x1b]0;owned\x07title \x1b[2J\u202eevil")
    code, out, err = _run("--matrix", str(matrix), "track", "--target", "cu129", "--check")
    assert code == 1 and "\x1b" not in err and "\u202e" not in err
    assert "K3: fix \\x1b]0;owned\\x07title \\x1b[2J\\u202eevil" in err
    code, out, _ = _run("--matrix", str(matrix), "--json", "track", "--target", "cu129", "--check")
    assert json.loads(out)["subjects"][0].endswith("K3: fix \\x1b]0;owned\\x07title \\x1b[2J\\u202eevil")
