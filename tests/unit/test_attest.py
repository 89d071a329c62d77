"""SBOM and provenance built from fixed inputs: valid, deterministic, complete; licenses as the
packages declare them, one hash per installed wheel."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from builder.config import matrix
from builder.deps.lock import LockEntry
from builder.records import attest, inventory, slsa
from builder.records.store import Record
from tests.conftest import REPO

STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u9

Package: removed-thing
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: python3
Status: install ok installed
Architecture: amd64
Source: python3-defaults (3.11.2-1)
Version: 3.11.2-1+b1

Package: bash
Status: install ok installed
Architecture: amd64
Source: bash (5.2.15-2)
Version: 5.2.15-2+b13
"""

DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: glibc
# a comment line

Files: *
Copyright: 1991-2023 Free Software Foundation, Inc.
License: LGPL-2.1+
 This library is free software ...
 .
 License: not a field, part of the text

Files: debian/*
Copyright: 2000 someone
License: GPL-2+ or Artistic, and BSD-3-clause

Files: posix/*
Copyright: 2001 someone else
License: GPL-3+ with Bison exception

License: Expat
 Standalone text of a license the Files paragraphs name.
"""

WHEELS = {  # the context's wheelhouse: two platform wheels of torch (only one was installed), numpy
    "torch-2.13.0+cu129-cp312-cp312-manylinux_2_28_x86_64.whl": "a" * 64,
    "torch-2.13.0+cu129-cp312-cp312-manylinux_2_28_aarch64.whl": "b" * 64,
    "numpy-2.3.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "c" * 64,
}


def record_of(t, bases=None, **fields) -> Record:
    """A passed build's record of target view ``t`` (its bases: ``bases``, default the target's own)
    with made-up digests; ``fields`` override or add to it."""
    digest = "sha256:" + "d" * 64
    bases = bases or t.bases
    base = dict(
        target=t.name,
        image=f"{t.image.name}@{digest}",
        digest=digest,
        bases={
            r: {"name": getattr(bases, r).display_name, "digest": getattr(bases, r).digest}
            for r in ("build", "runtime")
        },
        source={"url": t.source.url, "branch": t.source.branch, "commit": t.source.commit},
        lock_sha256="1" * 64,
        build_lock_sha256="2" * 64,
        dockerfile_sha256="3" * 64,
        source_date_epoch=1790029969,
        input_key="k" * 64,
        tool_version="0.1.0",
        checks="passed",
        build={},
    )
    return Record(**{**base, **fields})


@pytest.fixture()
def inputs():
    t = matrix.load(REPO / "matrix.yaml").target("cu129")
    build = {"id": "b1", "finished": "2026-11-29T00:00:00Z", "engine": "26.1.5", "buildx": "0.13.1", "driver": "docker"}
    record = record_of(t, build=build)
    debs = inventory.parse_dpkg_status(STATUS, {"libc6": inventory.dep5_licenses(DEP5), "bash": ("GPL-3+",)})
    inv = inventory.Inventory(
        "ubuntu",
        "22.04",
        debs,
        (
            inventory.PythonDist(
                "numpy",
                "2.3.1",
                "",
                "BSD-3-Clause",
                (),
                ("cp312-cp312-manylinux2014_x86_64", "cp312-cp312-manylinux_2_17_x86_64"),
            ),
            inventory.PythonDist(
                "torch", "2.13.0+cu129", "", "BSD-3-Clause", (), ("cp312-cp312-manylinux_2_28_x86_64",)
            ),
            inventory.PythonDist("vllm", "0.30.0", "Apache-2.0", "", (), ("cp38-abi3-linux_x86_64",)),
        ),
    )
    lock = [LockEntry("torch", "2.13.0+cu129", ("a" * 64, "b" * 64)), LockEntry("numpy", "2.3.1", ("c" * 64, "d" * 64))]
    return t, record, inv, lock


def test_dpkg_status_keeps_only_installed_packages():
    debs = inventory.parse_dpkg_status(STATUS)
    assert [d.name for d in debs] == ["bash", "libc6", "python3"]
    # the source package when it is not the binary package's own name, or when dpkg names its
    # version (a binNMU: bash 5.2.15-2+b13 from source bash 5.2.15-2), with that version
    assert [(d.source, d.source_version) for d in debs] == [
        ("bash", "5.2.15-2"),
        ("glibc", ""),
        ("python3-defaults", "3.11.2-1"),
    ]
    assert inventory.parse_os_release('ID=debian\nVERSION_ID="12"\n') == ("debian", "12")


PROSE = """This is the Debian prepackaged version of the GNU C Library.
License: This package is free software; you can redistribute it and/or modify it
License: LGPL-2.1+ or GPL-2 with some exception
The GNU General Public License can be found in `/usr/share/common-licenses/GPL-2'.
and the Lesser one in /usr/share/common-licenses/LGPL-2.1.
Not a license: /usr/share/common-licenses/README
"""


def test_dep5_licenses_reads_machine_readable_files_with_python_debian():
    assert inventory.dep5_licenses(DEP5) == (
        "GPL-2+ or Artistic, and BSD-3-clause",
        "GPL-3+ with Bison exception",
        "LGPL-2.1+",
    )
    assert inventory.dep5_licenses(DEP5.replace("\n", "\r\n")) == inventory.dep5_licenses(DEP5)
    assert inventory.dep5_licenses("") == ()


def test_prose_copyright_falls_back_to_license_lines_and_common_licenses_never_words():
    # "This" (prose after "License:"), "GPL-2 with some exception" (not a short name) and README
    # (a file, not a license) are dropped; the short names and the referenced texts are kept.
    assert inventory.dep5_licenses(PROSE) == ("GPL-2", "LGPL-2.1", "LGPL-2.1+")
    assert inventory.dep5_licenses("Copyright 1999 someone. All rights reserved.\n") == ()
    # a Format: header python-debian cannot parse as DEP-5 falls back the same way
    broken = "Format: https://example.org/not-dep5\n\n" + PROSE
    assert inventory.dep5_licenses(broken) == inventory.dep5_licenses(PROSE)
    old = (
        "Format-Specification: http://svn.debian.org/wsvn/dep/web/deps/dep5.mdwn?op=file&rev=135\n\n"
        "Files: *\nCopyright: x\nLicense: BSD-3-clause\n"
    )
    assert inventory.dep5_licenses(old) == ("BSD-3-clause",)


@pytest.mark.parametrize(
    "short, spdx_id",
    [
        ("GPL-2", "GPL-2.0-only"),
        ("GPL-2+", "GPL-2.0-or-later"),
        ("GPL-2.0+", "GPL-2.0-or-later"),
        ("LGPL-2.1+", "LGPL-2.1-or-later"),
        ("lgpl-3", "LGPL-3.0-only"),
        ("AGPL-3+", "AGPL-3.0-or-later"),
        ("GFDL-1.3+", "GFDL-1.3-or-later"),
        ("BSD-3-clause", "BSD-3-Clause"),
        ("zlib", "Zlib"),
        ("MIT", "MIT"),
        ("Apache-2", "Apache-2.0"),
        ("Apache-2.0", "Apache-2.0"),
        ("BSL-1", "BSL-1.0"),
        ("Expat", None),
        ("GPL", None),
        ("BSD", None),
        ("public-domain", None),
        ("GFDL-NIV-1.3+", None),
        ("GPL-3+ with Bison exception", None),
        ("GPL-9", None),
    ],
)
def test_dep5_short_names_map_to_spdx_only_when_exact(short, spdx_id):
    assert attest.dep5_spdx_id(short) == spdx_id


def _licenses(found) -> list:
    return [x.value if isinstance(x, attest.LicenseExpression) else (x.id or f"name:{x.name}") for x in found]


def test_deb_licenses_split_synopses():
    got = _licenses(attest.deb_licenses(inventory.dep5_licenses(DEP5)))
    assert got == [
        "BSD-3-Clause",
        "GPL-2.0-or-later",
        "LGPL-2.1-or-later",
        "name:Artistic",
        "name:GPL-3+ with Bison exception",
    ]
    assert attest.deb_licenses(()) == []


@pytest.mark.parametrize(
    "dist, want",
    [
        (
            ("Apache-2.0 OR BSD-2-Clause", "BSD", ("License :: OSI Approved :: MIT License",)),
            ["Apache-2.0 OR BSD-2-Clause"],
        ),  # License-Expression first: the others are not read
        (("mit", "", ()), ["MIT"]),  # a single id is an id, in SPDX's case
        (("apache-2.0 or LicenseRef-x", "", ()), ["Apache-2.0 OR LicenseRef-x"]),
        (
            ("", "LicenseRef-NVIDIA-Proprietary", ("License :: Other/Proprietary License",)),
            ["LicenseRef-NVIDIA-Proprietary"],
        ),  # as nvidia-* wheels declare it
        (("", "GPL-2.0+", ()), ["GPL-2.0-or-later"]),
        (
            ("", "Apache 2.0", ("License :: OSI Approved :: Apache Software License",)),
            ["name:Apache Software License"],
        ),  # not SPDX: the classifier, which does not say which version
        (
            (
                "",
                "BSD",
                (
                    "License :: OSI Approved :: MIT License",
                    "License :: OSI Approved :: BSD License",
                    "License :: OSI Approved",
                ),
            ),
            ["MIT", "name:BSD License"],
        ),
        (
            ("", "", ("License :: OSI Approved :: GNU General Public License v2 or later (GPLv2+)",)),
            ["GPL-2.0-or-later"],
        ),
        (("", "", ()), []),
    ],
)
def test_python_licenses_in_order_of_precedence(dist, want):
    assert _licenses(attest.python_licenses(inventory.PythonDist("x", "1", *dist))) == want


def test_the_installed_wheel_is_the_one_with_the_image_s_tags():
    torch = inventory.PythonDist("torch", "2.13.0+cu129", wheel_tags=("cp312-cp312-manylinux_2_28_x86_64",))
    assert attest.installed_wheel(torch, WHEELS) == (
        "torch-2.13.0+cu129-cp312-cp312-manylinux_2_28_x86_64.whl",
        "a" * 64,
    )
    # compressed tag sets expand; names and versions compare normalized
    numpy = inventory.PythonDist(
        "NumPy", "2.3.1.0", wheel_tags=("cp312-cp312-manylinux_2_17_x86_64", "cp312-cp312-manylinux2014_x86_64")
    )
    assert attest.installed_wheel(numpy, WHEELS)[1] == "c" * 64
    # one candidate is the installed file even if a packager's WHEEL tags differ from its file name
    assert attest.installed_wheel(inventory.PythonDist("numpy", "2.3.1", wheel_tags=("x",)), WHEELS)[1] == "c" * 64
    assert attest.installed_wheel(inventory.PythonDist("vllm", "0.30.0"), WHEELS) is None
    with pytest.raises(ValueError, match="tags the image records"):
        attest.installed_wheel(inventory.PythonDist("torch", "2.13.0+cu129"), WHEELS)


def test_wheel_files_hashes_the_wheelhouse(tmp_path):
    (tmp_path / "layers" / "torch").mkdir(parents=True)
    (tmp_path / "layers" / "deps").mkdir()
    (tmp_path / "layers" / "torch" / "a-1-py3-none-any.whl").write_bytes(b"wheel")
    (tmp_path / "layers" / "deps" / "b-1-py3-none-any.whl").write_bytes(b"other")
    (tmp_path / ".complete").write_text("x")
    assert attest.wheel_files(tmp_path / "layers") == {
        "a-1-py3-none-any.whl": hashlib.sha256(b"wheel").hexdigest(),
        "b-1-py3-none-any.whl": hashlib.sha256(b"other").hexdigest(),
    }
    (tmp_path / "b-1-py3-none-any.whl").write_bytes(b"not the same")
    with pytest.raises(ValueError, match="two different files"):
        attest.wheel_files(tmp_path)


def test_the_probe_is_standalone_python():
    """The probe runs in the image with only the image's python (here: the host's) and prints the
    copyright files (parsed on the host), cut at COPYRIGHT_MAX."""
    out = subprocess.run([sys.executable, "-c", inventory._PROBE], capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    assert set(doc) == {"os_release", "dpkg_status", "dists", "copyright"}
    assert all(isinstance(v, str) and len(v) <= inventory.COPYRIGHT_MAX for v in doc["copyright"].values())
    dists = inventory.parse_dists(doc["dists"])
    assert dists  # pytest itself, at least
    assert all(len(d.license) <= 100 and "\n" not in d.license for d in dists)


def test_sbom_is_valid_and_the_same_bytes_every_time(inputs):
    first = attest.sbom(*inputs)
    assert first == attest.sbom(*inputs)
    attest.validate_sbom(first)  # strict CycloneDX 1.6 schema (what `verify` runs)
    attest.validate_sbom(attest.sbom(*inputs[:4], WHEELS))
    with pytest.raises(ValueError, match="CycloneDX 1.6"):
        attest.validate_sbom(first.replace('"specVersion": "1.6"', '"specVersion": 1.6'))
    doc = json.loads(first)
    assert doc["specVersion"] == "1.6"
    assert doc["metadata"]["timestamp"] == "2026-09-21T22:32:49+00:00"
    assert doc["metadata"]["component"]["purl"] == (
        "pkg:oci/vllm-openai@sha256:" + "d" * 64 + "?repository_url=ghcr.io/k3-cu129/vllm-openai&tag=kimi-k3-cu129"
    )
    by_ref = {c["bom-ref"]: c for c in doc["components"]}
    torch = by_ref["pkg:pypi/torch@2.13.0%2Bcu129"]
    # without the wheelhouse (the caller has not passed it): the lock's hashes, as before
    assert sorted(h["content"] for h in torch["hashes"]) == ["a" * 64, "b" * 64]
    libc = by_ref["pkg:deb/ubuntu/libc6@2.36-9%2Bdeb12u9?arch=amd64&distro=ubuntu-22.04&upstream=glibc"]
    assert libc["licenses"][0] == {"license": {"id": "BSD-3-Clause", "acknowledgement": "declared"}}
    assert (
        "pkg:deb/ubuntu/python3@3.11.2-1%2Bb1?arch=amd64&distro=ubuntu-22.04&upstream=python3-defaults%403.11.2-1"
    ) in by_ref
    assert "pkg:deb/ubuntu/bash@5.2.15-2%2Bb13?arch=amd64&distro=ubuntu-22.04&upstream=bash%405.2.15-2" in by_ref
    assert by_ref["pkg:pypi/vllm@0.30.0"]["licenses"] == [
        {"license": {"id": "Apache-2.0", "acknowledgement": "declared"}}
    ]
    assert by_ref["source"]["version"] == inputs[0].source.commit
    assert by_ref["base:runtime"]["version"] == inputs[0].bases.runtime.digest
    other = json.loads(
        attest.sbom(
            inputs[0],
            inputs[1].__class__(
                **{**inputs[1].__dict__, "digest": "sha256:" + "e" * 64, "image": "x@sha256:" + "e" * 64}
            ),
            *inputs[2:],
        )
    )
    assert other["serialNumber"] != doc["serialNumber"]  # derived from the digest


def test_sbom_carries_one_hash_per_wheel_the_installed_one(inputs):
    t, record, inv, lock = inputs
    text = attest.sbom(t, record, inv, lock, WHEELS)
    assert text == attest.sbom(t, record, inv, lock, dict(reversed(WHEELS.items())))
    by_ref = {c["bom-ref"]: c for c in json.loads(text)["components"]}
    torch, numpy, vllm = (by_ref[f"pkg:pypi/{p}"] for p in ("torch@2.13.0%2Bcu129", "numpy@2.3.1", "vllm@0.30.0"))
    assert torch["hashes"] == [{"alg": "SHA-256", "content": "a" * 64}]
    assert {"name": "k3:wheel", "value": "torch-2.13.0+cu129-cp312-cp312-manylinux_2_28_x86_64.whl"} in torch[
        "properties"
    ]
    assert numpy["hashes"] == [{"alg": "SHA-256", "content": "c" * 64}]
    assert "hashes" not in vllm  # built from the source, not from a locked wheel
    packages = [c for c in by_ref.values() if c["purl"].startswith(("pkg:deb/", "pkg:pypi/"))]
    assert sum("licenses" in c for c in packages) == 5  # all but python3 (no copyright file given)


def test_sbom_refuses_a_wheelhouse_that_does_not_match(inputs):
    t, record, inv, lock = inputs
    missing = {k: v for k, v in WHEELS.items() if not k.startswith("numpy")}
    with pytest.raises(ValueError, match="numpy 2.3.1 is in the lock but no wheel"):
        attest.sbom(t, record, inv, lock, missing)
    foreign = {**WHEELS, "numpy-2.3.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": "e" * 64}
    with pytest.raises(ValueError, match="is not one of the lock's hashes"):
        attest.sbom(t, record, inv, lock, foreign)


def test_provenance_names_every_input(inputs):
    t, record, _, _ = inputs
    doc = json.loads(slsa.provenance(t, record, {"MAX_JOBS": "2"}, "2026-11-29T00:00:00Z"))
    assert doc["predicateType"] == "https://slsa.dev/provenance/v1"
    deps = {d["name"]: d["digest"] for d in doc["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["source"] == {"gitCommit": t.source.commit}
    assert deps["lock"] == {"sha256": "1" * 64} and deps["dockerfile"] == {"sha256": "3" * 64}
    assert deps["base:build"] == {"sha256": t.bases.build.digest.removeprefix("sha256:")}
    assert doc["predicate"]["buildDefinition"]["externalParameters"]["matrix"]["torch"]["version"] == "2.13.0+cu129"
    assert doc["predicate"]["runDetails"]["builder"]["version"]["driver"] == "docker"
