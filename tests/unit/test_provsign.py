"""The provenance as a DSSE envelope: signed with the matrix's key, checked offline against its
public key, each fault answered by its own question; identities, the tool's own pins and purls
that in-toto's bindings and the SBOM agree with."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

from builder.config import matrix
from builder.errors import ConfigError
from builder.records import artifacts, attest, chain, provsign, slsa
from tests.conftest import REPO
from tests.unit.test_attest import WHEELS, inputs  # noqa: F401 - the shared fixture

STATEMENT = (
    json.dumps(
        {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "x", "digest": {"sha256": "d" * 64}}],
            "predicateType": "https://slsa.dev/provenance/v1",
            "predicate": {"a": 1},
        }
    )
    + "\n"
)


class _Signing:
    def __init__(self, key=None, public_key=None):
        self.key, self.public_key = key, public_key


@pytest.fixture()
def keys(tmp_path):
    mine = provsign.generate_test_key(tmp_path / "mine")
    other = provsign.generate_test_key(tmp_path / "other")
    return tmp_path, mine, other


def _answers(text: str, pub) -> list[bool]:
    env, _ = provsign.read(text)
    return [q(env, pub).ok for q in (provsign.signed, provsign.signer_is, provsign.signature_holds)]


def test_a_signed_envelope_verifies_and_each_fault_fails_its_own_question(keys):
    root, (key, pub_path), (other_key, _) = keys
    pub = provsign.public_key(root, str(pub_path))
    signed = provsign.envelope(STATEMENT, provsign.signer(_Signing(str(key), str(pub_path)), root))
    assert _answers(signed, pub) == [True, True, True]
    env, statement = provsign.read(signed)
    assert env.payload_type == "application/vnd.in-toto+json" and statement["subject"][0]["name"] == "x"
    # missing signature
    assert _answers(provsign.envelope(STATEMENT), pub) == [False, True, True]
    # wrong key: another key signed it (its own public key is not the matrix's)
    other = provsign.signer(_Signing(str(other_key), str(other_key.with_suffix(".pub"))), root)
    assert _answers(provsign.envelope(STATEMENT, other), pub) == [True, False, True]
    # edited payload, signature left as it was
    doc = json.loads(signed)
    doc["payload"] = base64.b64encode(STATEMENT.replace('"a": 1', '"a": 2').encode()).decode()
    assert _answers(json.dumps(doc), pub) == [True, True, False]
    # a forged key id (another key's signature claiming the matrix's key id) fails the signature
    forged = json.loads(provsign.envelope(STATEMENT, other))
    forged["signatures"][0]["keyid"] = pub.keyid
    assert _answers(json.dumps(forged), pub) == [True, True, False]


def test_unsigned_without_a_public_key_holds_with_a_warning(keys):
    env, _ = provsign.read(provsign.envelope(STATEMENT))
    answer = provsign.signed(env, None)
    assert answer.ok and answer.detail.startswith("UNSIGNED (warning)")


def test_a_key_that_is_not_the_public_key_s_half_is_bad_input(keys):
    root, (key, _), (_, other_pub) = keys
    with pytest.raises(ConfigError, match="private half of signing.public_key"):
        provsign.signer(_Signing(str(key), str(other_pub)), root)
    with pytest.raises(ConfigError, match="not a readable PEM public key"):
        provsign.public_key(root, "missing.pub")


def test_the_test_key_is_private_from_its_creation(tmp_path, monkeypatch):
    """Issue 32: the TEST key was written 0644 and chmodded after; it is 0600 before it has its name."""
    import os

    from builder import fsutil

    modes = {}
    real_replace = os.replace

    def replace(src, dst):
        modes[Path(dst).name] = os.stat(src).st_mode & 0o777  # the mode the file has when it appears
        real_replace(src, dst)

    monkeypatch.setattr(fsutil.os, "replace", replace)
    key, pub = provsign.generate_test_key(tmp_path)
    assert modes[key.name] == 0o600 and key.stat().st_mode & 0o777 == 0o600
    assert modes[pub.name] == 0o644  # the public half is public


def test_a_key_others_can_read_signs_with_a_warning(keys, monkeypatch):
    from builder import log

    root, (key, pub_path), _ = keys
    warned: list[str] = []
    monkeypatch.setattr(log, "warn", warned.append)
    provsign.signer(_Signing(str(key), str(pub_path)), root)
    assert warned == []  # 0600: nothing to say
    key.chmod(0o644)
    assert provsign.signer(_Signing(str(key), str(pub_path)), root) is not None
    assert len(warned) == 1 and "readable by others (mode 0644)" in warned[0] and f"chmod 600 {key}" in warned[0]


def test_not_an_envelope_is_said_so():
    for text in (STATEMENT, "[]", '{"payload": "!!", "payloadType": "x", "signatures": []}'):
        with pytest.raises(ValueError):
            provsign.read(text)


def test_the_matrix_names_key_and_public_key_together(tmp_path):
    text = (REPO / "matrix.yaml").read_text()
    bad = text.replace("\n  cu129:\n", "\n  cu129:\n    signing:\n      key: k.pem\n", 1)
    assert bad != text
    path = tmp_path / "matrix.yaml"
    path.write_text(bad)
    with pytest.raises(ConfigError, match=r"signing\.public_key: required with signing\.key"):
        matrix.load(path)


@pytest.mark.parametrize(
    "ref, want",
    [
        (
            "127.0.0.1:5000/k3/smoke-devel:bookworm-1",
            "pkg:oci/smoke-devel@sha256:{d}?repository_url=127.0.0.1:5000/k3/smoke-devel&tag=bookworm-1",
        ),
        (
            "nvidia/cuda:12.9.1-devel-ubuntu22.04",
            "pkg:oci/cuda@sha256:{d}?repository_url=docker.io/nvidia/cuda&tag=12.9.1-devel-ubuntu22.04",
        ),
        ("debian", "pkg:oci/debian@sha256:{d}?repository_url=docker.io/library/debian"),
        (
            "ghcr.io/k3-cu129/vllm-openai@sha256:" + "d" * 64,
            "pkg:oci/vllm-openai@sha256:{d}?repository_url=ghcr.io/k3-cu129/vllm-openai",
        ),
    ],
)
def test_oci_purls_follow_the_purl_spec(ref, want):
    got = artifacts.oci_purl(ref, "sha256:" + "d" * 64).to_string()
    assert got == want.format(d="d" * 64)


def _statement(t, record, **kw) -> dict:
    return json.loads(slsa.provenance(t, record, {"MAX_JOBS": "2"}, "2026-11-29T00:00:00Z", **kw))


def test_provenance_parses_with_in_toto_bindings_and_pins_the_tool(inputs):  # noqa: F811
    t, record, inv, lock = inputs
    build_wheels = {"cmake-4.0.3-py3-none-manylinux_2_17_x86_64.whl": "f" * 64}
    doc = _statement(t, record, wheels=WHEELS, build_wheels=build_wheels, environ={})
    Statement.copy_from_pb(json_format.ParseDict(doc, statement_pb2.Statement())).validate()
    json_format.ParseDict(doc["predicate"], provenance_pb2.Provenance())  # strict: unknown fields fail
    deps = {d["name"]: d for d in doc["predicate"]["buildDefinition"]["resolvedDependencies"]}
    commit, dirty = slsa.tool_checkout()
    assert commit is not None and re.fullmatch(r"[0-9a-f]{40}", commit)  # the tests run from a checkout
    tool = doc["predicate"]["runDetails"]["builder"]["builderDependencies"][0]
    assert tool["uri"] == f"git+{t.project_url}@{commit}" and tool["digest"] == {"gitCommit": commit}
    assert tool["annotations"]["dirty"] is dirty
    template = deps["template:Dockerfile.j2"]
    assert template["uri"] == f"git+{t.project_url}@{commit}#builder/dockerfile/templates/Dockerfile.j2"
    assert template["digest"]["sha256"] == slsa.sha256_file(slsa.TEMPLATES / "Dockerfile.j2")
    assert deps["lock"]["uri"] == f"git+{t.project_url}@{commit}#locks/cu129/requirements.txt"
    for filename, sha in WHEELS.items():
        assert deps[f"wheel:{filename}"]["digest"] == {"sha256": sha}
        assert deps[f"wheel:{filename}"]["uri"].startswith("pkg:pypi/")
    assert deps["build-wheel:cmake-4.0.3-py3-none-manylinux_2_17_x86_64.whl"]["uri"] == (
        "pkg:pypi/cmake@4.0.3?file_name=cmake-4.0.3-py3-none-manylinux_2_17_x86_64.whl"
    )
    sbom = json.loads(attest.sbom(t, record, inv, lock))
    sbom_purls = {c["bom-ref"]: c["purl"] for c in sbom["components"]}
    for role in ("build", "runtime"):
        assert deps[f"base:{role}"]["uri"] == sbom_purls[f"base:{role}"]  # one purl function, same string


def test_identities_default_documented_and_overridable(inputs):  # noqa: F811
    t, record, _, _ = inputs
    local = _statement(t, record, environ={})["predicate"]
    assert local["buildDefinition"]["buildType"] == f"{t.project_url}/blob/main/docs/buildtypes/matrix-dockerfile/v1.md"
    assert (REPO / slsa.BUILD_TYPE_DOC).is_file()  # the page the URL points at exists in this repository
    assert local["runDetails"]["builder"]["id"] == slsa.local_builder_id(t)
    github = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_WORKFLOW_REF": "k3-cu129/k3-cu129-images/.github/workflows/k3-branch.yml@refs/heads/main",
    }
    ci = _statement(t, record, environ=github)["predicate"]["runDetails"]["builder"]["id"]
    assert ci == "https://github.com/k3-cu129/k3-cu129-images/.github/workflows/k3-branch.yml@refs/heads/main"
    forms = slsa.builder_id_forms(t)
    assert forms.fullmatch(ci) and forms.fullmatch(slsa.local_builder_id(t))
    assert not forms.fullmatch("https://github.com/someone-else/fork/.github/workflows/k3-branch.yml@refs/heads/main")
    pinned = _statement(
        t, record, environ={"K3_BUILDER_ID": "https://ci.example/runner", "K3_BUILD_TYPE": "https://ci.example/type/v2"}
    )["predicate"]
    assert pinned["runDetails"]["builder"]["id"] == "https://ci.example/runner"
    assert pinned["buildDefinition"]["buildType"] == "https://ci.example/type/v2"


def test_the_docs_verify_table_is_the_code_s_row_list():
    auditor = (REPO / "docs" / "auditor.md").read_text()
    assert chain.table_markdown() in auditor
    names = [name for name, _, _ in chain.ROWS]
    assert len(names) == len(set(names)) and all(len(n) < 28 for n in names)  # the CLI's column


def test_the_key_file_is_0600_before_its_first_byte(tmp_path, monkeypatch):
    """Issue 49: not made 0644 and narrowed later: the file that receives the key's bytes is
    private from the moment it exists (mkstemp), whatever the umask."""
    import os

    from builder import fsutil

    seen: list[int] = []
    real = fsutil.os.fdopen

    def fdopen(fd, *args, **kwargs):
        seen.append(os.fstat(fd).st_mode & 0o777)
        return real(fd, *args, **kwargs)

    monkeypatch.setattr(fsutil.os, "fdopen", fdopen)
    old = os.umask(0)
    try:
        provsign.generate_test_key(tmp_path)
    finally:
        os.umask(old)
    assert seen[0] == 0o600  # the private key is written first
