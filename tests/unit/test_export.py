"""The export of an untrusted tree (builder/source/export.py), against malformed commits built
with git plumbing as a hostile upstream would build them (issue 32, defect 1).

The export uses no tarfile and no path check (no ``realpath``), so what these tests show holds
on every Python the tool runs on: 3.11.2 (Debian 12, no extraction filter at all) and 3.11.7 (the
filter, with CVE-2025-4517) alike; both were run (Debian's /usr/bin/python3.11 is 3.11.2), and the
old export wrote ``pwned`` outside the export on both. The malformed commits reach the export in two ways: through a
fetch, which git's fsck now refuses, and through a mirror that already holds the objects (one
filled before the mirrors checked objects, or by hand), which the export refuses on its own.
"""

from __future__ import annotations

import binascii
import dataclasses
import os
import subprocess
from pathlib import Path

import git
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builder.errors import SourceError
from builder.source import pinned as source

_ENV = {
    "GIT_AUTHOR_DATE": "2026-01-02T03:04:05+00:00",
    "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+00:00",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@e.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@e.org",
}
FILE, LINK, TREE = "100644", "120000", "40000"


class Plumber:
    """Objects written straight into a repository, as a hostile upstream can: trees are written
    with ``hash-object --literally``, so git's own checks (sorting, duplicates, names) never run."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo

    def _git(self, *args: str, data: bytes | None = None, check: bool = True) -> str:
        return (
            subprocess.run(
                ["git", "-C", str(self.repo), *args],
                input=data,
                capture_output=True,
                check=check,
                env={**os.environ, **_ENV},
            )
            .stdout.decode()
            .strip()
        )

    def blob(self, data: bytes) -> str:
        return self._git("hash-object", "-w", "--stdin", data=data)

    def link(self, target: str) -> tuple[str, str]:
        return LINK, self.blob(target.encode())

    def tree(self, entries: list[tuple[str, str, str]]) -> str:
        """Entries (mode, name, object id) in exactly the order given, duplicates kept."""
        raw = b"".join(f"{mode} {name}".encode() + b"\0" + binascii.unhexlify(oid) for mode, name, oid in entries)
        return self._git("hash-object", "-w", "-t", "tree", "--literally", "--stdin", data=raw)

    def commit(self, tree: str, branch: str = "k3") -> str:
        parent = self._git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
        commit = self._git("commit-tree", tree, *(["-p", parent] if parent else []), "-m", "hostile")
        self._git("update-ref", f"refs/heads/{branch}", commit)
        return commit


@pytest.fixture()
def upstream(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "up", initial_branch="k3")
    (tmp_path / "up" / "setup.py").write_text("print('ok')\n")
    repo.git.add(A=True)
    with repo.git.custom_environment(**_ENV):
        repo.git.commit("-q", "-m", "first")
    return repo


def _src(repo, commit=None):
    from builder.config.matrix import Source

    return Source(
        url=f"file://{repo.working_dir}",
        branch="k3",
        commit=commit or repo.head.commit.hexsha,
        package="p",
        version="1.0",
    )


def cve_2025_4517_tree(p: Plumber, dest: Path) -> str:
    """The commit of issue 32: CPython's own CVE-2025-4517 test archive, as a git tree.

    Sixteen directories with long names, each with a one-letter link to the next, so that
    ``a/b/.../p`` resolves to a path just under PATH_MAX; a link named with 254 letters at the
    end of that chain pushes the resolved path past PATH_MAX, so a non-strict ``realpath`` stops
    resolving there, while the kernel follows it: it points 16 levels up, at the export's root,
    and ``escape`` goes one more level up, out of the export. Git writes a tree's paths, not a
    link's: the entries behind the links are duplicate entries (a symlink ``a`` and a tree ``a``),
    and ``escape`` is a symlink and a tree holding ``pwned``.
    """
    steps = "abcdefghijklmnop"
    # As CPython's test: the directories' names fill PATH_MAX with the destination in front.
    component = "d" * ((4096 - len(str(dest)) - 1) // (len(steps) + 1))
    empty = p.tree([(FILE, "keep", p.blob(b""))])  # git archive writes no empty directory
    long_link = "l" * 254
    # The letters' side: a/ holds b/ ... p/ holds the long link (written through the links).
    inner = p.tree([(LINK, long_link, p.link("/".join([".."] * len(steps)))[1])])
    for letter in reversed(steps[1:]):
        inner = p.tree([(TREE, letter, inner)])
    letters = inner
    # The directories' side: D/ holds D/ and the next letter, 16 deep.
    level = empty
    for letter in reversed(steps[1:]):
        level = p.tree([(TREE, component, level), (LINK, letter, p.link(component)[1])])
    escape_target = "/".join([*steps, long_link, ".."])
    return p.commit(
        p.tree(
            [
                (TREE, component, level),
                (LINK, "a", p.link(component)[1]),
                (TREE, "a", letters),
                (LINK, "escape", p.link(escape_target)[1]),
                (TREE, "escape", p.tree([(FILE, "pwned", p.blob(b"written outside the export\n"))])),
            ]
        )
    )


def duplicate_link_and_tree(p: Plumber, dest: Path) -> str:
    """A symlink ``a`` to the export's parent and a tree ``a/`` holding a file: the file would be
    written through the link."""
    return p.commit(
        p.tree(
            [
                (LINK, "a", p.link("..")[1]),
                (TREE, "a", p.tree([(FILE, "pwned", p.blob(b"x\n"))])),
            ]
        )
    )


def escaping_link_chain(p: Plumber, dest: Path) -> str:
    """Only a chain: twenty links into twenty nested directories, then 21 levels up, one out of
    the tree (no duplicate entry: git's fsck lets this one through; the export refuses it)."""
    component = "d" * 90
    level = p.tree([(FILE, "keep", p.blob(b""))])
    for letter in reversed("bcdefghijklmnopqrst"):
        level = p.tree([(TREE, component, level), (LINK, letter, p.link(component)[1])])
    chain = "/".join("abcdefghijklmnopqrst") + "/" + "/".join([".."] * 21)
    return p.commit(
        p.tree([(TREE, component, level), (LINK, "a", p.link(component)[1]), (LINK, "up", p.link(chain)[1])])
    )


def _outside(tmp_path: Path, export: Path) -> set[str]:
    """Everything under tmp_path but the export (and the mirrors), as paths."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(tmp_path):
        if Path(dirpath) == tmp_path:
            dirnames[:] = [d for d in dirnames if d not in (export.name, "cache", "up")]
        found.update(os.path.join(dirpath, n) for n in dirnames + filenames)
    return found


def _fill_mirror_without_fsck(pinned: source.PinnedSource, upstream: git.Repo) -> None:
    """The mirror receives the hostile objects without checks (a mirror filled before its objects
    were checked, or copied in by hand): only the export stands between them and the host."""
    pinned.repo.git(c=["transfer.fsckObjects=false", "fetch.fsckObjects=false"]).fetch(
        "--no-tags", "--force", "--", f"file://{upstream.working_dir}", "+refs/heads/k3:refs/k3/k3"
    )


MALFORMED = [cve_2025_4517_tree, duplicate_link_and_tree, escaping_link_chain]


@pytest.mark.parametrize("make", MALFORMED, ids=lambda f: f.__name__)
def test_a_malformed_tree_in_the_mirror_is_refused_and_nothing_is_written_outside(upstream, tmp_path, make):
    """Fails on the git archive | tarfile export (Python 3.11.7): the CVE tree wrote
    tmp_path/pwned through the links."""
    dest = tmp_path / "out"
    clean = source.fetch(_src(upstream))
    before = _outside(tmp_path, dest)
    bad = make(Plumber(Path(upstream.working_dir)), dest)
    _fill_mirror_without_fsck(clean, upstream)
    pinned = dataclasses.replace(clean, commit=bad)
    with pytest.raises(SourceError) as err:
        pinned.export(dest)
    assert err.value.exit_code == 2 and "\n" not in err.value.message and "refused" in err.value.message
    assert _outside(tmp_path, dest) == before, "the export wrote outside its directory"
    assert not (tmp_path / "pwned").exists()
    assert os.listdir(dest) == []  # refused before anything was written


@pytest.mark.parametrize("make", [cve_2025_4517_tree, duplicate_link_and_tree], ids=lambda f: f.__name__)
def test_a_malformed_tree_is_refused_at_the_fetch_by_fsck(upstream, tmp_path, make):
    bad = make(Plumber(Path(upstream.working_dir)), tmp_path / "out")
    with pytest.raises(SourceError, match=r"git refused a malformed object \(transfer\.fsckObjects") as err:
        source.fetch(_src(upstream, bad))
    assert err.value.exit_code == 2 and "\n" not in err.value.message
    assert not (tmp_path / "pwned").exists()


def test_the_export_keeps_modes_links_and_submodule_directories(upstream, tmp_path):
    """What the tree says, as git archive wrote it before: 0644/0755 whatever the umask, a link
    inside the tree as a link, a gitlink as an empty directory."""
    p = Plumber(Path(upstream.working_dir))
    run = p.blob(b"#!/bin/sh\n")
    commit = p.commit(
        p.tree(
            [
                (FILE, "a.py", p.blob(b"x = 1\n")),
                (LINK, "link.sh", p.link("run.sh")[1]),
                (TREE, "pkg", p.tree([(LINK, "up.py", p.link("../a.py")[1])])),
                ("100755", "run.sh", run),
                ("160000", "sub", "1" * 40),
            ]
        )
    )
    old = os.umask(0o077)
    try:
        out = source.fetch(_src(upstream, commit)).export(tmp_path / "out")
    finally:
        os.umask(old)
    assert os.stat(out / "a.py").st_mode & 0o7777 == 0o644
    assert os.stat(out / "run.sh").st_mode & 0o7777 == 0o755
    assert os.stat(out / "pkg").st_mode & 0o7777 == 0o755
    assert os.readlink(out / "link.sh") == "run.sh" and os.readlink(out / "pkg" / "up.py") == "../a.py"
    assert (out / "sub").is_dir() and not os.listdir(out / "sub")
    assert (out / "pkg" / "up.py").read_text() == "x = 1\n"


def test_attributes_change_nothing_and_run_nothing(upstream, tmp_path, monkeypatch):
    """.gitattributes asked for export-subst (git archive ran the host's gpg for %G?) and a filter
    driver of the host's git config (a command); the export reads the objects' bytes."""
    canary = tmp_path / "filter-ran"
    config = tmp_path / "gitconfig"
    config.write_text(f'[filter "up"]\n\tsmudge = "touch {canary}; cat"\n\tclean = cat\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    p = Plumber(Path(upstream.working_dir))
    text = b"$Format:%H %G?$\n"
    commit = p.commit(
        p.tree(
            [
                (FILE, ".gitattributes", p.blob(b"* export-subst filter=up\nignored export-ignore\n")),
                (FILE, "ignored", p.blob(b"kept\n")),
                (FILE, "v.txt", p.blob(text)),
            ]
        )
    )
    out = source.fetch(_src(upstream, commit)).export(tmp_path / "out")
    assert (out / "v.txt").read_bytes() == text and (out / "ignored").read_text() == "kept\n"
    assert not canary.exists()


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([(FILE, "..", "x")], "component git itself would not check out"),
        ([(FILE, ".git", "x")], "component git itself would not check out"),
        ([(TREE, ".GIT", "tree")], "component git itself would not check out"),
        ([(FILE, "a", "x"), (FILE, "a", "x")], "appears twice"),
        ([(FILE, "a", "x"), (TREE, "a", "tree")], "appears twice"),
        ([(LINK, "l", "/etc")], "leads to an absolute path"),
        ([(LINK, "l", "..")], "points outside the tree"),
        ([(LINK, "l", "m"), (LINK, "m", "l")], "more than 40 links"),
        ([(LINK, "s", "t/../.."), (TREE, "t", "tree")], "points outside the tree"),
        # A link through a link, then up: fine on the names, outside on disk.
        ([(LINK, "d", "."), (TREE, "x", "deep")], "points outside the tree"),
    ],
)
def test_each_rule_refuses_in_one_line_and_writes_nothing(upstream, tmp_path, entries, message):
    clean = source.fetch(_src(upstream))
    p = Plumber(Path(upstream.working_dir))
    x = p.blob(b"x\n")
    tree = p.tree([(FILE, "f", x)])
    deep = p.tree([(LINK, "d", p.link("..")[1]), (LINK, "e", p.link("d/../..")[1])])
    objects = {"x": x, "tree": tree, "deep": deep}
    made = [(mode, name, objects.get(ref) or p.link(ref)[1]) for mode, name, ref in entries]
    commit = p.commit(p.tree(made))
    _fill_mirror_without_fsck(clean, upstream)
    with pytest.raises(SourceError, match=message) as err:
        dataclasses.replace(clean, commit=commit).export(tmp_path / "out")
    assert "\n" not in err.value.message and os.listdir(tmp_path / "out") == []


def test_the_caps_refuse_a_tree_before_writing(upstream, tmp_path):
    from builder.source.export import Limits

    p = Plumber(Path(upstream.working_dir))
    commit = p.commit(p.tree([(FILE, f"f{i}", p.blob(b"0123456789")) for i in range(5)]))
    pinned = source.fetch(_src(upstream, commit))
    dataclasses.replace(pinned, limits=Limits(max_bytes=50, max_files=5)).export(tmp_path / "ok")
    with pytest.raises(SourceError, match=r"5 files exceed the export cap of 4 \(source\.export\.max_files\)"):
        dataclasses.replace(pinned, limits=Limits(max_bytes=50, max_files=4)).export(tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []
    with pytest.raises(SourceError, match=r"50 bytes exceed the export cap of 49 \(source\.export\.max_bytes\)"):
        dataclasses.replace(pinned, limits=Limits(max_bytes=49, max_files=10)).export(tmp_path / "out")


def _third_party(url: str, commit: str, subs=()) -> source.PinnedThirdParty:
    from builder.source.export import Limits

    return source.PinnedThirdParty("lib", url, commit, 1767323045, tuple(subs), Limits(1 << 20, 100))


def test_a_malformed_third_party_tree_is_refused_at_its_fetch_and_from_its_mirror(upstream, tmp_path):
    """The third-party trees (and their submodules) use the same export: issue 32 wrote outside
    through a third-party tree too."""
    lib = git.Repo.init(tmp_path / "lib", initial_branch="k3")
    (tmp_path / "lib" / "k.c").write_text("int k;\n")
    lib.git.add(A=True)
    with lib.git.custom_environment(**_ENV):
        lib.git.commit("-q", "-m", "lib")
    url = f"file://{lib.working_dir}"
    bad = duplicate_link_and_tree(Plumber(Path(lib.working_dir)), tmp_path / "tp")
    with pytest.raises(SourceError, match=r"git refused a malformed object \(transfer\.fsckObjects: 'duplicateEntries"):
        _third_party(url, bad).export(tmp_path / "tp")
    mirror = source._mirror(url)
    mirror.git(c=["transfer.fsckObjects=false", "fetch.fsckObjects=false"]).fetch(
        "--no-tags", "--", url, "+refs/heads/k3:refs/k3/heads/k3"
    )
    with pytest.raises(SourceError, match=r"third-party source lib at [0-9a-f]{12}: 'a' appears twice"):
        _third_party(url, bad).export(tmp_path / "tp")
    assert not (tmp_path / "pwned").exists() and os.listdir(tmp_path / "tp") == []


def test_a_submodule_is_never_written_through_a_link_in_its_parent(upstream, tmp_path):
    """The parent tree puts a symlink where the submodule goes (deps -> other): the submodule's
    files would go where the link leads (with a link out of the tree refused by the listing, it
    leads inside, but a link is still never followed). The directory is reached one handle at a
    time, with O_NOFOLLOW."""
    p = Plumber(Path(upstream.working_dir))
    leaf = p.commit(p.tree([(FILE, "pwned", p.blob(b"x\n"))]), branch="leaf")
    other = p.tree([(FILE, "keep", p.blob(b""))])
    parent = p.commit(p.tree([(LINK, "deps", p.link("other")[1]), (TREE, "other", other)]))
    url = f"file://{upstream.working_dir}"
    tp = _third_party(url, parent, [source.Submodule("deps/leaf", url, leaf)])
    with pytest.raises(SourceError, match=r"submodule deps/leaf at [0-9a-f]{12}: 'deps/leaf' is not a directory"):
        tp.export(tmp_path / "tp")
    assert os.listdir(tmp_path / "tp" / "other") == ["keep"]


def test_the_tools_own_archival_file_replaces_a_link_of_that_name(upstream, tmp_path):
    """A tree's .git_archival.txt that is a link (to a host file, or through which another link
    climbs) is not followed: the tool's own file is written in its place."""
    p = Plumber(Path(upstream.working_dir))
    commit = p.commit(
        p.tree(
            [
                (LINK, ".git_archival.txt", p.link("setup.py")[1]),
                (LINK, "climb", p.link(".git_archival.txt/..")[1]),
                (FILE, "setup.py", p.blob(b"print('ok')\n")),
            ]
        )
    )
    out = source.fetch(_src(upstream, commit)).export(tmp_path / "out")
    assert not os.path.islink(out / ".git_archival.txt")
    assert (out / ".git_archival.txt").read_text() == f"node: {commit}\n"
    assert (out / "setup.py").read_text() == "print('ok')\n"


# --- the listing's link resolution against the kernel's -------------------------------------------

_DIRS = [b"d", b"d/e"]
_LINKS = [b"l1", b"d/l2", b"d/e/l3"]
_PART = st.sampled_from([b"..", b".", b"d", b"e", b"l1", b"l2", b"l3", b"x"])


@settings(max_examples=int(os.environ.get("K3_HYPOTHESIS_EXAMPLES", "300")), deadline=None, derandomize=True)
@given(targets=st.lists(st.lists(_PART, min_size=1, max_size=6), min_size=3, max_size=3))
def test_a_link_the_kernel_resolves_outside_the_tree_is_always_refused(tmp_path_factory, targets):
    """The listing's resolution is checked against the kernel's own: each tree of directories and
    links is made on disk (paths short: realpath resolves them fully here), and whenever the
    kernel takes a link outside the tree, the plan refuses it."""
    from builder.source import export

    root = tmp_path_factory.mktemp("tree") / "root"
    root.mkdir()
    tree = export.ExportPlan([])
    for d in _DIRS:
        (root / d.decode()).mkdir()
        tree.kinds[d] = 0o040000
    for link, parts in zip(_LINKS, targets, strict=True):
        target = b"/".join(parts)
        os.symlink(target, root / link.decode())
        tree.kinds[link], tree.links[link] = 0o120000, target
    for link in _LINKS:
        try:
            os.stat(root / link.decode())
            loops = False
        except OSError as exc:
            loops = exc.errno == 40  # ELOOP
        real = os.path.realpath(root / link.decode())
        outside = not (real == str(root) or real.startswith(f"{root}/"))
        try:
            export._resolve_inside(tree, link, "t")
            refused = False
        except SourceError:
            refused = True
        assert refused or not (outside or loops), (link, tree.links, real)


def test_a_mirror_made_before_this_change_gets_its_objects_checked_from_now_on(upstream):
    url = f"file://{upstream.working_dir}"
    old = git.Repo.init(source._mirror_path(url), bare=True, mkdir=True)  # as the tool made mirrors before
    assert not old.config_reader("repository").has_option("transfer", "fsckObjects")
    source.fetch(_src(upstream))
    config = git.Repo(source._mirror_path(url)).config_reader("repository")
    for key, value in source.MIRROR_CONFIG.items():
        section, _, option = key.rpartition(".")
        assert str(config.get_value(section, option)).lower() == value, key
    before = os.stat(Path(old.git_dir) / "config").st_mtime_ns
    source.fetch(_src(upstream))
    assert os.stat(Path(old.git_dir) / "config").st_mtime_ns == before  # not written again when set


def test_a_parent_link_through_a_submodule_link_is_resolved_across_the_assembled_tree(upstream, tmp_path):
    """Issue 49: the submodule holds ``l -> .``; the parent's ``p -> sub/l/../..`` stays inside the
    parent alone (``sub/l`` is a directory there) and inside the submodule alone, but on disk
    ``sub/l/..`` is the tree's top and one more ``..`` leaves it. Refused, and nothing written."""
    p = Plumber(Path(upstream.working_dir))
    leaf = p.commit(p.tree([(FILE, "k.c", p.blob(b"int k;\n")), (LINK, "l", p.link(".")[1])]), branch="leaf")
    parent = p.commit(p.tree([(LINK, "p", p.link("sub/l/../..")[1]), ("160000", "sub", leaf)]))
    url = f"file://{upstream.working_dir}"
    tp = _third_party(url, parent, [source.Submodule("sub", url, leaf)])
    with pytest.raises(SourceError, match=r"third-party source lib at [0-9a-f]{12}: symlink 'p' points outside"):
        tp.export(tmp_path / "tp")
    assert os.listdir(tmp_path / "tp") == []
    inside = p.commit(p.tree([(LINK, "p", p.link("sub/l/k.c")[1]), ("160000", "sub", leaf)]))
    tp = _third_party(url, inside, [source.Submodule("sub", url, leaf)])
    out = tp.export(tmp_path / "ok")
    assert (out / "p").read_text() == "int k;\n"  # through the submodule's link, inside the tree
