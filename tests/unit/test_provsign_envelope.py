"""The DSSE envelope read and attributed (builder/records/provsign.py): an envelope is read only
with in-toto's payloadType (a good payload under another type is refused, and so is a good type
over a payload that is not a JSON object); several signatures, one of them by the matrix's key, are attributed
one by one; the signature by the matrix's key is checked over DSSE's pre-authentication encoding,
which covers the payload type as well as the payload.
"""

from __future__ import annotations

import base64
import json

import pytest
from securesystemslib.dsse import Envelope

from builder.errors import ConfigError
from builder.records import provsign

STATEMENT = json.dumps({"_type": "https://in-toto.io/Statement/v1", "subject": [], "predicate": {"a": 1}}) + "\n"


class _Signing:
    def __init__(self, key=None, public_key=None):
        self.key, self.public_key = key, public_key


@pytest.fixture()
def keys(tmp_path):
    """(public key, signer) for the matrix's key and for two others."""
    out = []
    for name in ("mine", "other", "third"):
        key, pub = provsign.generate_test_key(tmp_path / name)
        out.append((provsign.public_key(tmp_path, str(pub)), provsign.signer(_Signing(str(key), str(pub)), tmp_path)))
    return out


def _doc(text: str) -> dict:
    return json.loads(text)


def _text(doc: dict) -> str:
    return json.dumps(doc)


# --- reading ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload_type", ["application/json", "application/vnd.in-toto+json ", "", "APPLICATION/VND.IN-TOTO+JSON"]
)
def test_a_good_payload_under_another_payload_type_is_refused(payload_type):
    doc = _doc(provsign.envelope(STATEMENT))
    doc["payloadType"] = payload_type
    with pytest.raises(ValueError) as err:
        provsign.read(_text(doc))
    assert str(err.value) == f"payloadType {payload_type!r} is not application/vnd.in-toto+json"


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"not json", "the envelope's payload is not JSON"),
        (b"[1, 2]", "the envelope's payload is not a JSON object"),
        (b'"a string"', "the envelope's payload is not a JSON object"),
        (b"\xff\xfe", "the envelope's payload is not JSON"),
    ],
)
def test_the_payload_must_be_a_json_object(payload, message):
    doc = _doc(provsign.envelope(STATEMENT))
    doc["payload"] = base64.b64encode(payload).decode()
    with pytest.raises(ValueError, match=f"^{message}$"):
        provsign.read(_text(doc))


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"payloadType": "application/vnd.in-toto+json", "signatures": []}',
        '{"payload": "@@@", "payloadType": "application/vnd.in-toto+json", "signatures": []}',
        '{"payload": "e30=", "payloadType": "application/vnd.in-toto+json", "signatures": [{"sig": "AA=="}]}',
    ],
)
def test_what_is_not_an_envelope_is_said_so(text):
    with pytest.raises(ValueError, match=r"^not a DSSE envelope \("):
        provsign.read(text)


def test_an_envelope_round_trips_sorted_and_newline_terminated(keys):
    (pub, signer), _, _ = keys
    text = provsign.envelope(STATEMENT, signer)
    assert text.endswith("}\n") and list(_doc(text)) == sorted(_doc(text))
    env, statement = provsign.read(text)
    assert statement == json.loads(STATEMENT) and env.payload == STATEMENT.encode()
    assert list(env.signatures) == [pub.keyid]
    assert provsign.read(provsign.envelope(STATEMENT))[0].signatures == {}


# --- several signatures --------------------------------------------------------------------------


def _signed_by(*signers) -> Envelope:
    env = Envelope(STATEMENT.encode(), provsign.PAYLOAD_TYPE, {})
    for s in signers:
        env.sign(s)
    return provsign.read(json.dumps(env.to_dict()))[0]


def test_several_signatures_one_by_the_matrix_s_key(keys):
    (mine, my_signer), (other, other_signer), (third, third_signer) = keys
    env = _signed_by(my_signer, other_signer, third_signer)
    assert provsign.signed(env, mine) == provsign.Answer(True, "3 signature(s)")
    answer = provsign.signer_is(env, mine)
    assert not answer.ok
    assert answer.detail == (
        f"signed by key id {other.keyid[:16]}, {third.keyid[:16]}, not the matrix's signing.public_key "
        f"(key id {mine.keyid[:16]})"
    ) or answer.detail == (
        f"signed by key id {third.keyid[:16]}, {other.keyid[:16]}, not the matrix's signing.public_key "
        f"(key id {mine.keyid[:16]})"
    )
    assert provsign.signature_holds(env, mine).ok  # the matrix's own signature is good


def test_several_signatures_none_by_the_matrix_s_key(keys):
    (mine, _), (_, other_signer), (_, third_signer) = keys
    env = _signed_by(other_signer, third_signer)
    assert not provsign.signer_is(env, mine).ok
    assert provsign.signature_holds(env, mine) == provsign.Answer(
        True, "nothing to check: no signature by the matrix's key (rows above decide)"
    )


def test_several_signatures_without_a_key_in_the_matrix_are_listed_in_order(keys):
    (_, my_signer), (_, other_signer), _ = keys
    env = _signed_by(other_signer, my_signer)
    answer = provsign.signer_is(env, None)
    assert answer.ok and answer.detail == (
        f"not checked (warning): signed by key id(s) {', '.join(k[:16] for k in sorted(env.signatures))}, "
        "and the matrix names no signing.public_key to check them against"
    )


def test_the_matrix_s_signature_is_checked_even_beside_a_bad_one(keys):
    (mine, my_signer), (other, other_signer), _ = keys
    doc = _signed_by(my_signer, other_signer).to_dict()
    for sig in doc["signatures"]:
        if sig["keyid"] == other.keyid:
            sig["sig"] = base64.b64encode(b"\0" * 64).decode()  # the other key's is garbage: not ours to judge
    env = provsign.read(json.dumps(doc))[0]
    assert provsign.signature_holds(env, mine).ok
    for sig in doc["signatures"]:
        if sig["keyid"] == mine.keyid:
            sig["sig"] = base64.b64encode(b"\0" * 64).decode()
    env = provsign.read(json.dumps(doc))[0]
    answer = provsign.signature_holds(env, mine)
    assert not answer.ok and answer.detail.startswith("the signature does not verify over this payload")


def test_the_signature_covers_the_payload_type(keys):
    """DSSE signs "DSSEv1 <len type> <type> <len payload> <payload>": the same payload signed under
    another type does not verify under in-toto's."""
    (mine, my_signer), _, _ = keys
    other_type = Envelope(STATEMENT.encode(), "application/json", {})
    other_type.sign(my_signer)
    doc = other_type.to_dict()
    doc["payloadType"] = provsign.PAYLOAD_TYPE
    env = provsign.read(json.dumps(doc))[0]
    assert provsign.signer_is(env, mine).ok  # the right key...
    assert not provsign.signature_holds(env, mine).ok  # ...over another pre-authentication encoding


def test_a_public_key_that_is_not_pem_is_bad_input_naming_the_file(tmp_path):
    bad = tmp_path / "k.pub"
    bad.write_text("ssh-ed25519 AAAA... not PEM\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: signing.public_key: not a readable PEM public key"):
        provsign.public_key(tmp_path, "k.pub")
    with pytest.raises(ConfigError, match="signing.public_key: not a readable PEM public key"):
        provsign.public_key(tmp_path, str(tmp_path / "missing.pub"))


def test_unsigned_matrix_makes_no_signer(tmp_path):
    assert provsign.signer(_Signing(), tmp_path) is None
