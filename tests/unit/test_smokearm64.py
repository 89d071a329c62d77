"""The smoke bases' roots (smokeroots, both platforms): what the dpkg database of a made root says
is installed, the runtime root left as mmdebstrap's cleanup leaves it; and the rule that an arm64
base holds what its amd64 sibling holds (one index tag, one content)."""

from __future__ import annotations

import pytest
import yaml

from builder.errors import BuildError
from builder.smoke import smoke, smokearm64, smokeroots

STATUS = """Package: libc6
Status: install ok installed
Priority: optional
Architecture: arm64
Multi-Arch: same
Version: 2.36-9+deb12u14
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system. Version: not a field

Package: bash
Essential: yes
Status: install ok installed
Architecture: arm64
Version: 5.2.15-2+b13
Conffiles:
 /etc/bash.bashrc 89269e1298235f1b12b4c16e4065ad0d

Package: oldthing
Status: deinstall ok config-files
Architecture: arm64
Version: 1.0-1

Package: half
Status: install ok unpacked
Architecture: arm64
Version: 2.0-1
"""


def test_installed_reads_only_installed_packages_from_the_dpkg_status(tmp_path):
    status = tmp_path / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text(STATUS)
    assert smokeroots.installed(tmp_path) == {"libc6": "2.36-9+deb12u14", "bash": "5.2.15-2+b13"}


def test_the_same_packages_pass_with_binnmus_and_each_toolchains_own_packages():
    """What the runtime bases made on this machine differ in (measured: 156 packages each): the
    binutils for the machine's own triplet, libquadmath0 on amd64, libhwasan0 on arm64."""
    amd64 = {"libc6": "2.36-9+deb12u14", "bash": "5.2.15-2+b13", "libidn2-0": "2.3.3-1+b1"}
    arm64 = {"libc6": "2.36-9+deb12u14", "bash": "5.2.15-2+b13", "libidn2-0": "2.3.3-1"}
    amd64 |= {"binutils-x86-64-linux-gnu": "2.40-2", "libquadmath0": "12.2.0-14+deb12u1"}
    arm64 |= {"binutils-aarch64-linux-gnu": "2.40-2", "libhwasan0": "12.2.0-14+deb12u1"}
    smokearm64.same_packages("runtime", arm64, amd64)  # no exception


def test_an_architecture_only_package_on_the_other_architecture_is_refused():
    with pytest.raises(BuildError, match="only on arm64: libquadmath0"):
        smokearm64.same_packages("runtime", {"libquadmath0": "1"}, {})


def test_a_package_on_one_platform_only_or_another_version_is_refused_by_name():
    amd64 = {"libc6": "2.36-9+deb12u14", "usr-is-merged": "37~deb12u1", "gcc": "4:12.2.0-3"}
    arm64 = {"libc6": "2.36-9+deb12u13", "usrmerge": "37~deb12u1", "perl": "5.36.0-7", "gcc": "4:12.2.0-3"}
    with pytest.raises(BuildError) as err:
        smokearm64.same_packages("runtime", arm64, amd64)
    text = str(err.value)
    assert "the arm64 runtime base" in text
    assert "only on arm64: perl, usrmerge" in text
    assert "only on amd64: usr-is-merged" in text
    assert "libc6 2.36-9+deb12u14 (amd64) / 2.36-9+deb12u13 (arm64)" in text
    assert "gcc" not in text


def test_the_devel_base_is_the_runtime_base_plus_packages():
    """Each devel root is made from its runtime root: every runtime package must be in it."""
    runtime, devel = smoke.BASES["runtime"][1], smoke.BASES["devel"][1]
    assert set(runtime) <= set(devel)
    assert [p for p in devel if p not in runtime] == ["python3-venv", "git", "patch"]


