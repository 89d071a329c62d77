"""Is the recorded image signed, and by whom? The `registry: signature` row of `build verify --registry`.

Four answers, each with a one-line detail:

``verified``            ``cosign verify`` accepted a keyless signature on ``IMAGE@DIGEST`` made by the
                        expected certificate identity (the signing workflow) and OIDC issuer.
``present-unverified``  a signature is there but was not checked: no ``cosign`` on PATH, or no
                        identity to check it against.
``missing``             no signature: neither cosign's legacy tag ``sha256-<hex>.sig`` nor a referrer
                        that is a signature.
``failed``              cosign rejected the signature (another identity, another issuer, a bad
                        certificate), or the question could not be answered (registry error,
                        cosign timed out, malformed digest).

Where cosign keeps signatures, so presence can be seen without cosign:

* cosign 2.x (and 3.x with ``--new-bundle-format=false``): an image tagged ``sha256-<hex>.sig`` in
  the image's repository;
* cosign 2.x with ``--registry-referrers-mode=oci-1-1``: a referrer whose ``artifactType`` is
  ``application/vnd.dev.cosign.simplesigning.v1+json``;
* cosign 3.x (the default since 3.0, what ``sigstore/cosign-installer`` v4 installs): a referrer
  with ``artifactType`` ``application/vnd.dev.sigstore.bundle.v0.3+json`` whose annotation
  ``dev.sigstore.bundle.predicateType`` is ``https://sigstore.dev/cosign/sign/v1``.

GitHub's artifact attestations (``actions/attest``) are sigstore bundles too, with the SLSA
provenance predicate type: they are *not* signatures and are not counted as one. The
classification reads the referrer's annotations first and the bundle's own content only when the
annotations say nothing.

The registry is reached only through two injected callables, so this module has no network code
and is tested with fakes: ``tag_exists(tag) -> bool`` and ``referrers() -> Iterable[Referrer]`` (or
a mapping ``artifactType -> content``, the shape ``Registry.referrers`` returns).
``registry_probes`` builds both from two reads of the image's repository (a manifest by reference,
a blob by digest), e.g. ``RegistryClient.raw_manifest`` and ``RegistryClient.blob``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from builder.config import cascade

State = Literal["verified", "present-unverified", "missing", "failed"]
STATES: tuple[State, ...] = ("verified", "present-unverified", "missing", "failed")

GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
IDENTITY_ENV = "K3_SIGNING_IDENTITY"
ISSUER_ENV = "K3_SIGNING_ISSUER"

SIMPLESIGNING_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
BUNDLE_TYPE_PREFIX = "application/vnd.dev.sigstore.bundle"  # v0.3+json, and +json;version=0.x
COSIGN_SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
ANNOTATION_CONTENT = "dev.sigstore.bundle.content"
ANNOTATION_PREDICATE = "dev.sigstore.bundle.predicateType"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
COSIGN_TIMEOUT_S = 180
_DETAIL_MAX = 300
_NO_SIGNATURE = re.compile(
    r"\bno signatures found\b", re.I
)  # ErrNoSignaturesFound; "no matching signatures" is a rejection
COSIGN_EXIT_NO_SIGNATURE = 10  # cosign's ImageWithoutSignature (12: NoMatchingSignature, 13: no certificate)


@dataclass(frozen=True)
class Referrer:
    """One artifact that names the image as its ``subject``."""

    artifact_type: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    content: bytes | None = None  # the artifact's (first) layer, when the caller has it


@dataclass(frozen=True)
class SignatureStatus:
    state: State
    detail: str

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"state must be one of {STATES}, not {self.state!r}")

    def ok(self, *, required: bool) -> bool:
        """Whether the row holds. ``required``: a signing identity is configured, so a missing
        signature fails; without one, an unsigned image (a local or smoke registry) passes."""
        if self.state in ("verified", "present-unverified"):
            return True
        return self.state == "missing" and not required


TagExists = Callable[[str], bool]
Referrers = Callable[[], "Iterable[Referrer] | Mapping[str, bytes]"]
Run = Callable[..., Any]


def signature_tag(digest: str) -> str:
    """cosign's legacy signature tag for ``digest``: ``sha256-<hex>.sig``."""
    return digest.replace(":", "-", 1) + ".sig"


def resolve_identity(
    identity: str | None = None, issuer: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str | None, str]:
    """The identity and issuer to verify against. Lookup order as for the matrix: the environment
    (``K3_SIGNING_IDENTITY``, ``K3_SIGNING_ISSUER``: repository variables in CI) wins over the
    values given (the matrix's ``signing:`` block); the issuer defaults to GitHub Actions'."""
    ident = (cascade.environment_or_target(IDENTITY_ENV, identity, environ).value or "").strip() or None
    iss = (cascade.environment_or_target(ISSUER_ENV, issuer, environ).value or "").strip() or GITHUB_ISSUER
    return ident, iss


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _DETAIL_MAX else line[: _DETAIL_MAX - 3] + "..."


