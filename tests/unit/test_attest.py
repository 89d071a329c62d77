"""SBOM and provenance built from fixed inputs: valid, deterministic, complete."""

from __future__ import annotations

import json

import pytest

from builder import attest, inventory, matrix
from builder.lock import LockEntry
from builder.records import Record
from tests.conftest import REPO

STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u9

Package: removed-thing
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: python3
Status: install ok installed
Architecture: amd64
Version: 3.11.2-1+b1
"""


@pytest.fixture()
def inputs():
    t = matrix.load(REPO / "matrix.yaml").target("cu129")
    digest = "sha256:" + "d" * 64
    record = Record(
        target="cu129", image=f"{t.image.name}@{digest}", digest=digest,
        bases={r: {"name": getattr(t.bases, r).display_name, "digest": getattr(t.bases, r).digest}
               for r in ("build", "runtime")},
        source={"url": t.source.url, "branch": t.source.branch, "commit": t.source.commit},
        lock_sha256="1" * 64, build_lock_sha256="2" * 64, dockerfile_sha256="3" * 64,
        source_date_epoch=1790029969, input_key="k" * 64, tool_version="0.1.0", checks="passed",
        build={"id": "b1", "finished": "2026-11-29T00:00:00Z", "engine": "26.1.5", "buildx": "0.13.1",
               "driver": "docker"},
    )
    inv = inventory.Inventory("ubuntu", "22.04", inventory.parse_dpkg_status(STATUS),
                           (("torch", "2.13.0+cu129"), ("vllm", "0.30.0")))
    lock = [LockEntry("torch", "2.13.0+cu129", ("a" * 64, "b" * 64))]
    return t, record, inv, lock


def test_dpkg_status_keeps_only_installed_packages():
    assert [d.name for d in inventory.parse_dpkg_status(STATUS)] == ["libc6", "python3"]
    assert inventory.parse_os_release('ID=debian\nVERSION_ID="12"\n') == ("debian", "12")


def test_sbom_is_valid_and_the_same_bytes_every_time(inputs):
    first = attest.sbom(*inputs)
    assert first == attest.sbom(*inputs)
    doc = json.loads(first)
    assert doc["specVersion"] == "1.6"
    assert doc["metadata"]["timestamp"] == "2026-09-21T22:32:49+00:00"
    assert doc["metadata"]["component"]["purl"] == (
        "pkg:oci/vllm-openai@sha256:" + "d" * 64 + "?repository_url=ghcr.io/k3-cu129/vllm-openai")
    by_ref = {c["bom-ref"]: c for c in doc["components"]}
    torch = by_ref["pkg:pypi/torch@2.13.0%2Bcu129"]
    assert sorted(h["content"] for h in torch["hashes"]) == ["a" * 64, "b" * 64]
    assert "pkg:deb/ubuntu/libc6@2.36-9%2Bdeb12u9?arch=amd64&distro=ubuntu-22.04" in by_ref
    assert by_ref["source"]["version"] == inputs[0].source.commit
    assert by_ref["base:runtime"]["version"] == inputs[0].bases.runtime.digest
    other = json.loads(attest.sbom(inputs[0], inputs[1].__class__(**{**inputs[1].__dict__,
                                                                      "digest": "sha256:" + "e" * 64,
                                                                      "image": "x@sha256:" + "e" * 64}),
                                   *inputs[2:]))
    assert other["serialNumber"] != doc["serialNumber"]  # derived from the digest


def test_provenance_names_every_input(inputs):
    t, record, _, _ = inputs
    doc = json.loads(attest.provenance(t, record, {"MAX_JOBS": "2"}, "2026-11-29T00:00:00Z"))
    assert doc["predicateType"] == "https://slsa.dev/provenance/v1"
    deps = {d["name"]: d["digest"] for d in doc["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["source"] == {"gitCommit": t.source.commit}
    assert deps["lock"] == {"sha256": "1" * 64} and deps["dockerfile"] == {"sha256": "3" * 64}
    assert deps["base:build"] == {"sha256": t.bases.build.digest.removeprefix("sha256:")}
    assert doc["predicate"]["buildDefinition"]["externalParameters"]["matrix"]["torch"]["version"] == "2.13.0+cu129"
    assert doc["predicate"]["runDetails"]["builder"]["version"]["driver"] == "docker"
