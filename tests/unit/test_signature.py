"""builder.records.signature: the `registry: signature` row's answer, with a fake cosign and a fake registry."""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess

import pytest

from builder.records import signature as sig
from builder.records.signature import Referrer, SignatureStatus, registry_probes, signature_status

DIGEST = "sha256:" + "ab" * 32
IMAGE = "ghcr.io/acme/vllm-openai"
IDENTITY = "https://github.com/acme/k3/.github/workflows/k3-branch.yml@refs/heads/main"


class FakeRun:
    """Records the argv; answers like cosign would."""

    def __init__(self, returncode=0, stderr="", stdout="[]", exc=None):
        self.returncode, self.stderr, self.stdout, self.exc = returncode, stderr, stdout, exc
        self.calls: list[list[str]] = []

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        assert kwargs.get("check") is False and kwargs.get("capture_output") and kwargs.get("timeout")
        if self.exc:
            raise self.exc
        return subprocess.CompletedProcess(cmd, self.returncode, self.stdout, self.stderr)


def _bundle_dsse(predicate_type: str) -> bytes:
    statement = {"_type": "https://in-toto.io/Statement/v1", "predicateType": predicate_type, "subject": []}
    payload = base64.b64encode(json.dumps(statement).encode()).decode()
    return json.dumps({"mediaType": sig.BUNDLE_TYPE, "dsseEnvelope": {"payload": payload, "signatures": []}}).encode()


SIGN_BUNDLE = Referrer(
    sig.BUNDLE_TYPE, {sig.ANNOTATION_CONTENT: "dsse-envelope", sig.ANNOTATION_PREDICATE: sig.COSIGN_SIGN_PREDICATE}
)
PROVENANCE_BUNDLE = Referrer(
    sig.BUNDLE_TYPE,
    {sig.ANNOTATION_CONTENT: "dsse-envelope", sig.ANNOTATION_PREDICATE: "https://slsa.dev/provenance/v1"},
)
TOOL_SBOM = Referrer("application/vnd.cyclonedx+json", {}, b"{}")
TOOL_PROVENANCE = Referrer("application/vnd.dsse.envelope.v1+json", {}, b"{}")  # the tool's signed provenance


# -- verification with cosign ----------------------------------------------------------------------


def test_verified_runs_exactly_the_documented_cosign_command():
    run = FakeRun(0)
    st = signature_status(
        IMAGE + ":kimi-k3-cu129", DIGEST, IDENTITY, sig.GITHUB_ISSUER, cosign="/usr/bin/cosign", run=run
    )
    assert st == SignatureStatus("verified", st.detail) and st.state == "verified"
    assert run.calls == [
        [
            "/usr/bin/cosign",
            "verify",
            "--certificate-identity",
            IDENTITY,
            "--certificate-oidc-issuer",
            "https://token.actions.githubusercontent.com",
            f"{IMAGE}@{DIGEST}",
        ]
    ]
    assert IDENTITY in st.detail and "\n" not in st.detail


def test_another_identity_is_failed_not_missing():
    run = FakeRun(
        12, stderr="Error: no matching signatures: none of the expected identities matched\nmain.go:74: error"
    )
    st = signature_status(
        IMAGE,
        DIGEST,
        IDENTITY,
        None,
        cosign="cosign",
        run=run,
        tag_exists=lambda tag: False,
        referrers=lambda: [SIGN_BUNDLE],
    )
    assert st.state == "failed"
    assert "1 signature referrer" in st.detail and IDENTITY in st.detail


def test_cosign_finds_nothing_and_the_registry_agrees_is_missing():
    run = FakeRun(10, stderr="Error: no signatures found")
    st = signature_status(
        IMAGE,
        DIGEST,
        IDENTITY,
        None,
        cosign="cosign",
        run=run,
        tag_exists=lambda tag: False,
        referrers=lambda: [TOOL_SBOM, PROVENANCE_BUNDLE],
    )
    assert st.state == "missing" and "no signatures found" in st.detail


def test_cosign_finds_nothing_without_probes_trusts_cosigns_message():
    st = signature_status(
        IMAGE, DIGEST, IDENTITY, None, cosign="cosign", run=FakeRun(1, stderr="Error: no signatures found")
    )
    assert st.state == "missing"


def test_cosign_finds_nothing_but_a_sig_tag_exists_is_failed():
    st = signature_status(
        IMAGE,
        DIGEST,
        IDENTITY,
        None,
        cosign="cosign",
        run=FakeRun(10, stderr="no signatures found"),
        tag_exists=lambda tag: tag == sig.signature_tag(DIGEST),
    )
    assert st.state == "failed" and "present: .sig tag" in st.detail


