"""`build escrow` refuses, before any registry is asked, when there is no record to escrow:
the repository's matrix in a directory of its own, nothing built (exit 2, nothing written)."""

from __future__ import annotations

import shutil

import pytest

from builder.cli import main
from tests.conftest import REPO


@pytest.fixture()
def checkout(tmp_path):
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    return tmp_path


@pytest.mark.parametrize(
    ("extra", "says"),
    [((), "nothing recorded"), (("--target", "cu129"), "no record: build the target before escrowing it")],
)
def test_nothing_recorded_is_exit_2_and_nothing_written(checkout, capsys, extra, says):
    with pytest.raises(SystemExit) as info:
        main(["--matrix", str(checkout / "matrix.yaml"), "escrow", *extra])
    assert info.value.code == 2
    assert says in capsys.readouterr().err
    assert sorted(p.name for p in checkout.iterdir()) == ["matrix.yaml"]


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("nonsense", "not REGISTRY/REPO@sha256:<digest>"),  # a bare name: Docker Hub's, never asked
        ("127.0.0.1:5000/k3/x@sha256:../../v2/_catalog", "not REGISTRY/REPO@sha256:<digest>"),
        ("127.0.0.1:5000/k3/x@sha256:" + "0" * 63, "not REGISTRY/REPO@sha256:<digest>"),
        ("127.0.0.1:1/k3/escrow:t", "registry"),  # well formed, nothing listening: unreachable, exit 3
    ],
)
def test_reproduce_from_escrow_refuses_a_bad_ref_and_writes_nothing(checkout, capsys, ref, says):
    with pytest.raises(SystemExit) as info:
        main(["--matrix", str(checkout / "matrix.yaml"), "reproduce", "--target", "cu129", "--from-escrow", ref])
    assert info.value.code == (3 if says == "registry" else 2)
    assert says in capsys.readouterr().err
    assert sorted(p.name for p in checkout.iterdir()) == ["matrix.yaml"]  # no artifacts/ left behind
