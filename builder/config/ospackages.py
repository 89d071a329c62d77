"""The OS packages of a target's final image (matrix key ``os_packages``): Debian/Ubuntu .debs
locked by sha256 like wheels (builder/deps/oslock.py), from an archive that does not drift.
"""

from __future__ import annotations

import re

from pydantic import Field, StrictBool

from builder.config.patterns import ArchiveUrl, Arg, Component, DebName, DebVersion, Frozen, LoadName, Reason, Suite

# Where the versions come from. A snapshot archive at a fixed time serves the same files forever;
# a plain archive drops old versions, so a target using one must say it accepts drift.
SNAPSHOT_ARCHIVES = (
    re.compile(r"https://snapshot\.ubuntu\.com/ubuntu/[0-9]{8}T[0-9]{6}Z"),
    # Ubuntu serves arm64 (and every machine but amd64 and i386) from ubuntu-ports.
    re.compile(r"https://snapshot\.ubuntu\.com/ubuntu-ports/[0-9]{8}T[0-9]{6}Z"),
    re.compile(r"https://snapshot\.debian\.org/archive/debian/[0-9]{8}T[0-9]{6}Z"),
)


class OsPackage(Frozen):
    """One package the final image needs from the distribution, and why."""

    name: DebName
    why: Reason
    # Pin a version (the smoke pins what its plain archive served at `smoke-init`); None: the
    # archive's candidate at lock time (a snapshot's candidate never changes).
    version: DebVersion | None = None
    # Packages are unpacked, never configured (no maintainer script runs). A package that carries
    # a preinst/postinst fails the build unless this says why skipping its scripts is safe.
    scripts_skipped: Reason | None = None


class OsPackages(Frozen):
    """OS packages of the final image: resolved against the runtime base's own dpkg database into
    locks/<target>/os-packages.txt, downloaded and hash-checked on the host, unpacked with no
    network into their own layer."""

    archive: ArchiveUrl
    # The release first, then its updates (a base is built from them: resolving against the
    # release alone could ask for older versions than the base has), e.g. [jammy, jammy-updates].
    suites: tuple[Suite, ...] = Field(min_length=1)
    components: tuple[Component, ...] = ("main",)
    packages: tuple[OsPackage, ...] = Field(min_length=1)
    accept_drift: StrictBool = False  # a plain (non-snapshot) archive: versions move as the archive does
    # Run-time proofs the check `os_packages` makes: sonames (or absolute path globs) that must load
    # with ctypes, in order, and commands that must run (e.g. numactl --show).
    loads: tuple[LoadName, ...] = ()
    runs: tuple[tuple[Arg, ...], ...] = ()

    @property
    def snapshot(self) -> bool:
        return any(p.fullmatch(self.archive) for p in SNAPSHOT_ARCHIVES)
