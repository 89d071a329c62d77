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


# Docker 28.2.2 on this machine, `docker run` of the smoke's linux/arm64 base without --platform
# (stderr, verbatim): the engine's words the tool turns into its own.
FOREIGN = (
    "WARNING: The requested image's platform (linux/arm64) does not match the detected host platform "
    "(linux/amd64/v4) and no specific platform was requested"
)

# A failing build's plain log (buildx 0.x, docker driver, 2026-12-06): steps, their output, the
# blank lines between them, and the error summary BuildKit prints outside any step.
FAILED = """#0 building with "default" instance using docker driver

#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 262B done
#1 DONE 0.1s

#5 [1/2] FROM 127.0.0.1:5000/k3/smoke-base:bookworm@sha256:e7f2
#5 DONE 0.0s

#6 [2/2] RUN --mount=type=bind,source=wheelhouse/build,target=/ctx/wheels --network=none echo before && exit 3
#6 0.511 before
#6 0.511 oops
#6 ERROR: process "/bin/sh -c echo before && exit 3" did not complete successfully: exit code: 3
------
 > [2/2] RUN echo before && exit 3:
0.511 before
0.511 oops
------



ERROR: failed to solve: process "/bin/sh -c echo before && exit 3" did not complete successfully: exit code: 3
"""


def _relayed(text: str, plain: bool) -> list[str]:
    out: list[str] = []
    relay = buildlog.Relay(out.append, plain=plain)
    for line in text.splitlines():
        relay(line)
    return out


def test_plain_output_is_one_line_per_step_and_keeps_the_error_summary():
    assert _relayed(FAILED, plain=True) == [
        "#1 [internal] load build definition from Dockerfile DONE 0.1s",
        "#5 [1/2] FROM 127.0.0.1:5000/k3/smoke-base:bookworm@sha256:e7f2 DONE 0.0s",
        '#6 [2/2] RUN echo before && exit 3 ERROR: process "/bin/sh -c echo before && exit 3" did not complete '
        "successfully: exit code: 3",
        "------",
        " > [2/2] RUN echo before && exit 3:",
        "0.511 before",
        "0.511 oops",
        "------",
        'ERROR: failed to solve: process "/bin/sh -c echo before && exit 3" did not complete successfully: exit code: 3',
    ]
    plain = _relayed(LOG + SHARED, plain=True)
    assert all(line.strip() for line in plain)  # no blank line, let alone a run of them
    assert "#7 [build 2/4] RUN pip install CACHED" in plain and "#8 0.462 building" not in plain
    long = "#9 [build 3/9] RUN " + "x" * 300
    cut = _relayed(f"{long}\n#9 DONE 1.0s\n", plain=True)
    assert cut == [
        "#9 [build 3/9] RUN " + "x" * (buildlog.HEADER_CHARS - 3 - len("[build 3/9] RUN ")) + "... DONE 1.0s"
    ]


def test_on_a_terminal_every_line_is_relayed():
    assert _relayed(FAILED, plain=False) == FAILED.splitlines()


def test_the_foreign_platform_warning_is_said_once_in_the_tools_words():
    assert buildlog.foreign_platform(FOREIGN) == ("linux/arm64", "linux/amd64/v4")
    assert buildlog.foreign_platform(f"#12 0.321 {FOREIGN}") == ("linux/arm64", "linux/amd64/v4")
    for plain in (True, False):
        said = _relayed(f"{FOREIGN}\n#1 [a 1/1] RUN true\n#1 12.1 {FOREIGN}\n#1 DONE 0.1s\n{FOREIGN}\n", plain)
        note = "note: linux/arm64 runs under QEMU here (the engine's host is linux/amd64/v4): slower than native"
        assert said[0] == note and not any("WARNING" in line for line in said)
    # Narrow: another warning, or the same words with more after them, is the engine's and relayed.
    for other in (
        "WARNING: The requested image's platform (linux/arm64) does not match the detected host platform",
        FOREIGN + "; and something else",
        "WARNING: No swap limit support",
    ):
        assert buildlog.foreign_platform(other) is None
        assert _relayed(other, plain=True) == [other]
