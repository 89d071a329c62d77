"""seam.image_config: one reading of a failed local pull for every command that reads an image's
config (doctor, compare, vet): out of reach is exit 3, not served is exit 2, anything else stays the
engine's failure. `doctor --image x/y/z` with no Docker Hub exited 1 before the rule moved here."""

from __future__ import annotations

import pytest

from builder.engine.seam import image_config
from builder.errors import BuildError, ConfigError, Unreachable
from tests.unit.fakeengine import FakeEngine


def _failing(message: str) -> FakeEngine:
    engine = FakeEngine()

    def fail(ref: str):
        raise BuildError(message)

    engine.image_config = fail  # type: ignore[method-assign]
    return engine


@pytest.mark.parametrize(
    ("message", "error", "code"),
    [
        ("cannot pull or inspect x/y/z: dial tcp: lookup registry-1.docker.io: no such host", Unreachable, 3),
        ("cannot pull or inspect x/y/z: manifest unknown", ConfigError, 2),
        ("cannot pull or inspect x/y/z: pull access denied, repository does not exist", ConfigError, 2),
    ],
)
def test_a_failed_pull_is_classified_once(message, error, code):
    with pytest.raises(error) as caught:
        image_config(_failing(message), "x/y/z")
    assert caught.value.exit_code == code and "--image x/y/z" in caught.value.message


def test_another_engine_failure_stays_the_engines():
    with pytest.raises(BuildError) as caught:
        image_config(_failing("cannot pull or inspect x/y/z: disk full"), "x/y/z")
    assert type(caught.value) is BuildError


def test_doctor_with_an_unreachable_image_exits_3(monkeypatch, capsys):
    from builder.cli import main
    from tests.conftest import REPO

    engine = _failing("cannot pull or inspect x/y/z: dial tcp: lookup registry-1.docker.io: no such host")
    monkeypatch.setattr("builder.engine.buildx.DockerEngine", lambda *a, **k: engine)
    capture = next((REPO / "tests" / "fixtures" / "nvidia-smi").glob("r575*.txt"))
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--nvidia-smi-file", str(capture), "--image", "x/y/z"])
    assert exited.value.code == 3 and "out of reach" in capsys.readouterr().err
