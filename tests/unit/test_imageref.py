"""The one rule for "does this reference name a registry host", at its edges, and the callers
that must agree with it (the registry client's split, the purl both records write)."""

from __future__ import annotations

import pytest

from builder.config.imageref import names_registry_host
from builder.engine.registry import split_ref
from builder.records.artifacts import oci_purl

HOSTS = [
    "127.0.0.1:5000/k3/smoke:tag",
    "localhost/k3/smoke",
    "localhost:5000/x",
    "registry.example/org/image@sha256:" + "0" * 64,
    "ghcr.io/owner/image",
    "[::1]:5000/x",  # a port, as Docker writes an IPv6 host
]
NOT_HOSTS = [
    "ubuntu",
    "ubuntu:24.04",  # a tag, not a port: no slash
    "k3/vllm",  # a Docker Hub namespace
    "k3/vllm:1.0",
    "library/debian@sha256:" + "0" * 64,
    "localhostx/image",  # only the exact word localhost
    "",
    "/image",
]


@pytest.mark.parametrize("ref", HOSTS)
def test_names_a_host(ref: str) -> None:
    assert names_registry_host(ref)


@pytest.mark.parametrize("ref", NOT_HOSTS)
def test_names_no_host(ref: str) -> None:
    assert not names_registry_host(ref)


@pytest.mark.parametrize("ref", [r for r in HOSTS + NOT_HOSTS if "@" not in r and r])
def test_the_registry_client_splits_by_the_same_rule(ref: str) -> None:
    host, _ = split_ref(ref)
    assert (host != "registry-1.docker.io") == names_registry_host(ref)


def test_the_purl_writes_docker_hub_out_only_for_a_reference_without_a_host() -> None:
    digest = "sha256:" + "1" * 64
    assert oci_purl("k3/vllm:1", digest).qualifiers["repository_url"] == "docker.io/k3/vllm"
    assert oci_purl("debian:12", digest).qualifiers["repository_url"] == "docker.io/library/debian"
    local = oci_purl("localhost:5000/k3/vllm:1", digest)
    assert local.qualifiers["repository_url"] == "localhost:5000/k3/vllm"
