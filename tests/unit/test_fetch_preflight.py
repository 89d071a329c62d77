"""The build's preflight refuses an unpinned fetch: a whole smoke build on the fake engine
(tests/unit/fakeengine.py, the fixtures of test_pipeline_ordering.py) stops before any third-party
fetch, build or record."""

from __future__ import annotations

import pytest

from builder.config import matrix
from builder.config.options import BuildOptions
from builder.errors import SourceError
from builder.pipeline import build as pipeline
from builder.pipeline.plan import Plan
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_pipeline_ordering import _recorded, checks, plan, smoke_repos  # noqa: F401 - fixtures


def test_an_unpinned_fetch_stops_the_build_before_any_third_party_fetch_or_build(plan, checks):  # noqa: F811
    # The smoke's k3kernels FetchContent_Declare, no longer pinned from the file that declares it.
    # Without the preflight the third-party fetch refuses later, with another message.
    path = plan.matrix_path
    path.write_text(path.read_text().replace("declared_in: CMakeLists.txt", "declared_in: cmake/moved.cmake", 1))
    moved = Plan.of(matrix.load(path), "smoke")
    engine = FakeEngine()
    with pytest.raises(
        SourceError, match=r"unpinned fetch in the build files: CMakeLists\.txt:\d+: FetchContent_Declare k3kernels"
    ):
        pipeline.build(moved, engine, BuildOptions())
    assert [e for e in engine.events if e[0] in ("build", "push")] == [] and _recorded(moved) is None
