from builder.engine import buildlog

LOG = """#7 [build 2/4] RUN --mount=type=bind,source=wheelhouse/build,target=/ctx/wheels pip install
#7 CACHED

#8 [build 3/4] RUN cd /src && pip wheel .
#8 0.462 building
#8 DONE 0.9s

#9 [runtime 2/2] COPY --from=build /opt /opt
#9 DONE 0.0s

#10 exporting to image
#10 DONE 0.1s
"""


def test_counts_steps_that_ran_and_that_were_cached():
    steps = buildlog.steps(LOG)
    assert [(s.stage, s.instruction, s.cached, s.ran) for s in steps] == [
        ("build 2/4", "RUN", True, False),
        ("build 3/4", "RUN", False, True),
        ("runtime 2/2", "COPY", False, True),
    ]
    assert [s.stage for s in buildlog.ran(LOG)] == ["build 3/4"]
    assert buildlog.ran(LOG, "COPY")[0].text.startswith("--from=build")