def _predicate_of_bundle(content: bytes | None) -> tuple[str | None, str | None]:
    """(kind, predicateType) of a serialized sigstore bundle: kind is "message-signature" or
    "dsse-envelope"; predicateType is read from the DSSE payload (an in-toto statement)."""
    if not content:
        return None, None
    try:
        doc = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    if "messageSignature" in doc:
        return "message-signature", None
    env = doc.get("dsseEnvelope")
    if isinstance(env, dict):
        try:
            statement = json.loads(base64.b64decode(env.get("payload", ""), validate=True))
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return "dsse-envelope", None
        pred = statement.get("predicateType") if isinstance(statement, dict) else None
        return "dsse-envelope", pred if isinstance(pred, str) else None
    return None, None


def classify(ref: Referrer) -> Literal["signature", "attestation", "other"]:
    """What a referrer is: a cosign signature, an attestation (provenance, SBOM, ...), or other."""
    kind = ref.artifact_type or ""
    if kind == SIMPLESIGNING_TYPE:
        return "signature"
    if not kind.startswith(BUNDLE_TYPE_PREFIX):
        return "other"
    content_kind = ref.annotations.get(ANNOTATION_CONTENT)
    predicate = ref.annotations.get(ANNOTATION_PREDICATE)
    if content_kind is None and predicate is None:
        content_kind, predicate = _predicate_of_bundle(ref.content)
    if predicate == COSIGN_SIGN_PREDICATE or content_kind == "message-signature":
        return "signature"
    if predicate or content_kind == "dsse-envelope":
        return "attestation"
    return "other"


def _as_referrers(found: Iterable[Referrer] | Mapping[str, bytes]) -> list[Referrer]:
    if isinstance(found, Mapping):
        return [Referrer(str(kind), {}, content) for kind, content in found.items()]
    return [r if isinstance(r, Referrer) else Referrer(*r) for r in found]


def find_signatures(
    digest: str, *, tag_exists: TagExists | None = None, referrers: Referrers | None = None
) -> list[str]:
    """Where signatures of ``digest`` are, as short phrases (empty: none). Raises what the probes
    raise."""
    where: list[str] = []
    if tag_exists is not None and tag_exists(signature_tag(digest)):
        where.append(".sig tag")
    if referrers is not None:
        n = sum(1 for r in _as_referrers(referrers()) if classify(r) == "signature")
        if n:
            where.append(f"{n} signature referrer{'s' if n != 1 else ''}")
    return where


def _repository(image: str) -> str:
    """``registry/repo`` from ``registry/repo[:tag][@digest]`` (a port in the host is kept)."""
    name = image.split("@", 1)[0]
    head, slash, last = name.rpartition("/")
    return f"{head}{slash}{last.split(':', 1)[0]}" if slash else name


def signature_status(
    image: str,
    digest: str,
    identity: str | None,
    issuer: str | None = GITHUB_ISSUER,
    *,
    cosign: str | None = None,
    tag_exists: TagExists | None = None,
    referrers: Referrers | None = None,
    run: Run = subprocess.run,
    timeout: float = COSIGN_TIMEOUT_S,
    find_cosign: bool = True,
) -> SignatureStatus:
    """The signature state of ``image@digest`` (``image`` is the repository name, no tag).

    ``cosign``: the cosign executable; looked up on PATH when None and ``find_cosign`` (pass
    ``find_cosign=False`` to force the presence-only answer). ``tag_exists`` / ``referrers``:
    registry probes for presence (see the module docstring); they decide "missing" versus "failed"
    when cosign rejects, and are the only source when cosign is absent. Never raises for registry
    or cosign trouble: that is the ``failed`` state with its reason.
    """
    if not DIGEST.fullmatch(digest or ""):
        return SignatureStatus("failed", _one_line(f"digest {digest!r} is not sha256:<64 hex>"))
    issuer = issuer or GITHUB_ISSUER
    exe = cosign if cosign is not None else (shutil.which("cosign") if find_cosign else None)

    def presence() -> list[str] | None:
        """Signatures found by the probes; None when there is no probe to ask."""
        if tag_exists is None and referrers is None:
            return None
        return find_signatures(digest, tag_exists=tag_exists, referrers=referrers)

    if exe and identity:
        return _cosign_status(exe, image, digest, identity, issuer, presence=presence, run=run, timeout=timeout)
    why = (
        "cosign is not on PATH"
        if not exe
        else f"no signing identity configured ({IDENTITY_ENV} or matrix signing.identity)"
    )
    return _presence_status(digest, why, presence)


