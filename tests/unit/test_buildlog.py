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


# The head of a real log (CI, 2026-12-03, three builds at once on one engine): another build's
# steps, one of which ran, ahead of this build's own; its own os-packages step came from cache.
SHARED = """#0 building with "default" instance using docker driver

#1 [build 1/9] FROM 127.0.0.1:5000/k3/smoke-devel:bookworm@sha256:42ca
#1 CACHED

#3 [os-packages 2/2] RUN --network=none --mount=type=bind,source=debs,target=/ctx/debs set -eu
#3 DONE 1.1s

#4 [runtime 2/9] COPY --from=os-packages /os-root/ /
#4 DONE 0.1s

#5 [internal] load build definition from Dockerfile
#5 transferring dockerfile: 15.91kB done
#5 DONE 0.0s

#25 [os-packages 2/2] RUN --network=none --mount=type=bind,source=debs,target=/ctx/debs set -eu
#25 CACHED

#27 [runtime 2/9] COPY --from=os-packages /os-root/ /
#27 CACHED
"""


def test_steps_another_build_shows_before_this_one_read_its_dockerfile_are_not_counted():
    steps = buildlog.steps(SHARED)
    assert [(s.stage, s.instruction, s.cached, s.ran) for s in steps] == [
        ("os-packages 2/2", "RUN", True, False),
        ("runtime 2/9", "COPY", True, False),
    ]
    assert buildlog.ran(SHARED) == []
    # Without the build's own start in the log, every step counts (a log cut short still reads).
    head = SHARED.split("#5 [internal]")[0]
    assert [s.stage for s in buildlog.ran(head)] == ["os-packages 2/2"]
