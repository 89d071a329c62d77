"""The project's own label keys live under a reverse-DNS prefix the owner sets in the matrix
(label_prefix); readers that see only an image find the prefix from its labels."""

from __future__ import annotations

import datetime as dt
import re

import pytest
import yaml

from builder.config import contract, matrix
from builder.dockerfile import render
from builder.errors import ConfigError
from builder.host import doctor
from tests.conftest import REPO


def _target(tmp_path, prefix: str | None) -> matrix.Target:
    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    if prefix is not None:
        doc["targets"]["cu129"]["label_prefix"] = prefix
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(doc))
    return matrix.load(tmp_path / "matrix.yaml").target("cu129")


def test_the_default_prefix_is_the_documented_one(tmp_path):
    t = _target(tmp_path, None)
    assert t.labels == contract.LabelKeys("io.k3-cu129")
    assert t.labels.expires == contract.LABEL_EXPIRES == "io.k3-cu129.expires"


def test_a_custom_prefix_names_every_project_label(tmp_path):
    t = _target(tmp_path, "com.example.gpu-platform")
    text = render.render(t)
    keys = re.findall(r'"([^"]+)"=', text[text.index("\nLABEL ") :])
    own = [k for k in keys if not k.startswith("org.opencontainers.")]
    assert sorted(own) == sorted(
        [
            "com.example.gpu-platform." + s
            for s in ("cuda-version", "expires", "owner", "target", "builder.source", "sbom", "lock-sha256")
            + ("driver-floor", "gpu-families")
        ]
    )
    assert "io.k3-cu129" not in text


@pytest.mark.parametrize(
    "prefix",
    [
        "org.opencontainers.image",
        "org.label-schema.x",
        "Example.com",
        "single",
        "com.example.",
        "com..example",
        "com.example.$(id)",
        "-com.example",
    ],
)
def test_a_prefix_that_is_not_an_owned_reverse_dns_name_is_refused(tmp_path, prefix):
    with pytest.raises(ConfigError, match=r"targets\.cu129\.label_prefix"):
        _target(tmp_path, prefix)


def test_readers_find_the_prefix_from_the_image_labels():
    labels = {
        "com.example.gpu.target": "cu129",
        "com.example.gpu.expires": "2027-06-30",
        "com.example.gpu.owner": "gpu@example.com",
        "com.example.gpu.cuda-version": "12.9.1",
        "org.opencontainers.image.version": "0.30.0+cu129",
    }
    keys = contract.keys_in(labels)
    assert keys.prefix == "com.example.gpu"
    assert doctor._expiry(labels, dt.date(2027, 7, 1)) == (
        "EXPIRED on 2027-06-30: this bridge build is past its exit date; ask gpu@example.com"
    )
    assert contract.keys_in({"x.target": "a"}).prefix == contract.DEFAULT_LABEL_PREFIX  # no .expires beside it
