"""The arm64 smoke bases: what the dpkg database of a made root says is installed, and the rule
that an arm64 base holds what its amd64 sibling holds (one index tag, one content)."""

from __future__ import annotations

import pytest

from builder.errors import BuildError
from builder.pipeline import smoke, smokearm64

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
    assert smokearm64._installed(tmp_path) == {"libc6": "2.36-9+deb12u14", "bash": "5.2.15-2+b13"}


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
    """The arm64 devel root is made from the runtime root: every runtime package must be in it."""
    runtime, devel = smoke.BASES["runtime"][1], smoke.BASES["devel"][1]
    assert set(runtime) <= set(devel)
    assert [p for p in devel if p not in runtime] == ["python3-venv", "git", "patch"]
