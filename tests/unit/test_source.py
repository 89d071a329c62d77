"""The pinned source, against real local git repositories (no Docker)."""

from __future__ import annotations

import io
import os
import tarfile
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


# --- third-party sources ----------------------------------------------------------------------

_ENV = {"GIT_AUTHOR_DATE": "2026-02-03T04:05:06+00:00", "GIT_COMMITTER_DATE": "2026-02-03T04:05:06+00:00",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.org", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e.org"}


def _repo(path: Path, files: dict[str, str], gitlinks: dict[str, tuple[str, str]] | None = None) -> git.Repo:
    repo = git.Repo.init(path, initial_branch="main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    if gitlinks:
        (path / ".gitmodules").write_text("".join(f'[submodule "{p}"]\n\tpath = {p}\n\turl = {u}\n'
                                                  for p, (u, _) in gitlinks.items()))
    repo.git.add(A=True)
    for p, (_, commit) in (gitlinks or {}).items():
        repo.git.update_index("--add", "--cacheinfo", f"160000,{commit},{p}")
    with repo.git.custom_environment(**_ENV):
        repo.git.commit("-q", "-m", "c")
    return repo


@pytest.fixture()
def third(tmp_path, upstream):
    leaf = _repo(tmp_path / "leaf", {"include/leaf.h": "int leaf;\n"})
    lib = _repo(tmp_path / "lib", {"src/k.c": "int k;\n"},
                {"deps/leaf": (f"file://{leaf.working_dir}", leaf.head.commit.hexsha)})
    lib.create_tag("v1.0")
    # The main source names the dependency the way vLLM's CMake files do.
    (Path(upstream.working_dir) / "deps.cmake").write_text(f"GIT_TAG {lib.head.commit.hexsha}\n# also v1.0\n")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "deps")
    return lib, leaf


def _tp(lib, **kw):
    from builder.matrix import ThirdParty

    base = dict(url=f"file://{lib.working_dir}", commit=lib.head.commit.hexsha, ref=lib.head.commit.hexsha,
                declared_in="deps.cmake", env="LIB_SRC_DIR")
    base.update(kw)
    return ThirdParty(**base)


def test_a_third_party_tree_exports_with_its_submodules(third, upstream, tmp_path):
    lib, leaf = third
    pinned = source.fetch(_src(upstream))
    tp = source.fetch_third_party("lib", _tp(lib), pinned)
    assert [(s.path, s.commit) for s in tp.submodules] == [("deps/leaf", leaf.head.commit.hexsha)]
    out = tp.export(tmp_path / "tp")
    assert (out / "src" / "k.c").exists() and (out / "deps" / "leaf" / "include" / "leaf.h").exists()
    assert {os.lstat(p).st_mtime for p in out.rglob("*")} == {tp.source_date_epoch}
    none = source.fetch_third_party("lib", _tp(lib, submodules="none"), pinned)
    assert none.submodules == ()


def test_a_tag_that_moved_or_a_ref_the_source_no_longer_names_is_refused(third, upstream):
    lib, _ = third
    pinned = source.fetch(_src(upstream))
    first = lib.head.commit.hexsha
    source.fetch_third_party("lib", _tp(lib, ref="v1.0"), pinned)  # the tag points at the pin
    (Path(lib.working_dir) / "src" / "k.c").write_text("int moved;\n")
    lib.git.add(A=True)
    with lib.git.custom_environment(**_ENV):
        lib.git.commit("-q", "-m", "moved")
    lib.git.tag("-f", "v1.0")
    with pytest.raises(SourceError, match=f"'v1.0' points at {lib.head.commit.hexsha}, the matrix pins {first}"):
        source.fetch_third_party("lib", _tp(lib, ref="v1.0", commit=first), pinned)
    with pytest.raises(SourceError, match="no longer names 'v9'"):
        source.fetch_third_party("lib", _tp(lib, ref="v9"), pinned)


def test_relative_submodule_urls_resolve_like_git():
    assert source._relative_url("https://github.com/org/repo.git", "../dep.git") == "https://github.com/org/dep.git"
    assert source._relative_url("file:///srv/git/repo", "../dep") == "file:///srv/git/dep"


def _tar(entries) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, extra in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size, info.mode = len(extra), 0o4755
                tar.addfile(info, io.BytesIO(extra))
            else:
                info.type, info.linkname = (tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE), extra
                tar.addfile(info)
    buf.seek(0)
    return tarfile.open(fileobj=buf)


def test_archive_members_without_the_data_filter_keep_inside_the_tree(tmp_path):
    """Python 3.11.2 (Debian 12) has no extraction filter: the fallback refuses the same things."""
    ok = _tar([("pkg/a.py", "file", b"x"), ("pkg/link", "sym", "a.py"), ("pkg/hard", "lnk", "pkg/a.py")])
    members = list(source._data_members(ok, tmp_path))
    assert [m.name for m in members] == ["pkg/a.py", "pkg/link", "pkg/hard"]
    assert members[0].mode == 0o755  # setuid dropped
    for bad in ([("../evil", "file", b"x")], [("/etc/evil", "file", b"x")], [("pkg/l", "sym", "../../etc/passwd")],
                [("pkg/l", "sym", "/etc/passwd")], [("h", "lnk", "../outside")]):
        with pytest.raises(SourceError, match="outside the source tree"):
            list(source._data_members(_tar(bad), tmp_path))


def test_git_reason_names_the_fatal_lines():
    exc = git.GitCommandError(["git", "fetch"], 128, stderr=(
        "fatal: detected dubious ownership in repository at '/srv/x'\nTo add an exception, call:\n"
        "\tgit config --global --add safe.directory /srv/x\nfatal: Could not read from remote repository.\n\n"
        "Please make sure you have the correct access rights\nand the repository exists."))
    assert source.git_reason(exc) == ("detected dubious ownership in repository at '/srv/x'; "
                                      "Could not read from remote repository.")
