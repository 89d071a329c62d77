"""The least-privilege probe (builder/checks/probes/privilege.py) run as a user that is not root
(issue 38). Root can write everything, so as root every "writable" and "can this user write the
cache" answer is yes whatever the modes say, and a broken rule hides. Here the probe runs as it
runs in the image, as an unprivileged user (uid and gid 65534, nobody/nogroup, no supplementary
groups; the test must start as root to become it), over a tree whose modes and owners each rule
is about, and every answer is stated exactly: written by mode for others, by mode for its group,
by owning (it could chmod), not by a root-owned 0755/0644 file, a symlink never (its target is
judged where it lies), PATH directories one level deep, sys.path ones recursively; and each cache
variable: writable, creatable under a writable ancestor, not writable, not absolute, on or
holding a code directory."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from builder.checks import probes

NOBODY = 65534
pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="becoming uid 65534 needs root (the test runs as it)"
)


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.fixture()
def world():
    """A directory every user can traverse (pytest's tmp_path is 0700 root's)."""
    top = Path(tempfile.mkdtemp(prefix="k3-privilege-"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _make(path: Path, mode: int, *, directory: bool = False, uid: int = 0, gid: int = 0) -> Path:
    if directory:
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


@functools.cache
def _python() -> str:
    """An interpreter the unprivileged user can run (this test's may live under root's 0700 home);
    the probe needs only the standard library, as in the image."""
    for exe in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            subprocess.run([exe, "-S", "-c", "pass"], check=True, preexec_fn=_as_nobody, timeout=60)  # noqa: PLW1509
        except (OSError, subprocess.SubprocessError):
            continue
        return exe
    pytest.skip("no Python interpreter uid 65534 can run here")


def _probe(request: dict, env: dict[str, str], cwd: Path) -> dict:
    proc = subprocess.run(
        [_python(), "-S", "-c", probes.script("privilege"), json.dumps(request)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        preexec_fn=_as_nobody,  # noqa: PLW1509 - the child drops root before it runs anything
        timeout=120,
    )
    found = probes.parse(proc.stdout)
    assert found is not None, proc.stderr
    return found


def _entry(path: Path) -> list:
    st = os.lstat(path)
    return [str(path), oct(st.st_mode & 0o7777), st.st_uid, st.st_gid]


def test_writability_by_mode_group_and_owner_as_an_unprivileged_user(world):
    site = _make(world / "site", 0o755, directory=True)
    _make(site / "fine.py", 0o644)
    _make(site / "pkg" / "deep.py", 0o644)
    world_w = _make(site / "pkg" / "sub" / "open.py", 0o666)  # by mode for others, found recursively
    group_w = _make(site / "grp", 0o775, directory=True, gid=NOBODY)  # by its group
    _make(site / "grp" / "x.py", 0o644)
    owned = _make(site / "mine.py", 0o444, uid=NOBODY, gid=0)  # read-only, but its owner can chmod it
    _make(site / "other_group.py", 0o664, gid=1)  # group-writable for a group the user is not in
    (site / "link.py").symlink_to(world_w)  # a link: judged where its target lies, not as itself
    bin_dir = _make(world / "bin", 0o755, directory=True)
    tool = _make(bin_dir / "tool", 0o777)
    _make(bin_dir / "sub" / "deep", 0o777)  # a PATH directory is not searched recursively
    _make(bin_dir / "ok", 0o755)
    env = {"PYTHONPATH": str(site), "PATH": str(bin_dir)}
    found = _probe({"roots": [], "caches": ""}, env, world)
    assert (found["uid"], found["gids"]) == (NOBODY, [NOBODY])
    assert sorted(found["writable"]) == sorted(_entry(p) for p in (world_w, group_w, owned, tool))
    assert found["setid"] == [] and found["caches"] == {}
    assert found["count"] == 4


def test_set_id_files_under_the_roots(world):
    root = _make(world / "opt", 0o755, directory=True)
    suid = _make(root / "bin" / "su", 0o4755)
    sgid = _make(root / "bin" / "sg", 0o2711)
    _make(root / "bin" / "plain", 0o755)
    _make(root / "sticky", 0o1777, directory=True)  # a directory's bits are not a set-id file
    found = _probe({"roots": [str(root)], "caches": ""}, {"PATH": ""}, world)
    assert sorted(found["setid"]) == sorted([[str(suid), "0o4755"], [str(sgid), "0o2711"]])
    assert found["count"] == 2


def test_each_cache_variable_judged_as_the_user(world):
    site = _make(world / "site", 0o755, directory=True)
    _make(world / "open", 0o777, directory=True)
    locked = _make(world / "locked", 0o755, directory=True)
    _make(world / "mine", 0o700, directory=True, uid=NOBODY, gid=NOBODY)
    _make(world / "afile", 0o666)
    env = {
        "PYTHONPATH": str(site),
        "PATH": "",
        "K3_CACHE_WRITABLE": str(world / "open" / "triton"),  # to be made under a writable directory
        "K3_CACHE_MINE": str(world / "mine"),
        "K3_CACHE_LOCKED": str(locked / "cuda"),  # root's 0755 directory: not writable as the user
        "K3_CACHE_LOCKED_ITSELF": str(locked),
        "K3_CACHE_RELATIVE": "cache/here",
        "K3_CACHE_ON_CODE": str(site / "cache"),
        "K3_CACHE_HOLDS_CODE": str(world),
        "K3_CACHE_UNDER_FILE": str(world / "afile" / "x"),
        "K3_NOT_A_CACHE": str(locked),  # not matched by the pattern: not judged
    }
    found = _probe({"roots": [], "caches": "K3_CACHE_.*"}, env, world)
    assert found["caches"] == {
        "K3_CACHE_HOLDS_CODE": [str(world), f"holds the sys.path or PATH directory {site}"],
        "K3_CACHE_LOCKED": [
            str(locked / "cuda"),
            f"is not writable by uid {NOBODY} ({locked} is the nearest that exists)",
        ],
        "K3_CACHE_LOCKED_ITSELF": [str(locked), f"is not writable by uid {NOBODY}"],
        "K3_CACHE_MINE": [str(world / "mine"), None],
        "K3_CACHE_ON_CODE": [str(site / "cache"), f"is on sys.path or PATH ({site})"],
        "K3_CACHE_RELATIVE": ["cache/here", "is not an absolute path"],
        "K3_CACHE_UNDER_FILE": [str(world / "afile" / "x"), f"cannot be a directory: {world / 'afile'} is not one"],
        "K3_CACHE_WRITABLE": [str(world / "open" / "triton"), None],
    }
    assert found["count"] == 6 + len(found["writable"])


def test_the_group_bits_apply_to_a_member_of_the_group_not_the_others_bits(world):
    # POSIX: a user in the file's group gets the group's bits, even when the others' are wider;
    # nobody is in nogroup, so r-x for the group is not writable whatever the others may do
    site = _make(world / "site", 0o755, directory=True)
    rx = _make(site / "rx", 0o755, directory=True, gid=NOBODY)
    wider = _make(site / "wider", 0o757, directory=True, gid=NOBODY)
    others = _make(site / "others", 0o757, directory=True, gid=1)  # not its group: the others' rwx apply
    found = _probe({"roots": [], "caches": ""}, {"PYTHONPATH": str(site), "PATH": ""}, world)
    assert found["writable"] == [_entry(others)]
    assert _entry(rx) not in found["writable"] and _entry(wider) not in found["writable"]
    assert found["count"] == 1


def test_path_is_split_on_colons_and_a_path_seen_before_does_not_end_a_listing(world):
    # PATH lists a missing directory first; one of PATH's directories holds a sys.path directory,
    # walked (and seen) first: the listing goes on past it to the writable tool after it
    bin_dir = _make(world / "bin", 0o755, directory=True)
    _make(bin_dir / "alib", 0o755, directory=True)  # on sys.path too: seen before PATH is walked
    _make(bin_dir / "alib" / "m.py", 0o644)
    tool = _make(bin_dir / "tool", 0o777)
    env = {"PYTHONPATH": str(bin_dir / "alib"), "PATH": f"{world / 'missing'}:{bin_dir}"}
    found = _probe({"roots": [], "caches": ""}, env, world)
    assert found["writable"] == [_entry(tool)]
    assert found["scanned"] > 4  # every path looked at is counted (the standard library's too)


def test_writable_findings_are_capped_at_the_limit_and_all_counted(world):
    site = _make(world / "site", 0o755, directory=True)
    for i in range(203):
        _make(site / f"m{i:03}.py", 0o666)
    found = _probe({"roots": [], "caches": ""}, {"PYTHONPATH": str(site), "PATH": ""}, world)
    assert (len(found["writable"]), found["count"]) == (200, 203)


def test_a_sys_path_directory_inside_another_does_not_end_the_outer_listing(world):
    # site/inner is on sys.path before site: walking site, its (already seen) inner directory
    # comes before the files beside it, which are still judged
    site = _make(world / "site", 0o755, directory=True)
    _make(site / "inner", 0o755, directory=True)
    _make(site / "inner" / "m.py", 0o644)
    late = _make(site / "z.py", 0o666)
    env = {"PYTHONPATH": f"{site / 'inner'}:{site}", "PATH": ""}
    found = _probe({"roots": [], "caches": ""}, env, world)
    assert found["writable"] == [_entry(late)]


def test_a_cache_on_or_holding_a_sys_path_or_path_entry_that_does_not_exist_yet_is_refused(world):
    """Made later, such an entry is importable or run from the moment the cache creates it."""
    _make(world / "open", 0o777, directory=True)
    future_site = world / "open" / "site"  # on sys.path, not made yet: the user could make it
    future_bin = world / "open" / "bin"
    env = {
        "PYTHONPATH": str(future_site),
        "PATH": str(future_bin),
        "K3_CACHE_SITE": str(future_site / "cache"),
        "K3_CACHE_BIN": str(future_bin),
        "K3_CACHE_ABOVE": str(world / "open"),
        "K3_CACHE_BESIDE": str(world / "open" / "cache"),
    }
    found = _probe({"roots": [], "caches": "K3_CACHE_.*"}, env, world)
    assert found["caches"] == {
        "K3_CACHE_ABOVE": [str(world / "open"), f"holds the sys.path or PATH directory {future_bin}"],
        "K3_CACHE_BESIDE": [str(world / "open" / "cache"), None],
        "K3_CACHE_BIN": [str(future_bin), f"is on sys.path or PATH ({future_bin})"],
        "K3_CACHE_SITE": [str(future_site / "cache"), f"is on sys.path or PATH ({future_site})"],
    }