def test_the_runtime_copy_is_left_as_mmdebstraps_cleanup_leaves_the_devel_root(tmp_path):
    """The runtime root is copied out while mmdebstrap still runs (a customize hook): its service
    blockers and setup files must not ship in the runtime base."""
    runtime, devel = tmp_path / "runtime", tmp_path / "devel"
    for root in (runtime, devel):
        (root / "usr" / "sbin").mkdir(parents=True)
        (root / "etc").mkdir()
    (devel / "usr/sbin/start-stop-daemon").write_bytes(b"\x7fELF real")
    (runtime / "usr/sbin/start-stop-daemon").write_text("#!/bin/sh\necho fake\n")
    (runtime / "usr/sbin/start-stop-daemon.REAL").write_bytes(b"\x7fELF real")
    (runtime / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
    for leftover in smokeroots._MMDEBSTRAP_LEFTOVERS:
        (runtime / leftover).parent.mkdir(parents=True, exist_ok=True)
        (runtime / leftover).write_text("x")
    (runtime / "var/cache/apt").mkdir()
    (runtime / "var/cache/apt/pkgcache.bin").write_text("cache")
    (runtime / "etc/machine-id").write_text("0123456789abcdef\n")
    for kept_or_not in ("run/lock/x", "run/mount/utab", "run/adduser", "tmp/hook/file"):
        (runtime / kept_or_not).parent.mkdir(parents=True, exist_ok=True)
        (runtime / kept_or_not).write_text("x")

    smokeroots._finish_runtime(runtime, devel)

    assert (runtime / "usr/sbin/start-stop-daemon").read_bytes() == b"\x7fELF real"
    assert not (runtime / "usr/sbin/start-stop-daemon.REAL").exists()
    assert not (runtime / "usr/sbin/policy-rc.d").exists()
    assert not any((runtime / leftover).exists() for leftover in smokeroots._MMDEBSTRAP_LEFTOVERS)
    assert not (runtime / "var/cache/apt/pkgcache.bin").exists()
    assert (runtime / "etc/machine-id").read_text() == ""
    assert [e.name for e in (runtime / "run").iterdir()] == ["lock"] and not any((runtime / "tmp").iterdir())


def test_the_matrix_names_both_platforms_each_value_where_it_is_written():
    header = "# Generated by `build smoke-init` for this machine's registry; not committed.\n"
    text = header + "version: 1\ntargets:\n  smoke:\n    bases: {build: b, runtime: r}\n"
    bases = {
        "linux/amd64": {"devel": "reg/d:t@sha256:1", "runtime": "reg/r:t@sha256:2"},
        "linux/arm64": {"devel": "reg/d:t@sha256:3", "runtime": "reg/r:t@sha256:4"},
        "index": {"devel": "sha256:5", "runtime": "sha256:6"},
    }
    out = smokearm64.with_platforms(text, bases)
    assert out.startswith(header)
    assert "&" not in out and "*" not in out  # no YAML anchor or alias
    platforms = yaml.safe_load(out)["targets"]["smoke"]["platforms"]
    assert platforms == {
        "linux/amd64": {"index": {"build": "sha256:5", "runtime": "sha256:6"}},
        "linux/arm64": {
            "bases": {"build": "reg/d:t@sha256:3", "runtime": "reg/r:t@sha256:4"},
            "index": {"build": "sha256:5", "runtime": "sha256:6"},
        },
    }


def test_the_second_platforms_bases_are_made_while_the_amd64_ones_are(monkeypatch):
    # The amd64 maker finishes only once the second platform's maker has started: made one after
    # the other, this would wait out the timeout and fail.
    import threading

    started = threading.Event()

    def amd64_bases(registry, engine):
        assert started.wait(10), "the second platform's bases were not started beside the amd64 ones"
        return {"runtime": "r@sha256:1", "devel": "d@sha256:2"}

    def second(registry, engine, amd64):
        started.set()
        assert amd64() == {"runtime": "r@sha256:1", "devel": "d@sha256:2"}  # waits for them
        return {"runtime": "index-r"}, str.upper

    monkeypatch.setattr(smoke, "_bases", amd64_bases)
    assert smoke._all_bases("reg", object(), second) == ({"runtime": "index-r"}, str.upper)
    assert smoke._all_bases("reg", object(), None) == ({"runtime": "r@sha256:1", "devel": "d@sha256:2"}, None)


def test_one_mmdebstrap_run_per_architecture_copies_the_runtime_root_before_the_devel_packages(tmp_path):
    """Both platforms' roots come from the same command, only --architectures differing."""
    runtime, devel, debs = tmp_path / "rt", tmp_path / "dv", tmp_path / "debs"
    cmds = {a: smokeroots._command(a, runtime, devel, ["python3", "gcc"], ["git"], debs) for a in ("amd64", "arm64")}
    assert [c for c in cmds["amd64"] if "--architectures" not in c] == [
        c for c in cmds["arm64"] if "--architectures" not in c
    ]
    cmd = cmds["arm64"]
    assert "--architectures=arm64" in cmd and "--include=python3,gcc" in cmd and "--variant=minbase" in cmd
    hooks = [c for c in cmd if c.startswith("--customize-hook=")]
    assert "cp -ax" in hooks[0] and str(runtime) in hooks[0]  # the runtime root, before ...
    assert hooks[1].endswith("install git")  # ... the devel packages go on top
    assert cmd[-3:] == [smoke.SUITE, str(devel), smoke.MIRROR]


def test_a_runtime_package_missing_from_the_devel_base_is_refused(tmp_path):
    bases = {"runtime": ("r", ["python3", "curl"]), "devel": ("d", ["python3", "git"])}
    with pytest.raises(BuildError, match="the devel base must hold every runtime package"):
        smokeroots.roots(tmp_path, "arm64", bases)


def test_an_edit_to_the_mmdebstrap_command_changes_the_bases_recipe(monkeypatch):
    before = smoke._recipe()
    assert before == smoke._recipe()  # stable: no path, time or host in it
    made = smokeroots._command
    monkeypatch.setattr(smokeroots, "_command", lambda *a: [*made(*a), "--aptopt=Acquire::Retries=3"])
    assert smoke._recipe() != before