def test_cosign_error_of_another_kind_is_failed():
    st = signature_status(
        IMAGE,
        DIGEST,
        IDENTITY,
        None,
        cosign="cosign",
        run=FakeRun(1, stderr="Error: GET https://ghcr.io/v2/: UNAUTHORIZED"),
    )
    assert st.state == "failed" and "UNAUTHORIZED" in st.detail


@pytest.mark.parametrize("exc", [subprocess.TimeoutExpired(["cosign"], 1), FileNotFoundError("cosign")])
def test_cosign_that_hangs_or_vanishes_is_failed(exc):
    st = signature_status(IMAGE, DIGEST, IDENTITY, None, cosign="cosign", run=FakeRun(exc=exc), timeout=1)
    assert st.state == "failed"


# -- presence without cosign -----------------------------------------------------------------------


def test_legacy_sig_tag_without_cosign_is_present_unverified():
    asked = []
    st = signature_status(
        IMAGE,
        DIGEST,
        IDENTITY,
        None,
        find_cosign=False,
        tag_exists=lambda tag: asked.append(tag) or True,
        referrers=lambda: {},
    )
    assert asked == ["sha256-" + "ab" * 32 + ".sig"]
    assert st.state == "present-unverified" and "cosign is not on PATH" in st.detail


def test_cosign3_bundle_referrer_without_cosign_is_present_unverified():
    st = signature_status(
        IMAGE,
        DIGEST,
        IDENTITY,
        None,
        find_cosign=False,
        tag_exists=lambda tag: False,
        referrers=lambda: [TOOL_SBOM, TOOL_PROVENANCE, SIGN_BUNDLE],
    )
    assert st.state == "present-unverified" and "1 signature referrer" in st.detail


def test_cosign_on_path_but_no_identity_only_looks():
    run = FakeRun(0)
    st = signature_status(IMAGE, DIGEST, None, None, cosign="cosign", run=run, tag_exists=lambda tag: True)
    assert run.calls == [] and st.state == "present-unverified" and sig.IDENTITY_ENV in st.detail


def test_only_attestations_are_missing():
    """GitHub's provenance attestation and the tool's own SBOM/provenance are not signatures."""
    st = signature_status(
        IMAGE,
        DIGEST,
        IDENTITY,
        None,
        find_cosign=False,
        tag_exists=lambda tag: False,
        referrers=lambda: {
            "application/vnd.cyclonedx+json": b"{}",
            sig.BUNDLE_TYPE: _bundle_dsse("https://slsa.dev/provenance/v1"),
        },
    )
    assert st.state == "missing"


def test_no_cosign_and_no_probe_cannot_tell():
    assert signature_status(IMAGE, DIGEST, IDENTITY, None, find_cosign=False).state == "failed"


def test_a_probe_that_raises_is_failed_with_its_reason():
    def boom(tag):
        raise OSError("registry: HTTP 503")

    st = signature_status(IMAGE, DIGEST, IDENTITY, None, find_cosign=False, tag_exists=boom)
    assert st.state == "failed" and "503" in st.detail


@pytest.mark.parametrize("digest", ["", "sha256:abc", "sha512:" + "a" * 128, "sha256:" + "A" * 64])
def test_malformed_digest_is_failed_and_never_reaches_cosign(digest):
    run = FakeRun(0)
    assert signature_status(IMAGE, digest, IDENTITY, None, cosign="cosign", run=run).state == "failed"
    assert run.calls == []


# -- classification --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref, kind",
    [
        (Referrer(sig.SIMPLESIGNING_TYPE), "signature"),
        (SIGN_BUNDLE, "signature"),
        (PROVENANCE_BUNDLE, "attestation"),
        (Referrer(sig.BUNDLE_TYPE, {sig.ANNOTATION_CONTENT: "message-signature"}), "signature"),
        (Referrer(sig.BUNDLE_TYPE, {}, json.dumps({"messageSignature": {}}).encode()), "signature"),
        (Referrer(sig.BUNDLE_TYPE, {}, _bundle_dsse(sig.COSIGN_SIGN_PREDICATE)), "signature"),
        (Referrer(sig.BUNDLE_TYPE, {}, _bundle_dsse("https://slsa.dev/provenance/v1")), "attestation"),
        (
            Referrer(
                "application/vnd.dev.sigstore.bundle+json;version=0.2", {}, _bundle_dsse(sig.COSIGN_SIGN_PREDICATE)
            ),
            "signature",
        ),
        (Referrer(sig.BUNDLE_TYPE, {}, b"not json"), "other"),
        (Referrer(sig.BUNDLE_TYPE), "other"),
        (TOOL_PROVENANCE, "other"),
        (TOOL_SBOM, "other"),
    ],
)
def test_classify(ref, kind):
    assert sig.classify(ref) == kind


# -- the row's verdict and the identity lookup ---------------------------------------------------


