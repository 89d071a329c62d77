"""`build evidence` redacts by value, not by shape (issue 32, defect 5): each secret form below is
planted in the environment and in what the engine returns (the container's log, docker info),
and none of it is in any file of the archive; the archive is 0600 whatever the umask."""

from __future__ import annotations

import base64
import json
import os
import tarfile
import urllib.parse

import pytest

from builder.errors import EngineUnavailable
from builder.host import evidence

HF = "hf_Qm9vYmFyYmF6cXV4MTIzNDU2"
PEM_BODY = "MC4CAQAwBQYDK2VwBCIEIPzF1fake0key0material0for0tests0only0xyz"
PEM_KEY = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----\n"
OTHER_PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAlogline0key0abc\nQWERTYline2zzz\n-----END RSA PRIVATE KEY-----"
)
CERT = "-----BEGIN CERTIFICATE-----\nMIIBcertificate0is0public\n-----END CERTIFICATE-----"
ENV = {
    "HF_TOKEN": HF,
    "TLS_KEY_PEM": PEM_KEY,
    "DB_PASSWORD": "correct horse battery staple",  # a passphrase: spaces do not make it harmless
    "PGCONN": "host=db user=app password=kv-s3cret-77 dbname=vllm",  # a DSN, under an innocent name
    "CURL_ARGS": "-u admin:curl-pw-555 https://repo.example.org/x",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/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6",
    "AUTH_ENABLED": "true",  # a secret-looking name with a value that is no secret
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "MAX_JOBS": "8",
}
# What the container printed: the token raw and in the encodings a program writes it in, and
# secrets the environment does not hold.
LOG = "\n".join(
    [
        f"loading model with token {HF}",
        f"config: {json.dumps({'token': HF})}",
        f"basic: {base64.b64encode(HF.encode()).decode()}",
        f"url-encoded: token={urllib.parse.quote(HF, safe='')}",
        "POST https://hooks.slack.com/services/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6 ok",
        "POST https://discord.com/api/webhooks/123456789012345678/dIsCoRdToKeN0aBcDeF9876 ok",
        "GET https://bucket.s3.amazonaws.com/model.bin?X-Amz-Credential=AKIAFAKE0001&X-Amz-Signature=5ig0beef",
        "connect postgresql://app:pg-pass-4242@db:5432/vllm",
        "curl -u admin:curl-pw-555 https://repo.example.org/x",
        "Authorization: Bearer opaqueBearer0token42",
        "vllm --api-key sk-local-0123 --password cli-pw-9999",
        OTHER_PEM,
        "the certificate stays: " + CERT,
        "server up, AUTH_ENABLED true",
    ]
)
PLANTED = [
    HF,
    PEM_BODY,
    "correct horse battery staple",
    "kv-s3cret-77",
    "curl-pw-555",
    "slackWebhookSecret0123456",
    "dIsCoRdToKeN0aBcDeF9876",
    "5ig0beef",
    "AKIAFAKE0001",
    "pg-pass-4242",
    "opaqueBearer0token42",
    "sk-local-0123",
    "cli-pw-9999",
    "MIIEowIBAAKCAQEAlogline0key0abc",
    "QWERTYline2zzz",
    base64.b64encode(HF.encode()).decode(),
]


class _Engine:
    def describe(self):
        return {
            "docker-version": "Version: 26.1.5\n",
            "docker-info": f"Debug Mode: true\nHTTP Proxy: {ENV['CURL_ARGS']}\n",
        }

    def image_inspect(self, ref):
        raise EngineUnavailable("no image")

    class containers:
        @staticmethod
        def logs(name):
            return LOG

        @staticmethod
        def run_python(ref, script):
            raise EngineUnavailable("no image")


@pytest.fixture()
def bundle(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "PROC_MODULES", tmp_path / "none")
    monkeypatch.setattr(evidence, "DRIVER_VERSION", tmp_path / "none")
    monkeypatch.setattr(evidence, "SYS_INFINIBAND", tmp_path / "none")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    old = os.umask(0o022)  # the usual umask, which made the archive 0644
    try:
        path, _ = evidence.evidence(_Engine(), tmp_path, None, "vllm-1", environ=ENV)
    finally:
        os.umask(old)
    with tarfile.open(path) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    return path, files


@pytest.mark.parametrize("planted", PLANTED)
def test_no_file_of_the_bundle_holds_a_planted_secret(bundle, planted):
    _, files = bundle
    assert {"container.log", "environment.txt", "docker-info.txt", "manifest.json"} <= set(files)
    assert [name for name, text in files.items() if planted in text] == []


def test_what_is_no_secret_stays_readable(bundle):
    _, files = bundle
    env = files["environment.txt"]
    assert "LANG=C.UTF-8" in env and "HOME=/root" in env and "MAX_JOBS=8" in env
    log = files["container.log"]
    assert CERT in log  # a certificate is public
    assert "server up, AUTH_ENABLED true" in log and "Debug Mode: true" in files["docker-info.txt"]
    assert "https://bucket.s3.amazonaws.com/model.bin?***" in log
    assert "https://discord.com/api/webhooks/123456789012345678/***" in log  # an id is no secret; the token is
    assert "-----BEGIN RSA PRIVATE KEY----- *** -----END RSA PRIVATE KEY-----" in log


def test_the_archive_is_private_whatever_the_umask(bundle):
    path, _ = bundle
    assert path.stat().st_mode & 0o777 == 0o600
    with tarfile.open(path) as tar:
        assert {m.mode for m in tar.getmembers()} == {0o600}


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        ("host=db user=app password=kv-pw-1", "kv-pw-1"),
        ("-u user:curl-pw-2", "curl-pw-2"),
        ("first line\nsecond-line-pw-3", "second-line-pw-3"),
        ("Bearer bearer-token-4", "bearer-token-4"),
        ("ghp_0123456789abcdefghij and more", "ghp_0123456789abcdefghij"),
        ("postgres://u:pg-pw-5@h/db extra", "pg-pw-5"),
        ("https://h/x?sig=signed-6 other", "signed-6"),
    ],
)
def test_a_value_with_spaces_is_not_harmless_by_its_spaces(value, secret):
    shown = evidence.redacted_environment({"INNOCENT_NAME": value})
    assert secret not in shown and shown.startswith("INNOCENT_NAME=")
