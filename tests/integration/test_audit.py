"""Audit trail on the real registry: SBOM and provenance beside the digest, `verify` failing on
the right row for each kind of tampering. The bit-identical rebuild a minute apart is
test_escrow.py's, from the escrow alone and offline (the suite's one no-cache rebuild of the built
smoke)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess

import pytest

from builder.engine.buildx import DockerEngine
from builder.engine.registry import OCI_INDEX, Registry
from builder.pipeline import imagediff
from builder.records import provsign
from tests.conftest import REPO
from tests.integration.conftest import REGISTRY, cli, restore_registry


@pytest.fixture(autouse=True)
def _as_recorded(built) -> None:
    """Each test audits the registry as the smoke's record says: tests in other files build into
    the same repository, and one that reproduces the digest attaches its own SBOM/provenance."""
    restore_registry(built[0])


def _rows(stderr: str) -> dict[str, bool]:
    return {
        m.group(2).strip(): m.group(1) == "ok" for m in re.finditer(r"^(ok|FAIL)\s+\S+\s+(.+?)\s{2,}", stderr, re.M)
    }


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
    envelope = json.loads((smoke.root / "locks/smoke/provenance.intoto.json").read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and len(envelope["signatures"]) == 1
    prov = provsign.statement_of(smoke.root / "locks/smoke/provenance.intoto.json")
    assert prov["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    # One purl function: the SBOM's purl of each base is the provenance's uri for it.
    deps = {d["name"]: d for d in prov["predicate"]["buildDefinition"]["resolvedDependencies"]}
    by_ref = {c["bom-ref"]: c for c in sbom["components"]}
    for role in ("build", "runtime"):
        assert deps[f"base:{role}"]["uri"] == by_ref[f"base:{role}"]["purl"]
        assert "&tag=" in deps[f"base:{role}"]["uri"] and ":" not in deps[f"base:{role}"]["uri"].split("/")[-1]
    wheel = _installed_hash(smoke.root)
    assert any(
        d["digest"] == {"sha256": wheel} and d["uri"].startswith("pkg:pypi/nvidia-cuda-runtime-cu12@12.9.79")
        for d in deps.values()
    )
    assert deps["template:Dockerfile.j2"]["uri"].startswith("git+https://github.com/")
    tool = prov["predicate"]["runDetails"]["builder"]["builderDependencies"][0]
    assert re.fullmatch(r"[0-9a-f]{40}", tool["digest"]["gitCommit"])
    # in-toto's own bindings (the test extra) parse it: Statement v1, SLSA Provenance v1, strictly.
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    Statement.copy_from_pb(json_format.ParseDict(prov, statement_pb2.Statement())).validate()
    json_format.ParseDict(prov["predicate"], provenance_pb2.Provenance())
    # An auditor with only the registry finds both through the referrers tag schema.
    index = DockerEngine().registry.raw_manifest(f"{REGISTRY}/{smoke.repository}", digest.replace(":", "-"))
    assert index is not None and index.media_type == OCI_INDEX
    types = sorted(m["artifactType"] for m in index.doc["manifests"])
    assert types == ["application/vnd.cyclonedx+json", "application/vnd.dsse.envelope.v1+json"]


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
    "lock": (
        "locks/smoke/requirements.txt",
        lambda t, root: t.replace(_installed_hash(root), "0" * 64),
        {"lock hash-pinned", "lock <-> image.json", "lock <-> SBOM"},
    ),
    "sbom": (
        "locks/smoke/sbom.cdx.json",
        lambda t, root: t.replace('"version": "12.9.79"', '"version": "12.9.80"', 1),
        {"lock <-> SBOM", AUDIT},
    ),
    "record": (
        "locks/smoke/image.json",
        lambda t, root: re.sub(r'"digest": "sha256:[0-9a-f]{64}"', '"digest": "sha256:' + "e" * 64 + '"', t, count=1),
        {"matrix <-> image.json", "image.json <-> SBOM", "image.json <-> provenance", AUDIT},
    ),
    # Inside the signed payload: the signature no longer verifies either.
    "provenance": (
        "locks/smoke/provenance.intoto.json",
        lambda t, root: _edit_payload(
            t, lambda p: re.sub(r'"gitCommit": "[0-9a-f]{40}"', '"gitCommit": "' + "1" * 40 + '"', p)
        ),
        {"image.json <-> provenance", "provenance signature", AUDIT},
    ),
    # A hand-edited OS lock (another version of numactl) fails its body hash and its record.
    "os-lock": (
        "locks/smoke/os-packages.txt",
        lambda t, root: re.sub(r"^numactl \S+", "numactl 9.9-9", t, flags=re.M),
        {"OS lock hash-pinned", "OS lock <-> image.json", "OS lock <-> SBOM"},
    ),
    # The SBOM naming another .deb than the lock's (a swapped package) fails the OS lock's row.
    "swapped-deb": (
        "locks/smoke/sbom.cdx.json",
        lambda t, root: t.replace(_deb_hash(root, "numactl"), "f" * 64),
        {"OS lock <-> SBOM", AUDIT},
    ),
}


def _deb_hash(root, name: str) -> str:
    line = next(
        ln for ln in (root / "locks/smoke/os-packages.txt").read_text().splitlines() if ln.startswith(name + " ")
    )
    return line.rsplit("sha256:", 1)[1]


def _edit_payload(text: str, edit) -> str:
    doc = json.loads(text)
    doc["payload"] = base64.b64encode(edit(base64.b64decode(doc["payload"]).decode()).encode()).decode()
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _resign(text: str, key_dir) -> str:
    """The same payload signed with another (freshly made) key."""
    key, pub = provsign.generate_test_key(key_dir)
    statement = base64.b64decode(json.loads(text)["payload"]).decode()
    signing = type("S", (), {"key": str(key), "public_key": str(pub)})
    return provsign.envelope(statement, provsign.signer(signing, key_dir))


# The three signature faults, each with image.json's provenance_sha256 rewritten to match (an
# attacker who edits both): exactly the fault's own row fails.
SIGNATURE_FAULTS = {
    "edited payload": (
        lambda t, d: _edit_payload(t, lambda p: p.replace('"startedOn": "', '"startedOn": "1', 1)),
        "provenance signature",
    ),
    "wrong key": (_resign, "provenance signer"),
    "missing signature": (lambda t, d: json.dumps({**json.loads(t), "signatures": []}), "provenance signed"),
}


@pytest.mark.parametrize("fault", sorted(SIGNATURE_FAULTS))
def test_each_signature_fault_fails_its_own_row(built, tmp_path, fault):
    smoke, _ = built
    work = smoke.copy(tmp_path / fault.replace(" ", "-"))
    edit, row = SIGNATURE_FAULTS[fault]
    path = work.root / "locks/smoke/provenance.intoto.json"
    before = path.read_text()
    path.write_text(edit(before, tmp_path / "other-key"))
    assert path.read_text() != before
    record = json.loads(work.record.read_text())
    record["build"]["provenance_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    work.record.write_text(json.dumps(record, indent=2) + "\n")
    r = cli("--matrix", str(work.matrix), "verify", "--target", "smoke")
    assert r.code == 1, r.err
    failed = {k for k, ok in _rows(r.err).items() if not ok}
    assert failed == {row}, r.err


def test_an_unsigned_smoke_verifies_with_a_warning(built, tmp_path):
    """A matrix without signing.key/public_key: the envelope is explicitly unsigned, verify holds and says so."""
    smoke, _ = built
    work = smoke.copy(tmp_path / "unsigned")
    text = work.matrix.read_text()
    work.matrix.write_text(re.sub(r"\n    signing:\n(      .*\n)+", "\n", text))
    assert "signing" not in work.matrix.read_text()
    path = work.root / "locks/smoke/provenance.intoto.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "signatures": []}))
    record = json.loads(work.record.read_text())
    record["build"]["provenance_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    work.record.write_text(json.dumps(record, indent=2) + "\n")
    r = cli("--matrix", str(work.matrix), "verify", "--target", "smoke")
    rows = _rows(r.err)
    # externalParameters name the matrix entry without signing (who signs is not what is built):
    # dropping the key changes no input, so every row holds; the unsigned envelope is a warning.
    assert {k for k, ok in rows.items() if not ok} == set(), r.err
    assert r.code == 0, r.err
    assert re.search(r"^ok\s+smoke\s+provenance signed\s+UNSIGNED \(warning\)", r.err, re.M), r.err


def test_the_auditor_page_hand_check_runs_verbatim(built, tmp_path):
    """The hand check of docs/auditor.md, exactly as printed there, against the smoke's records and registry."""
    smoke, _ = built
    page = (REPO / "docs" / "auditor.md").read_text()
    block = page.split("<!-- hand-check:begin -->", 1)[1].split("<!-- hand-check:end -->", 1)[0]
    script = block.split("```bash\n", 1)[1].rsplit("```", 1)[0]
    env = {"PATH": os.environ["PATH"], "T": "smoke", "SCHEME": "http", "HOME": os.environ.get("HOME", "/")}
    proc = subprocess.run(["bash", "-c", script], cwd=smoke.root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "hand check: every link holds"
    # ...and it does fail: an edited SBOM stops it at its sha256.
    work = smoke.copy(tmp_path / "hand-check-tampered")
    sbom = work.root / "locks/smoke/sbom.cdx.json"
    sbom.write_text(sbom.read_text().replace('"version": "12.9.79"', '"version": "12.9.80"', 1))
    bad = subprocess.run(["bash", "-c", script], cwd=work.root, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "hand check: every link holds" not in bad.stdout


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
        subprocess.run(
            ["docker", "buildx", "imagetools", "create", "-t", f"{name}:smoke", base],
            capture_output=True,
            text=True,
            check=True,
        )
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
        subprocess.run(
            ["docker", "buildx", "build", "--push", "-t", f"{name}:diff-{variant}", "--metadata-file", str(meta), "-"],
            input=dockerfile,
            text=True,
            capture_output=True,
            check=True,
        )
        digests.append(json.loads(meta.read_text())["containerimage.digest"])
    lines = imagediff.diff_images(DockerEngine(), name, digests[0], digests[1])
    text = "\n".join(lines)
    assert "config history" in text or "config rootfs.diff_ids" in text
    assert re.search(r"layer 1 diff-me: .*sha256 '[0-9a-f]{16}' != '[0-9a-f]{16}'", text), text