def _cosign_status(
    exe: str,
    image: str,
    digest: str,
    identity: str,
    issuer: str,
    *,
    presence: Callable[[], list[str] | None],
    run: Run,
    timeout: float,
) -> SignatureStatus:
    """What ``cosign verify`` says of ``image@digest``; when it rejects, the probes tell a missing
    signature from one that failed to verify."""
    ref = f"{_repository(image)}@{digest}"
    cmd = [exe, "verify", "--certificate-identity", identity, "--certificate-oidc-issuer", issuer, ref]
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return SignatureStatus("failed", f"cosign verify timed out after {timeout:.0f} s")
    except OSError as exc:
        return SignatureStatus("failed", _one_line(f"cannot run {exe}: {exc}"))
    if proc.returncode == 0:
        return SignatureStatus("verified", _one_line(f"cosign verified {digest[:19]}: signed by {identity} ({issuer})"))
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    reason = lines[-1].strip() if lines else f"exit {proc.returncode}"
    cosign_says_none = proc.returncode == COSIGN_EXIT_NO_SIGNATURE or _NO_SIGNATURE.search(" ".join(lines)) is not None
    try:
        where = presence()
    except Exception as exc:  # noqa: BLE001 - any probe failure is reported, not raised
        where, reason = None, f"{reason}; registry probe failed: {exc}"
    if cosign_says_none and not where:
        return SignatureStatus("missing", _one_line(f"no signature on {digest[:19]} (cosign: {reason})"))
    seen = f"; present: {', '.join(where)}" if where else ""
    return SignatureStatus(
        "failed", _one_line(f"cosign did not verify a signature by {identity} ({issuer}): {reason}{seen}")
    )


def _presence_status(digest: str, why: str, presence: Callable[[], list[str] | None]) -> SignatureStatus:
    """Without cosign (or an identity to check): whether the probes find a signature at all."""
    try:
        where = presence()
    except Exception as exc:  # noqa: BLE001
        return SignatureStatus("failed", _one_line(f"cannot look for a signature: {exc}"))
    if where is None:
        return SignatureStatus("failed", _one_line(f"cannot tell: {why} and no registry probe given"))
    if not where:
        return SignatureStatus(
            "missing", _one_line(f"no signature on {digest[:19]}: no .sig tag, no signature referrer ({why})")
        )
    return SignatureStatus(
        "present-unverified", _one_line(f"signature present ({', '.join(where)}), not verified: {why}")
    )


# -- wiring to an OCI registry client -------------------------------------------------------------


class ManifestLike(Protocol):
    """``builder.engine.registry.Manifest``: the parsed manifest or index."""

    @property
    def doc(self) -> dict[str, Any]: ...


def registry_probes(
    manifest: Callable[[str], ManifestLike | None],
    blob: Callable[[str], bytes],
    digest: str,
    referrers_index: Callable[[], dict[str, Any] | None] | None = None,
) -> tuple[TagExists, Referrers]:
    """``tag_exists`` and ``referrers`` for ``signature_status``, from two reads of the image's
    repository: ``manifest(reference)`` (None on 404) and ``blob(digest)``. With the tool's client:
    ``manifest=lambda ref: client.raw_manifest(name, ref)``, ``blob=lambda d: client.blob(name, d)``.

    ``referrers_index``: the OCI 1.1 referrers API answer (``GET /v2/<repo>/referrers/<digest>``,
    an image index; None when the registry has no such API). Without it, or when it answers None,
    the referrers tag schema is read: the index tagged ``sha256-<hex>``, which both this tool
    (``Registry.attach``) and cosign (on registries without the API) maintain. Entries are not
    collapsed by artifact type: a provenance bundle and a signature bundle share one type. A
    bundle's manifest is read only when the index entry carries no sigstore annotation, and its
    blob only when the manifest carries none either.
    """

    def tag_exists(tag: str) -> bool:
        return manifest(tag) is not None

    def referrers() -> list[Referrer]:
        index = referrers_index() if referrers_index is not None else None
        if index is None:
            found = manifest(digest.replace(":", "-", 1))
            index = found.doc if found is not None else {}
        out: list[Referrer] = []
        keys = {ANNOTATION_CONTENT, ANNOTATION_PREDICATE}
        for entry in index.get("manifests", []) or []:
            kind = entry.get("artifactType") or ""
            notes = dict(entry.get("annotations") or {})
            content = None
            if kind.startswith(BUNDLE_TYPE_PREFIX) and not keys & notes.keys():
                art = manifest(entry["digest"])
                doc = art.doc if art is not None else {}
                notes.update(doc.get("annotations") or {})
                layers = doc.get("layers") or []
                if layers and not keys & notes.keys():
                    content = blob(layers[0]["digest"])
            out.append(Referrer(kind, notes, content))
        return out

    return tag_exists, referrers