@pytest.mark.parametrize(
    "state, required, ok",
    [
        ("verified", True, True),
        ("present-unverified", True, True),
        ("missing", True, False),
        ("missing", False, True),
        ("failed", False, False),
        ("failed", True, False),
    ],
)
def test_ok(state, required, ok):
    assert SignatureStatus(state, "x").ok(required=required) is ok


def test_status_is_frozen_and_checked():
    st = SignatureStatus("missing", "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.state = "verified"  # type: ignore[misc]
    with pytest.raises(ValueError):
        SignatureStatus("signed", "x")  # type: ignore[arg-type]


def test_resolve_identity_environment_wins_over_the_matrix():
    assert sig.resolve_identity("from-matrix", None, {}) == ("from-matrix", sig.GITHUB_ISSUER)
    assert sig.resolve_identity("from-matrix", "https://issuer.example", {sig.IDENTITY_ENV: "from-env"}) == (
        "from-env",
        "https://issuer.example",
    )
    assert sig.resolve_identity(None, None, {sig.ISSUER_ENV: "https://other"}) == (None, "https://other")
    assert sig.resolve_identity("  ", None, {sig.IDENTITY_ENV: ""}) == (None, sig.GITHUB_ISSUER)


# -- wiring to a registry client -------------------------------------------------------------------


@dataclasses.dataclass
class FakeManifest:
    raw: bytes

    @property
    def doc(self) -> dict:
        return json.loads(self.raw)


class FakeRegistry:
    def __init__(self, manifests: dict[str, dict], blobs: dict[str, bytes] | None = None):
        self.manifests = {k: FakeManifest(json.dumps(v).encode()) for k, v in manifests.items()}
        self.blobs = blobs or {}
        self.asked: list[str] = []

    def raw_manifest(self, name, reference):  # RegistryClient's shape: by image name
        assert name == IMAGE
        self.asked.append(reference)
        return self.manifests.get(reference)

    def blob(self, name, digest):
        assert name == IMAGE
        return self.blobs[digest]

    def probes(self, **kw):
        return registry_probes(lambda ref: self.raw_manifest(IMAGE, ref), lambda d: self.blob(IMAGE, d), DIGEST, **kw)


def _index(*entries):
    return {"schemaVersion": 2, "mediaType": sig.OCI_INDEX, "manifests": list(entries)}


def test_registry_probes_read_the_tag_schema_without_collapsing_bundles():
    """The tool's SBOM + provenance, GitHub's provenance bundle and cosign 3's signature bundle all
    sit in one referrers index; two share an artifactType and both are seen."""
    tag = DIGEST.replace(":", "-")
    reg = FakeRegistry(
        {
            tag: _index(
                {"digest": "sha256:" + "01" * 32, "artifactType": "application/vnd.cyclonedx+json"},
                {
                    "digest": "sha256:" + "02" * 32,
                    "artifactType": sig.BUNDLE_TYPE,
                    "annotations": dict(PROVENANCE_BUNDLE.annotations),
                },
                {"digest": "sha256:" + "03" * 32, "artifactType": sig.BUNDLE_TYPE},  # annotations only on the manifest
            ),
            "sha256:" + "03" * 32: {"annotations": dict(SIGN_BUNDLE.annotations), "layers": []},
        }
    )
    tag_exists, referrers = reg.probes()
    found = referrers()
    assert [sig.classify(r) for r in found] == ["other", "attestation", "signature"]
    assert tag_exists(sig.signature_tag(DIGEST)) is False
    st = signature_status(IMAGE, DIGEST, IDENTITY, None, find_cosign=False, tag_exists=tag_exists, referrers=referrers)
    assert st.state == "present-unverified"


def test_registry_probes_fetch_the_bundle_only_when_nothing_else_tells():
    layer = "sha256:" + "04" * 32
    reg = FakeRegistry(
        {"sha256:" + "05" * 32: {"layers": [{"digest": layer}]}}, {layer: _bundle_dsse(sig.COSIGN_SIGN_PREDICATE)}
    )
    _, referrers = reg.probes(
        referrers_index=lambda: _index({"digest": "sha256:" + "05" * 32, "artifactType": sig.BUNDLE_TYPE})
    )
    assert [sig.classify(r) for r in referrers()] == ["signature"]
    assert DIGEST.replace(":", "-") not in reg.asked  # the referrers API answered; no tag-schema read


def test_registry_probes_with_nothing_there():
    tag_exists, referrers = FakeRegistry({}).probes()
    assert referrers() == [] and tag_exists("sha256-x.sig") is False
    st = signature_status(IMAGE, DIGEST, IDENTITY, None, find_cosign=False, tag_exists=tag_exists, referrers=referrers)
    assert st.state == "missing" and st.ok(required=False) and not st.ok(required=True)
