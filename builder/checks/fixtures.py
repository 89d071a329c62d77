"""The checklist's fixtures (builder/checks/checklist*.py), handed to pytest as a plugin by the
runner: the expectations, the image's config, the container the probes run in, the image's files,
its layers and the pinned runtime base's layers (each read once, when a check first asks), and the
warnings and facts the checks report back.
"""

from __future__ import annotations

from typing import Any

import pytest

from builder.checks import boundary, layers
from builder.checks.imagefiles import UnreadableImage
from builder.engine.seam import ImageConfig

PIP_DIR = "/tmp/k3-check-pip"  # pip's copy in the container (pip is not in the image)


class Fixtures:
    """Hands the checklist its fixtures; collects warnings it raises for the report."""

    def __init__(
        self, expect: Any, config: ImageConfig, host: boundary.ContainerHost, files, layers=None, base=None
    ) -> None:
        self._expect = expect
        self._config = config
        self._host = host
        self._files = files  # () -> the static view (boundary.read_files), read once when a check asks
        self._layers = layers  # () -> the image's layers (boundary.read_layers), read once when a check asks
        self._base = base  # () -> the pinned runtime base's layers (boundary.base_layers), likewise
        self.warnings: list[str] = []
        self.facts: dict = {}

    @pytest.fixture(scope="session")
    def expect(self) -> Any:  # runner.Expectations (runner imports this module)
        return self._expect

    @pytest.fixture(scope="session")
    def image(self) -> ImageConfig:
        return self._config

    @pytest.fixture(scope="session")
    def image_host(self) -> boundary.ContainerHost:
        return self._host

    @pytest.fixture(scope="session")
    def image_files(self):
        try:
            return self._files()
        except UnreadableImage as exc:
            pytest.fail(f"expected to read the image's files on the host, found {exc}")

    @pytest.fixture(scope="session")
    def image_layers(self):
        if self._layers is None:
            pytest.skip("the image's layers are not readable here (no saved image)")
        try:
            return self._layers()
        except UnreadableImage as exc:
            pytest.fail(f"expected to read the image's layers on the host, found {exc}")

    @pytest.fixture(scope="session")
    def pinned_base(self):
        return self._base() if self._base else layers.PinnedBase("", unread="no pinned runtime base given")

    @pytest.fixture(scope="session")
    def pip_dir(self) -> str:
        return PIP_DIR

    @pytest.fixture(scope="session")
    def report_warning(self):
        return self.warnings.append

    @pytest.fixture(scope="session")
    def record_fact(self):
        return self.facts.__setitem__
