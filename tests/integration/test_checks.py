"""The image checks catch what they claim to: broken variants of the smoke image, each failing
exactly the check that owns the problem, with a message that says expected and found."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET

import pytest

from builder import contract
from tests.integration.conftest import cli

SITE = "/opt/k3/venv/lib/python3.11/site-packages"
VARIANTS = {
    "no-expiry": ('LABEL "io.k3-cu129.expires"=""', {"expiry"}, "found it missing"),
    "expired": ('LABEL "io.k3-cu129.expires"="2020-01-01"', {"expiry"}, "the image has expired"),
    "no-kernel": (f"USER 0\nRUN rm -f {SITE}/k3smoke/_C.*.so\nUSER 2000:2000",
                  {"compiled_modules", "ops_registered"}, "k3smoke._C: ImportError"),
    "cuda13": (f"USER 0\nRUN cp {SITE}/nvidia/cuda_runtime/lib/libcudart.so.12 /usr/lib/x86_64-linux-gnu/libcudart.so.13"
               "\nUSER 2000:2000", {"no_other_cuda_major"}, "libcudart.so.13"),
    "world-writable": (f"USER 0\nRUN chmod 0666 {SITE}/k3smoke/__init__.py\nUSER 2000:2000",
                       {"no_world_writable"}, "k3smoke/__init__.py"),
    "root": ("USER 0:0", {"non_root"}, "expected a non-root default user, found 0:0"),
    "unlocked": (f"USER 0\nRUN mkdir {SITE}/extra_pkg-1.0.dist-info && printf 'Metadata-Version: 2.1\\nName: extra-pkg"
                 f"\\nVersion: 1.0\\n' > {SITE}/extra_pkg-1.0.dist-info/METADATA\nUSER 2000:2000",
                 {"lock_contents"}, "extra-pkg 1.0: not in the lock"),
}


@pytest.fixture(scope="module")
def variants(built):
    smoke, ref = built
    tags = {}
    for name, (lines, _, _) in VARIANTS.items():
        tag = f"k3-check-variant:{name}-{smoke.repository.rsplit('-', 1)[-1]}"
        dockerfile = f"FROM {ref}\n{lines}\n"
        subprocess.run(["docker", "buildx", "build", "--load", "-q", "-t", tag, "-"], input=dockerfile,
                       text=True, capture_output=True, check=True)
        tags[name] = tag
    yield smoke, tags
    subprocess.run(["docker", "image", "rm", "-f", *tags.values()], capture_output=True)


def _failed(stderr: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s+FAIL\s+(\S+)\s+(.*)$", stderr, re.M)}


def test_the_built_image_passes_and_leaves_a_junit_report(built):
    smoke, ref = built
    r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke")
    assert r.code == 0, r.err[-3000:]
    assert r.out.strip().splitlines()[-1] == ref  # tests the recorded digest by default
    assert not _failed(r.err)
    assert re.search(r"^\s+pass\s+cuda_runtime", r.err, re.M)
    reports = list((smoke.root / "artifacts" / "smoke").glob("*/checks.xml"))
    assert any((p.parent / "build.log").exists() for p in reports), "the build's own checks sit beside its log"
    suite = ET.parse(reports[0]).getroot().find("testsuite")
    assert int(suite.get("tests")) == len(contract.CHECKS)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_broken_variant_fails_the_right_check(variants, name):
    smoke, tags = variants
    _, expected_failures, expected_text = VARIANTS[name]
    r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke", "--image", tags[name])
    assert r.code == 1, r.err[-3000:]
    failed = _failed(r.err)
    assert set(failed) == expected_failures, r.err[-3000:]
    assert any(expected_text in message for message in failed.values()), failed
    assert all("expected" in message for message in failed.values()), failed
    assert "image checks failed" in r.err and "the image is kept" in r.err


def test_a_build_whose_checks_fail_keeps_the_image_but_not_the_record(built, tmp_path):
    smoke, _ = built
    work = smoke.copy(tmp_path / "expired")
    text = re.sub(r"expires: '?\d{4}-\d{2}-\d{2}'?", "expires: '2021-01-31'", work.matrix.read_text())
    work.matrix.write_text(text.replace("tag: smoke", "tag: expired"))  # leave the shared tag alone
    assert cli("--matrix", str(work.matrix), "render").code == 0
    record_before = work.record.read_bytes()
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 1, r.err[-3000:]
    assert set(_failed(r.err)) == {"expiry"}
    pushed = re.search(r"(\S+@sha256:[0-9a-f]{64}): image checks failed", r.err).group(1)
    assert subprocess.run(["docker", "buildx", "imagetools", "inspect", pushed], capture_output=True).returncode == 0
    assert work.record.read_bytes() == record_before  # image.json names only checked images
    reports = list((work.root / "artifacts" / "smoke").glob("*/checks.xml"))
    assert len(reports) == 1 and (reports[0].parent / "build.log").exists()
