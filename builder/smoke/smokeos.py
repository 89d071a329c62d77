"""The smoke target's OS packages: what `smoke-init` pins from Debian's archive for the smoke's
``os_packages`` block (the same path cu129's OS layer takes)."""

from __future__ import annotations

from builder.engine.seam import Engine
from builder.errors import BuildError

SUITE = "bookworm"  # the smoke's bases and OS packages: Debian 12
MIRROR = "http://deb.debian.org/debian"

# The smoke's OS packages, from the plain Debian archive these machines reach (snapshot.debian.org
# is out of reach), each with why the image needs it. `smoke-init` pins the versions the archive
# serves when it runs, so the smoke's lock does not rot when Debian publishes an update.
OS_SUITES = (SUITE, f"{SUITE}-updates")
OS_PACKAGES = {
    "libnuma1": "NUMA policy library: what fastsafetensors binds NUMA nodes with in cu129; the check loads it",
    "numactl": "numactl --show, the operator's NUMA check; the image check runs it",
}


def os_package_pins(engine: Engine, runtime_ref: str) -> dict[str, str]:
    """name -> the version the archive serves now, resolved in a container of the runtime base
    the same way `build lock` resolves (builder/deps/oslock.py)."""
    from builder.config.matrix import OsPackage, OsPackages
    from builder.deps import oslock

    spec = OsPackages(
        archive=MIRROR,
        suites=OS_SUITES,
        accept_drift=True,
        packages=tuple(OsPackage(name=n, why=w) for n, w in OS_PACKAGES.items()),
    )
    found = oslock.closure(engine, runtime_ref, spec, "smoke-init")
    missing = [n for n in OS_PACKAGES if n not in found]
    if missing:
        raise BuildError(f"smoke-init: the runtime base already has {', '.join(missing)}; pick other packages")
    return {n: found[n] for n in OS_PACKAGES}


def os_packages_doc(pins: dict[str, str]) -> dict:
    return {
        "archive": MIRROR,
        "suites": list(OS_SUITES),
        "components": ["main"],
        "accept_drift": True,
        "packages": [{"name": n, "why": OS_PACKAGES[n], "version": v} for n, v in pins.items()],
        "loads": ["libnuma.so.1"],
        "runs": [["numactl", "--show"]],
    }
