"""Audit trail on the real registry: SBOM and provenance beside the digest, `verify` failing on
the right row for each kind of tampering, and bit-identical rebuilds a minute apart."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import time

import pytest

from builder import imagediff
from builder.engine import DockerEngine
from builder.registry import OCI_INDEX, Registry
from tests.integration.conftest import REGISTRY, cli


def _rows(stderr: str) -> dict[str, bool]:
    return {m.group(2).strip(): m.group(1) == "ok" for m in
            re.finditer(r"^(ok|FAIL)\s+\S+\s+(.+?)\s{2,}", stderr, re.M)}


def test_sbom_and_provenance_are_recorded_and_attached(built):
    smoke, ref = built
    digest = ref.split("@")[1]
    sbom = json.loads((smoke.root / "locks/smoke/sbom.cdx.json").read_text())
    assert sbom["specVersion"] == "1.6" and sbom["metadata"]["component"]["version"] == digest
    assert sbom["metadata"]["component"]["purl"].startswith("pkg:oci/")
    purls = [c["purl"] for c in sbom["components"]]
    assert any(p.startswith("pkg:deb/debian/python3") for p in purls)
    assert any(p.startswith("pkg:pypi/nvidia-cuda-runtime-cu12@12.9.79") for p in purls)
    assert sbom["metadata"]["timestamp"].startswith("2026-11-01T00:00:00")  # SOURCE_DATE_EPOCH
    prov = json.loads((smoke.root / "locks/smoke/provenance.intoto.json").read_text())
    assert prov["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    # An auditor with only the registry finds both through the referrers tag schema.
    index = DockerEngine().registry.raw_manifest(f"{REGISTRY}/{smoke.repository}", digest.replace(":", "-"))
    assert index is not None and index.media_type == OCI_INDEX
    types = sorted(m["artifactType"] for m in index.doc["manifests"])
    assert types == ["application/vnd.cyclonedx+json", "application/vnd.in-toto+json"]


def test_verify_passes_offline_and_against_the_registry(built):
    smoke, _ = built
    for args in ((), ("--registry",)):
        r = cli("--matrix", str(smoke.matrix), "verify", "--target", "smoke", *args)
        assert r.code == 0, r.err
        rows = _rows(r.err)
        assert rows and all(rows.values())
        assert ("registry: image" in rows) == bool(args)


def _installed_hash(root) -> str:
    """The sha256 the SBOM records for the CUDA runtime wheel: the one file the image installed."""
    sbom = json.loads((root / "locks/smoke/sbom.cdx.json").read_text())
    comp = next(c for c in sbom["components"] if c["name"] == "nvidia-cuda-runtime-cu12")
    return comp["hashes"][0]["content"]


# The SBOM and provenance are named by hash in image.json, so editing either (or the record) also
# fails "image.json <-> audit files"; a lock is not an audit file.
AUDIT = "image.json <-> audit files"
TAMPER = {
    # The installed wheel's hash, deliberately: a lock lists several wheels per package.
    "lock": ("locks/smoke/requirements.txt", lambda t, root: t.replace(_installed_hash(root), "0" * 64),
             {"lock hash-pinned", "lock <-> image.json", "lock <-> SBOM"}),
    "sbom": ("locks/smoke/sbom.cdx.json",
             lambda t, root: t.replace('"version": "12.9.79"', '"version": "12.9.80"', 1),
             {"lock <-> SBOM", AUDIT}),
    "record": ("locks/smoke/image.json", lambda t, root: re.sub(r'"digest": "sha256:[0-9a-f]{64}"',
                                                               '"digest": "sha256:' + "e" * 64 + '"', t, count=1),
               {"matrix <-> image.json", "image.json <-> SBOM", "image.json <-> provenance", AUDIT}),
    "provenance": ("locks/smoke/provenance.intoto.json",
                   lambda t, root: re.sub(r'"gitCommit": "[0-9a-f]{40}"', '"gitCommit": "' + "1" * 40 + '"', t),
                   {"image.json <-> provenance", AUDIT}),
    # A hand-edited OS lock (another version of numactl) fails its body hash and its record.
    "os-lock": ("locks/smoke/os-packages.txt", lambda t, root: re.sub(r"^numactl \S+", "numactl 9.9-9", t, flags=re.M),
                {"OS lock hash-pinned", "OS lock <-> image.json", "OS lock <-> SBOM"}),
    # The SBOM naming another .deb than the lock's (a swapped package) fails the OS lock's row.
    "swapped-deb": ("locks/smoke/sbom.cdx.json", lambda t, root: t.replace(_deb_hash(root, "numactl"), "f" * 64),
                    {"OS lock <-> SBOM", AUDIT}),
}


def _deb_hash(root, name: str) -> str:
    line = next(ln for ln in (root / "locks/smoke/os-packages.txt").read_text().splitlines() if ln.startswith(name + " "))
    return line.rsplit("sha256:", 1)[1]


@pytest.mark.parametrize("what", sorted(TAMPER))
def test_verify_fails_on_the_right_row(built, tmp_path, what):
    smoke, _ = built
    work = smoke.copy(tmp_path / what)
    rel, edit, expected = TAMPER[what]
    path = work.root / rel
    before = path.read_text()
    path.write_text(edit(before, work.root))
    assert path.read_text() != before
    r = cli("--matrix", str(work.matrix), "verify", "--target", "smoke")
    assert r.code == 1, r.err
    failed = {k for k, ok in _rows(r.err).items() if not ok}
    assert failed == expected, r.err


def test_verify_registry_catches_a_retagged_image(built, tmp_path):
    smoke, ref = built
    work = smoke.copy(tmp_path / "retag")
    name = f"{REGISTRY}/{smoke.repository}"
    base = re.search(r"runtime: (\S+)", work.matrix.read_text()).group(1)
    try:
        # Someone pushes another image over the recorded tag.
        subprocess.run(["docker", "buildx", "imagetools", "create", "-t", f"{name}:smoke", base],
                       capture_output=True, text=True, check=True)
        r = cli("--matrix", str(work.matrix), "verify", "--target", "smoke", "--registry")
        assert r.code == 1
        failed = {k for k, ok in _rows(r.err).items() if not ok}
        assert failed == {"registry: image"}, r.err
        assert "now points at" in r.err
    finally:
        # Put the tag back on the exact manifest (imagetools create could wrap it in an index).
        registry = Registry(REGISTRY)
        recorded = registry.manifest(smoke.repository, ref.split("@")[1])
        registry.push_manifest(smoke.repository, "smoke", recorded.raw, recorded.media_type)


def test_imagediff_reports_files_that_differ(built, tmp_path):
    smoke, _ = built
    base = re.search(r"runtime: (\S+)", smoke.matrix.read_text()).group(1)
    name = f"{REGISTRY}/{smoke.repository}"
    digests = []
    for variant in ("a", "b"):
        meta = tmp_path / f"{variant}.json"
        dockerfile = f"FROM {base}\nRUN echo {variant} > /diff-me && mkdir -p /same\n"
        subprocess.run(["docker", "buildx", "build", "--push", "-t", f"{name}:diff-{variant}", "--metadata-file",
                        str(meta), "-"], input=dockerfile, text=True, capture_output=True, check=True)
        digests.append(json.loads(meta.read_text())["containerimage.digest"])
    lines = imagediff.diff_images(DockerEngine(), name, digests[0], digests[1])
    text = "\n".join(lines)
    assert "config history" in text or "config rootfs.diff_ids" in text
    assert re.search(r"layer 1 diff-me: .*sha256 '[0-9a-f]{16}' != '[0-9a-f]{16}'", text), text


def test_reproduce_bit_for_bit_a_minute_later(built):
    smoke, ref = built
    record = json.loads(smoke.record.read_text())
    finished = dt.datetime.fromisoformat(record["build"]["finished"].replace("Z", "+00:00"))
    wait = 61 - (dt.datetime.now(dt.timezone.utc) - finished).total_seconds()
    if wait > 0:
        time.sleep(wait)  # the claim is about builds at least a minute apart (mtimes, created)
    r = cli("--matrix", str(smoke.matrix), "reproduce", "--target", "smoke")
    assert r.code == 0, r.err[-3000:]
    assert r.out.strip().splitlines()[-1] == ref
    assert "reproduced: " + record["digest"] in r.err
