"""The pinned source, against real local git repositories (no Docker)."""

from __future__ import annotations

import os
from pathlib import Path

import git
import pytest

from builder import source
from builder.errors import SourceError
from builder.matrix import Source


@pytest.fixture()
def upstream(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "up", initial_branch="k3")
    (tmp_path / "up" / "req.txt").write_text("-r sub/common.txt\n")
    (tmp_path / "up" / "sub").mkdir()
    (tmp_path / "up" / "sub" / "common.txt").write_text("packaging>=23\n")
    repo.git.add(A=True)
    env = {"GIT_AUTHOR_DATE": "2026-01-02T03:04:05+00:00", "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+00:00",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e.org"}
    with repo.git.custom_environment(**env):
        repo.git.commit("-q", "-m", "first")
    return repo


def _src(repo, **kw):
    base = dict(url=f"file://{repo.working_dir}", branch="k3", commit=repo.head.commit.hexsha,
                package="p", version="1.0")
    base.update(kw)
    return Source(**base)


def test_fetch_verifies_and_exports_with_fixed_mtimes(upstream, tmp_path):
    pinned = source.fetch(_src(upstream))
    assert pinned.source_date_epoch == 1767323045
    out = pinned.export(tmp_path / "export")
    assert (out / "sub" / "common.txt").read_text() == "packaging>=23\n"
    assert not (out / ".git").exists()  # an export, never a checkout
    for dirpath, dirnames, filenames in os.walk(out):
        for name in dirnames + filenames:
            assert os.lstat(os.path.join(dirpath, name)).st_mtime == 1767323045


def test_requirement_includes_are_followed_at_the_commit(upstream):
    files = source.resolve_includes(source.fetch(_src(upstream)), ("req.txt",))
    assert sorted(files) == ["req.txt", "sub/common.txt"]


def test_missing_branch_is_a_clear_error(upstream):
    with pytest.raises(SourceError, match="branch 'gone' not found"):
        source.fetch(_src(upstream, branch="gone"))


def test_commit_not_on_branch_is_refused(upstream):
    with pytest.raises(SourceError, match="does not exist on refs/heads/k3"):
        source.fetch(_src(upstream, commit="0" * 40))
    upstream.git.checkout("-q", "-b", "side")
    (Path(upstream.working_dir) / "x").write_text("x")
    upstream.git.add(A=True)
    upstream.git.commit("-q", "-m", "side only")
    side = upstream.head.commit.hexsha
    source.fetch(_src(upstream, branch="side", commit=side))  # fetched into the mirror
    with pytest.raises(SourceError, match="is not on refs/heads/k3"):
        source.fetch(_src(upstream, commit=side))


def test_full_ref_names_only(upstream):
    upstream.create_tag("k3-tag")
    with pytest.raises(SourceError, match="not found"):
        source.fetch(_src(upstream, branch="k3-tag"))  # a tag is not a branch
