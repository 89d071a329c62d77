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
