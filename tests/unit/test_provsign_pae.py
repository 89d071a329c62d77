"""The DSSE envelope (builder/records/provsign.py), each rule pinned to its exact answer:

* several signatures: ``signed`` counts them; ``signer_is`` holds only when EACH is by the matrix's
  key (the module's rule: "is each by the matrix's key, by key id"), so one good signature beside
  another key's fails it, naming only the other key; ``signature_holds`` checks the matrix key's
  own signature and ignores the others;
* ``read`` accepts only in-toto's payloadType, exactly (a good payload under another type fails);
* the signature is over DSSE's pre-authentication encoding, byte for byte
  ``DSSEv1 <len type> <type> <len payload> <payload>``: a signature made by hand over that
  encoding verifies, one over the bare payload or over an encoding with another length does not;
* key ids: compared whole and case-sensitive (a prefix, the first 16 characters the messages
  show, or the same id in upper case is another key), shown cut to 16 characters, listed sorted;
  two signatures under one key id are no envelope.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.dsse import Envelope
from securesystemslib.formats import encode_canonical

from builder.errors import ConfigError
from builder.records import provsign

TYPE = "application/vnd.in-toto+json"
STATEMENT = (
    json.dumps({"_type": "https://in-toto.io/Statement/v1", "subject": [], "predicate": {"é": 1}}, ensure_ascii=False)
    + "\n"
)


class _Signing:
    def __init__(self, key=None, public_key=None):
        self.key, self.public_key = key, public_key


class Key:
    """A TEST key pair: its securesystemslib public key, its signer and its raw private key."""

    def __init__(self, tmp_path, name: str) -> None:
        key, pub = provsign.generate_test_key(tmp_path / name)
        self.pub = provsign.public_key(tmp_path, str(pub))
        self.signer = provsign.signer(_Signing(str(key), str(pub)), tmp_path)
        self.raw = load_pem_private_key(key.read_bytes(), password=None)
        self.id = self.pub.keyid


@pytest.fixture()
def mine(tmp_path):
    return Key(tmp_path, "mine")


@pytest.fixture()
def other(tmp_path):
    return Key(tmp_path, "other")


def _env(signatures: list[tuple[str, bytes]], payload: bytes = STATEMENT.encode(), payload_type: str = TYPE):
    """An envelope read back from its JSON text, with these (keyid, raw signature) pairs."""
    doc = {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": payload_type,
        "signatures": [{"keyid": k, "sig": base64.b64encode(s).decode()} for k, s in signatures],
    }
    return provsign.read(json.dumps(doc))[0]


def _pae(payload_type: str, payload: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 " + str(len(t)).encode() + b" " + t + b" " + str(len(payload)).encode() + b" " + payload


def _questions(env, key):
    return [q(env, key) for q in (provsign.signed, provsign.signer_is, provsign.signature_holds)]


def _holds(key: Key) -> provsign.Answer:
    return provsign.Answer(True, f"verifies over the payload ({key.pub.scheme}, offline)")


BY_MATRIX = "by the matrix's signing.public_key (key id {})"
NOT_MATRIX = "signed by key id {}, not the matrix's signing.public_key (key id {})"
BAD = "the signature does not verify over this payload: the Statement (or the signature) changed after it was signed"
NOTHING_TO_CHECK = provsign.Answer(True, "nothing to check: no signature by the matrix's key (rows above decide)")


# --- the pre-authentication encoding ---------------------------------------------------------------


def test_the_pae_is_dssev1_with_byte_lengths_of_type_and_payload():
    env = _env([])
    want = (
        b"DSSEv1 28 application/vnd.in-toto+json " + str(len(STATEMENT.encode())).encode() + b" " + STATEMENT.encode()
    )
    assert env.pae() == want == _pae(TYPE, STATEMENT.encode())
    assert len(STATEMENT.encode()) == len(STATEMENT) + 1  # "é" is two bytes: the length is of bytes


def test_a_signature_made_by_hand_over_the_pae_verifies(mine):
    sig = mine.raw.sign(_pae(TYPE, STATEMENT.encode()))
    env = _env([(mine.id, sig)])
    assert _questions(env, mine.pub) == [
        provsign.Answer(True, "1 signature(s)"),
        provsign.Answer(True, BY_MATRIX.format(mine.id[:16])),
        _holds(mine),
    ]


@pytest.mark.parametrize(
    "signed_bytes",
    [
        STATEMENT.encode(),  # the bare payload, no encoding
        _pae(TYPE, STATEMENT.encode()).replace(b"DSSEv1", b"DSSEv2"),
        _pae(TYPE, STATEMENT.encode()).replace(b" 28 ", b" 29 "),  # another type length
        b"DSSEv1 28 " + TYPE.encode() + b" " + str(len(STATEMENT)).encode() + b" " + STATEMENT.encode(),  # chars
        _pae("application/json", STATEMENT.encode()),  # another type
        _pae(TYPE, STATEMENT.encode()) + b"\n",
    ],
    ids=["bare payload", "DSSEv2", "type length", "payload length in characters", "other type", "trailing newline"],
)
def test_a_signature_over_anything_but_the_exact_pae_fails_only_the_signature_question(mine, signed_bytes):
    env = _env([(mine.id, mine.raw.sign(signed_bytes))])
    signed, signer, holds = _questions(env, mine.pub)
    assert signed.ok and signer.ok
    assert holds == provsign.Answer(False, BAD)


# --- payloadType ----------------------------------------------------------------------------------


@pytest.mark.parametrize("payload_type", ["application/json", TYPE + " ", TYPE.upper(), "", "application/vnd.in-toto"])
def test_a_good_and_well_signed_payload_under_another_type_is_no_envelope(mine, payload_type):
    sig = mine.raw.sign(_pae(payload_type, STATEMENT.encode()))
    with pytest.raises(ValueError) as err:
        _env([(mine.id, sig)], payload_type=payload_type)
    assert str(err.value) == f"payloadType {payload_type!r} is not {TYPE}"


def test_in_toto_s_type_and_a_json_object_payload_is_read():
    env, statement = provsign.read(provsign.envelope(STATEMENT))
    assert env.payload_type == TYPE and env.payload == STATEMENT.encode() and env.signatures == {}
    assert statement == json.loads(STATEMENT)


# --- several signatures ---------------------------------------------------------------------------


def test_two_signatures_one_by_the_matrix_s_key_fail_only_the_signer_question(mine, other):
    env = Envelope(STATEMENT.encode(), TYPE, {})
    env.sign(mine.signer)
    env.sign(other.signer)
    env = provsign.read(json.dumps(env.to_dict()))[0]
    assert _questions(env, mine.pub) == [
        provsign.Answer(True, "2 signature(s)"),
        provsign.Answer(False, NOT_MATRIX.format(other.id[:16], mine.id[:16])),
        _holds(mine),
    ]
    # ...and the same envelope, the other key being the matrix's, names the first as the stranger
    assert _questions(env, other.pub) == [
        provsign.Answer(True, "2 signature(s)"),
        provsign.Answer(False, NOT_MATRIX.format(mine.id[:16], other.id[:16])),
        _holds(other),
    ]


def test_the_matrix_s_signature_is_judged_alone_whatever_the_others_are(mine, other):
    good = mine.raw.sign(_pae(TYPE, STATEMENT.encode()))
    garbage = b"\x01" * 64
    env = _env([(other.id, garbage), (mine.id, good)])
    assert provsign.signature_holds(env, mine.pub) == _holds(mine)
    env = _env([(other.id, other.raw.sign(_pae(TYPE, STATEMENT.encode()))), (mine.id, garbage)])
    assert provsign.signature_holds(env, mine.pub) == provsign.Answer(False, BAD)


def test_only_other_keys_signed_nothing_is_checked_and_the_signer_names_them_all(mine, other, tmp_path):
    third = Key(tmp_path, "third")
    env = _env(
        [
            (other.id, other.raw.sign(_pae(TYPE, STATEMENT.encode()))),
            (third.id, third.raw.sign(_pae(TYPE, STATEMENT.encode()))),
        ]
    )
    assert _questions(env, mine.pub) == [
        provsign.Answer(True, "2 signature(s)"),
        provsign.Answer(False, NOT_MATRIX.format(f"{other.id[:16]}, {third.id[:16]}", mine.id[:16])),
        NOTHING_TO_CHECK,
    ]


def test_without_a_key_in_the_matrix_signatures_are_listed_sorted_and_not_judged(mine, other):
    ids = sorted([mine.id, other.id])
    env = _env([(ids[1], b"\x00" * 64), (ids[0], b"\x00" * 64)])  # given out of order, both garbage
    assert _questions(env, None) == [
        provsign.Answer(True, "2 signature(s)"),
        provsign.Answer(
            True,
            f"not checked (warning): signed by key id(s) {ids[0][:16]}, {ids[1][:16]}, and the matrix "
            "names no signing.public_key to check them against",
        ),
        NOTHING_TO_CHECK,
    ]


def test_no_signature_with_and_without_a_key_in_the_matrix(mine):
    env = _env([])
    assert _questions(env, mine.pub) == [
        provsign.Answer(False, f"no signature, but the matrix names signing.public_key (key id {mine.id[:16]})"),
        provsign.Answer(True, "nothing to attribute: no signature (row 'provenance signed' decides)"),
        NOTHING_TO_CHECK,
    ]
    assert _questions(env, None) == [
        provsign.Answer(
            True,
            "UNSIGNED (warning): the matrix names no signing.key/public_key, so nothing outside CI's keyless "
            "attestation vouches for this provenance",
        ),
        provsign.Answer(True, "nothing to attribute: no signature (row 'provenance signed' decides)"),
        NOTHING_TO_CHECK,
    ]


# --- key ids ----------------------------------------------------------------------------------------


def test_a_key_id_is_the_sha256_of_the_key_s_canonical_form(mine):
    assert mine.id == hashlib.sha256(encode_canonical(mine.pub.to_dict()).encode()).hexdigest()
    assert len(mine.id) == 64


@pytest.mark.parametrize(
    "keyid", [lambda k: k[:16], lambda k: k[:-1], lambda k: k.upper(), lambda k: k + "0", lambda k: " " + k]
)
def test_a_key_id_is_compared_whole_and_exactly(mine, keyid):
    """A good signature under an id that is not exactly the matrix key's id is another key's: the
    signer question fails naming it, and there is no signature of the matrix's key to check."""
    claimed = keyid(mine.id)
    env = _env([(claimed, mine.raw.sign(_pae(TYPE, STATEMENT.encode())))])
    assert _questions(env, mine.pub) == [
        provsign.Answer(True, "1 signature(s)"),
        provsign.Answer(False, NOT_MATRIX.format(claimed[:16], mine.id[:16])),
        NOTHING_TO_CHECK,
    ]


