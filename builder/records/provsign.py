"""The provenance's signature: a DSSE envelope (in-toto's own format) around the in-toto Statement.

The envelope is securesystemslib's (``securesystemslib.dsse.Envelope``): ``payloadType``
``application/vnd.in-toto+json``, ``payload`` the Statement's JSON bytes (base64), and
``signatures``, each ``{keyid, sig}`` over DSSE's pre-authentication encoding
(``DSSEv1 <len type> <type> <len payload> <payload>``). No crypto is written here: keys, signing
and verification are securesystemslib's (pyca/cryptography underneath, or a KMS).

Where the signature comes from (matrix ``signing``):

* ``key`` + ``public_key``: signed at build time with that key, a PEM private key file or a KMS
  URI securesystemslib supports (``gcpkms:``, ``awskms:``, ``azurekms:``, ``hv:``, ``hsm:``);
  `build verify` checks it offline against ``public_key`` (a PEM file committed beside the matrix).
* neither: explicitly unsigned, an envelope with no signatures; the build warns and `verify`'s
  ``provenance signed`` row says UNSIGNED. In CI the keyless signature is cosign's (the workflow's
  OIDC identity), made over the same Statement in the signing job (`cosign attest`).

The three questions `verify` asks (one row each, so each fault fails its own row):
``signed`` (is there any signature), ``signer`` (is each by the matrix's key, by key id),
``signature`` (does each signature by that key verify over this payload).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from builder import log
from builder.errors import ConfigError
from builder.fsutil import atomic_write

PAYLOAD_TYPE = "application/vnd.in-toto+json"  # in-toto's DSSE payload type for a Statement
TEST_KEY_NAME = "provenance-TEST-ONLY.key"  # what smoke-init generates: a throwaway test key
TEST_PUBLIC_KEY_NAME = "provenance-TEST-ONLY.pub"


def _resolve(root: Path, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else root / p


def public_key(root: Path, path: str):
    """The securesystemslib key of a PEM public key file (its key id is the sha256 of its canonical
    form, securesystemslib's default)."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    file = _resolve(root, path)
    try:
        return SSlibKey.from_crypto(load_pem_public_key(file.read_bytes()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: signing.public_key: not a readable PEM public key ({str(exc)[:80]})") from None


def signer(signing, root: Path):
    """The signer the matrix names, or None (explicitly unsigned). A file path becomes
    securesystemslib's ``file2:`` URI; a KMS URI is handed over as it is."""
    if not signing.key:
        return None
    from securesystemslib.signer import Signer

    pub = public_key(root, signing.public_key)
    if ":" not in signing.key:
        _warn_if_readable(_resolve(root, signing.key), signing.key)
    uri = signing.key if ":" in signing.key else f"file2:{_resolve(root, signing.key)}"
    try:
        return Signer.from_priv_key_uri(uri, pub)
    except Exception as exc:  # noqa: BLE001 - the library raises per backend (OSError, KeyMismatchError, ...)
        raise ConfigError(
            f"signing.key {signing.key}: cannot sign with it ({exc.__class__.__name__}: "
            f"{str(exc)[:100]}); it must be the private half of signing.public_key"
        ) from None


def _warn_if_readable(path: Path, named: str) -> None:
    """A private key others can read is a key others may have copied: signing goes on (the matrix
    asked for it), with a warning naming the file and the fix."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # the signer says what is wrong with a missing key
    if mode & 0o077:
        log.warn(
            f"signing.key {named}: {path} is readable by others (mode {mode & 0o777:04o}); "
            f"`chmod 600 {path}`, and treat the key as exposed"
        )


def envelope(statement_text: str, sign_with=None) -> str:
    """The DSSE envelope of the Statement as JSON text (signed when ``sign_with`` is a signer)."""
    from securesystemslib.dsse import Envelope

    env = Envelope(statement_text.encode(), PAYLOAD_TYPE, {})
    if sign_with is not None:
        env.sign(sign_with)
    return json.dumps(env.to_dict(), indent=2, sort_keys=True) + "\n"


def read(text: str):
    """(envelope, statement dict) of an envelope's text; ValueError when it is not one."""
    from securesystemslib.dsse import Envelope

    try:
        doc = json.loads(text)
        env = Envelope.from_dict(doc)
    except Exception as exc:  # noqa: BLE001 - from_dict raises KeyError, binascii.Error, FormatError
        raise ValueError(f"not a DSSE envelope ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if env.payload_type != PAYLOAD_TYPE:
        raise ValueError(f"payloadType {env.payload_type!r} is not {PAYLOAD_TYPE}")
    try:
        statement = json.loads(env.payload)
    except ValueError:
        raise ValueError("the envelope's payload is not JSON") from None
    if not isinstance(statement, dict):
        raise ValueError("the envelope's payload is not a JSON object")
    return env, statement


def statement_of(path: Path) -> dict:
    """The Statement inside a provenance file (ValueError/OSError when it is not an envelope)."""
    return read(path.read_text())[1]


@dataclass(frozen=True)
class Answer:
    ok: bool
    detail: str


def signed(env, expect_key) -> Answer:
    if env.signatures:
        return Answer(True, f"{len(env.signatures)} signature(s)")
    if expect_key is None:
        return Answer(
            True,
            "UNSIGNED (warning): the matrix names no signing.key/public_key, so nothing "
            "outside CI's keyless attestation vouches for this provenance",
        )
    return Answer(False, f"no signature, but the matrix names signing.public_key (key id {expect_key.keyid[:16]})")


def signer_is(env, expect_key) -> Answer:
    if not env.signatures:
        return Answer(True, "nothing to attribute: no signature (row 'provenance signed' decides)")
    if expect_key is None:
        return Answer(
            True,
            f"not checked (warning): signed by key id(s) {_ids(env)}, and the matrix names "
            "no signing.public_key to check them against",
        )
    others = [k for k in env.signatures if k != expect_key.keyid]
    if others:
        return Answer(
            False,
            f"signed by key id {', '.join(k[:16] for k in others)}, not the matrix's "
            f"signing.public_key (key id {expect_key.keyid[:16]})",
        )
    return Answer(True, f"by the matrix's signing.public_key (key id {expect_key.keyid[:16]})")


def signature_holds(env, expect_key) -> Answer:
    from securesystemslib.exceptions import UnverifiedSignatureError, VerificationError

    mine = env.signatures.get(expect_key.keyid) if expect_key is not None else None
    if mine is None:
        return Answer(True, "nothing to check: no signature by the matrix's key (rows above decide)")
    try:
        expect_key.verify_signature(mine, env.pae())
    except (UnverifiedSignatureError, VerificationError):
        return Answer(
            False,
            "the signature does not verify over this payload: the Statement (or the "
            "signature) changed after it was signed",
        )
    return Answer(True, f"verifies over the payload ({expect_key.scheme}, offline)")


def _ids(env) -> str:
    return ", ".join(k[:16] for k in sorted(env.signatures))


def generate_test_key(directory: Path) -> tuple[Path, Path]:
    """A fresh Ed25519 key pair for the smoke's provenance, named TEST-ONLY: made per machine by
    smoke-init, never committed."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

    made = Ed25519PrivateKey.generate()
    directory.mkdir(parents=True, exist_ok=True)
    key, pub = directory / TEST_KEY_NAME, directory / TEST_PUBLIC_KEY_NAME
    atomic_write(key, made.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode(), mode=0o600)
    atomic_write(pub, made.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode())
    return key, pub
