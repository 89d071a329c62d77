"""The user's demo survives the suite: what `ci/demo.sh` (the README's first command) pushed into the
local registry is still served after the integration tests (the README's second command) ran.

Tests make and delete only their own things; this checks the one thing a user certainly has. At the
start of a run, in the process that runs the session (pytest-xdist's controller, or the only one),
every tag of the demo's repository is read (its image index, per-platform images and the SBOM and
provenance attached to them), with the digest the demo's record (`smoke/locks/smoke/image.json`)
names. So the check means something where no demo ran (CI's `.ci/run` does not run it), a stand-in
is pushed beside them under a tag of its own (a tiny image of no layers). At the end each of these
must still be served by the same digest, or the run fails naming what went; the stand-in is then
deleted. The hooks are conftest.py's (imported there), so they run when pytest is given
tests/integration or a file in it (as ci/check.sh and CI do): a conftest found only while
collecting comes after the session started."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest

from tests.conftest import REPO

REGISTRY = "127.0.0.1:5000"  # the registry ci/demo.sh pushes to (conftest.REGISTRY)
DEMO_REPOSITORY = "k3/smoke"  # ci/demo.sh's default
DEMO_RECORD = REPO / "smoke" / "locks" / "smoke" / "image.json"  # ci/demo.sh's default OUT
# Each run's stand-in has a tag and a digest of its own (a nonce in its annotations): two suites on
# one registry (two checkouts, two sessions) never delete each other's, and one never counts another's.
STAND_IN_PREFIX = "suite-stand-in-"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ACCEPT = ", ".join(
    [
        OCI_MANIFEST,
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)


@dataclass
class Before:
    repository: str
    served: dict[str, str] = field(default_factory=dict)  # tag or digest -> digest
    stand_in: str | None = None  # the stand-in's digest, when this run pushed one


def _request(method: str, path: str, data: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(f"http://{REGISTRY}/v2/{path}", data=data, method=method, headers=headers or {})
    return urllib.request.urlopen(req, timeout=30)


def digest_of(repository: str, reference: str) -> str | None:
    """What the registry serves for a tag or digest, or None (404)."""
    try:
        with _request("HEAD", f"{repository}/manifests/{reference}", headers={"Accept": ACCEPT}) as resp:
            return resp.headers["Docker-Content-Digest"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def tags_of(repository: str) -> list[str]:
    try:
        with _request("GET", f"{repository}/tags/list") as resp:
            return json.load(resp).get("tags") or []
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def demo_repository() -> tuple[str, str | None]:
    """(repository, recorded digest) of the user's demo: from its record when there is one on this
    registry, else ci/demo.sh's default repository and no digest."""
    try:
        record = json.loads(DEMO_RECORD.read_text())
    except (OSError, ValueError):
        return DEMO_REPOSITORY, None
    m = re.match(rf"{re.escape(REGISTRY)}/([^:@]+)", str(record.get("image", "")))
    return (m.group(1), record.get("digest")) if m else (DEMO_REPOSITORY, None)


def push_stand_in(repository: str, tag: str) -> str:
    """A tiny image (a config, no layer) under ``tag``, unique to this run; its digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
    config_digest = "sha256:" + hashlib.sha256(config.encode()).hexdigest()
    with _request("POST", f"{repository}/blobs/uploads/", data=b"") as resp:
        location = resp.headers["Location"]
    sep = "&" if "?" in location else "?"
    url = location if location.startswith("http") else f"http://{REGISTRY}{location}"
    put = urllib.request.Request(f"{url}{sep}digest={config_digest}", data=config.encode(), method="PUT")
    put.add_header("Content-Type", "application/octet-stream")
    urllib.request.urlopen(put, timeout=30).close()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [],
            "annotations": {
                "org.opencontainers.image.description": "the integration suite's stand-in (survivors.py)",
                "io.k3-cu129.test.run": tag,
            },
        }
    ).encode()
    with _request("PUT", f"{repository}/manifests/{tag}", manifest, {"Content-Type": OCI_MANIFEST}) as resp:
        return resp.headers["Docker-Content-Digest"]


def snapshot() -> Before:
    repository, recorded = demo_repository()
    before = Before(repository)
    for tag in tags_of(repository):
        if tag.startswith(STAND_IN_PREFIX):
            continue  # another run's stand-in: that run deletes it
        digest = digest_of(repository, tag)
        if digest:
            before.served[tag] = digest
    if recorded and digest_of(repository, recorded) == recorded:
        before.served[recorded] = recorded
    tag = STAND_IN_PREFIX + secrets.token_hex(6)
    before.stand_in = push_stand_in(repository, tag)
    before.served[tag] = before.stand_in
    return before


def gone(before: Before) -> list[str]:
    """What was served before and is not now, as `repository:tag (digest)`."""
    return [
        f"{before.repository}:{ref} ({digest})"
        for ref, digest in sorted(before.served.items())
        if digest_of(before.repository, ref) != digest
    ]


def remove_stand_in(before: Before) -> None:
    if before.stand_in:
        try:
            _request("DELETE", f"{before.repository}/manifests/{before.stand_in}").close()
        except urllib.error.HTTPError:
            pass


_before: list[Before] = []


def _runs_the_session(config: pytest.Config) -> bool:
    return config.getoption("--integration") and not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _runs_the_session(session.config):
        try:
            _before.append(snapshot())
        except OSError as exc:  # no registry: the tests that need it say so themselves
            print(f"survivors.py: the registry on {REGISTRY} could not be read before the suite: {exc}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _before:
        return
    before = _before.pop()
    try:
        missing = gone(before)
        remove_stand_in(before)
    except OSError as exc:  # the registry went away: nothing of the demo is served
        missing = [f"{before.repository} (the registry on {REGISTRY} could not be read: {exc})"]
    if missing:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = f"the suite deleted what it did not make: no longer served: {', '.join(missing)}"
        if reporter is not None:
            reporter.write_line(f"FAILED survivors.py: {line}", red=True)
        else:
            print(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