def test_another_key_s_signature_under_the_matrix_s_key_id_fails_the_signature(mine, other):
    env = _env([(mine.id, other.raw.sign(_pae(TYPE, STATEMENT.encode())))])
    assert _questions(env, mine.pub) == [
        provsign.Answer(True, "1 signature(s)"),
        provsign.Answer(True, BY_MATRIX.format(mine.id[:16])),
        provsign.Answer(False, BAD),
    ]


def test_two_signatures_under_one_key_id_are_no_envelope(mine):
    sig = base64.b64encode(mine.raw.sign(_pae(TYPE, STATEMENT.encode()))).decode()
    doc = {
        "payload": base64.b64encode(STATEMENT.encode()).decode(),
        "payloadType": TYPE,
        "signatures": [{"keyid": mine.id, "sig": sig}, {"keyid": mine.id, "sig": sig}],
    }
    with pytest.raises(ValueError) as err:
        provsign.read(json.dumps(doc))
    why = f"Multiple signatures found for keyid {mine.id}"
    assert len(why) > 80  # the library's message, cut to 80 characters
    assert str(err.value) == f"not a DSSE envelope (ValueError: {why[:80]})"


def test_the_envelope_text_is_sorted_indented_and_signed_by_the_matrix_s_key(mine):
    text = provsign.envelope(STATEMENT, mine.signer)
    doc = json.loads(text)
    sig = base64.b64decode(doc["signatures"][0]["sig"])
    mine.raw.public_key().verify(sig, _pae(TYPE, STATEMENT.encode()))  # raises when it is not over the PAE
    assert (
        text
        == json.dumps(
            {
                "payload": base64.b64encode(STATEMENT.encode()).decode(),
                "payloadType": TYPE,
                "signatures": [{"keyid": mine.id, "sig": doc["signatures"][0]["sig"]}],
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    assert (
        provsign.envelope(STATEMENT)
        == json.dumps(
            {"payload": base64.b64encode(STATEMENT.encode()).decode(), "payloadType": TYPE, "signatures": []},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


# --- the matrix's key files -----------------------------------------------------------------------


def test_relative_key_paths_are_the_matrix_s_directory_s_not_the_working_directory_s(tmp_path, monkeypatch):
    key, pub = provsign.generate_test_key(tmp_path / "keys")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rel_key, rel_pub = str(key.relative_to(tmp_path)), str(pub.relative_to(tmp_path))
    assert provsign.public_key(tmp_path, rel_pub).keyid == provsign.public_key(tmp_path, str(pub)).keyid
    signer = provsign.signer(_Signing(rel_key, rel_pub), tmp_path)
    env = Envelope(STATEMENT.encode(), TYPE, {})
    env.sign(signer)
    assert provsign.signature_holds(env, provsign.public_key(tmp_path, rel_pub)).ok


def test_a_key_uri_is_handed_over_as_it_is_and_never_looked_at_as_a_file(tmp_path, monkeypatch):
    from builder import log

    key, pub = provsign.generate_test_key(tmp_path / "keys")
    uri = f"file2:{key}"
    # a world-readable file at the path the URI would name if it were a relative path: not the key
    decoy = tmp_path / uri
    decoy.parent.mkdir(parents=True)
    decoy.write_text("not a key\n")
    decoy.chmod(0o644)
    warned: list[str] = []
    monkeypatch.setattr(log, "warn", warned.append)
    signer = provsign.signer(_Signing(uri, str(pub)), tmp_path)
    env = Envelope(STATEMENT.encode(), TYPE, {})
    env.sign(signer)
    assert provsign.signature_holds(env, provsign.public_key(tmp_path, str(pub))).ok
    assert warned == []


def test_a_readable_key_warns_naming_the_matrix_s_value_and_the_file(tmp_path, monkeypatch):
    from builder import log

    key, pub = provsign.generate_test_key(tmp_path / "keys")
    key.chmod(0o640)
    warned: list[str] = []
    monkeypatch.setattr(log, "warn", warned.append)
    provsign.signer(_Signing("keys/" + key.name, str(pub)), tmp_path)
    assert warned == [
        f"signing.key keys/{key.name}: {key} is readable by others (mode 0640); `chmod 600 {key}`, "
        "and treat the key as exposed"
    ]


def test_a_key_that_cannot_sign_is_named_with_the_library_s_reason_cut_to_a_hundred(tmp_path):
    from securesystemslib.signer import Signer

    _, pub = provsign.generate_test_key(tmp_path / "keys")
    missing = tmp_path / "keys" / "missing.key"
    try:
        Signer.from_priv_key_uri(f"file2:{missing}", provsign.public_key(tmp_path, str(pub)))
    except Exception as exc:  # noqa: BLE001 - the library's own reason, as the module reports it
        kind, why = exc.__class__.__name__, str(exc)
    assert len(why) > 100
    with pytest.raises(ConfigError) as err:
        provsign.signer(_Signing(str(missing), str(pub)), tmp_path)
    assert err.value.message == (
        f"signing.key {missing}: cannot sign with it ({kind}: {why[:100]}); it must be the private half of "
        "signing.public_key"
    )


def test_a_public_key_that_is_not_pem_is_named_with_the_reason_cut_to_eighty(tmp_path):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    bad = tmp_path / "k.pub"
    bad.write_bytes(b"garbage\n")
    try:
        load_pem_public_key(b"garbage\n")
    except ValueError as exc:
        why = str(exc)
    assert len(why) > 80
    with pytest.raises(ConfigError) as err:
        provsign.public_key(tmp_path, "k.pub")
    assert err.value.message == f"{bad}: signing.public_key: not a readable PEM public key ({why[:80]})"


def test_the_test_key_pair_is_made_in_a_directory_that_did_not_exist(tmp_path):
    key, pub = provsign.generate_test_key(tmp_path / "a" / "b")
    assert (key.name, pub.name) == (provsign.TEST_KEY_NAME, provsign.TEST_PUBLIC_KEY_NAME)
    assert key.parent == pub.parent == tmp_path / "a" / "b"
