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


# A real transcript (`docker buildx build --progress=plain`, buildx 0.13.1, docker driver,
# 2026-12-06; output lines cut to four): a multi-stage build, a step with long output whose lines
# look like BuildKit's own ("#3 DONE", a step header, "ERROR:"), carry a terminal escape, a CR and
# a bidi control, and a failing last step with BuildKit's error summary.
REAL = (
    '#0 building with "default" instance using docker driver\n\n'
    "#1 [internal] load build definition from Dockerfile\n#1 transferring dockerfile: 475B 0.0s done\n#1 DONE 0.0s\n\n"
    "#4 [b 1/3] FROM 127.0.0.1:5000/k3/smoke-base:bookworm\n#4 CACHED\n\n"
    "#5 [a 2/3] RUN echo cached-step\n#5 0.212 cached-step\n#5 DONE 0.3s\n\n"
    "#6 [a 3/3] RUN for i in $(seq 1 40); do echo line $i; done\n#6 0.256 line 1\n#6 0.259 line 40\n"
    "#6 0.259 #3 DONE 9.9s\n#6 0.259 #99 [x 1/1] RUN fake\n#6 0.259 ERROR: fake\n"
    "#6 0.259 \x1b]0;pwn\x07title\r\n#6 0.259 \u202ebidi https://u:s3cret-pass@example.org/x\n#6 DONE 0.4s\n\n"
    "#8 [b 3/3] RUN echo before; echo last-a; echo last-b; exit 3\n#8 0.230 before\n#8 0.231 last-a\n"
    "#8 0.231 last-b \x1b[2J\n"
    '#8 ERROR: process "/bin/sh -c echo before; echo last-a; echo last-b; exit 3" did not complete successfully: '
    "exit code: 3\n------\n > [b 3/3] RUN echo before; echo last-a; echo last-b; exit 3:\n0.230 before\n"
    "0.231 last-a\n0.231 last-b \x1b[2J\n------\nDockerfile:6\n--------------------\n"
    "   6 | >>> RUN echo before; echo last-a; echo last-b; exit 3\n--------------------\n"
    'ERROR: failed to solve: process "/bin/sh -c echo before; echo last-a; echo last-b; exit 3" did not complete '
    "successfully: exit code: 3\n"
)


def test_a_real_failing_build_reads_one_line_a_step_with_its_last_output_escaped(capsys):
    """As DockerEngine.build relays it (each line redacted, then the Relay, into log.raw): output that
    looks like BuildKit's markers ends no step and prints nothing; the failure keeps the failing
    step's last lines (BuildKit's summary) and the error; control bytes are escaped."""
    from builder import log

    relay = buildlog.Relay(log.raw, plain=True)
    for line in REAL.split("\n")[:-1]:  # python-on-whales splits on newlines only (not a CR)
        relay(log.redact(line))
    err = capsys.readouterr().err.splitlines()
    steps = [line for line in err if line.startswith("#")]
    assert steps == [
        "#1 [internal] load build definition from Dockerfile DONE 0.0s",
        "#4 [b 1/3] FROM 127.0.0.1:5000/k3/smoke-base:bookworm CACHED",
        "#5 [a 2/3] RUN echo cached-step DONE 0.3s",
        "#6 [a 3/3] RUN for i in $(seq 1 40); do echo line $i; done DONE 0.4s",
        '#8 [b 3/3] RUN echo before; echo last-a; echo last-b; exit 3 ERROR: process "/bin/sh -c echo before; '
        'echo last-a; echo last-b; exit 3" did not complete successfully: exit code: 3',
    ]
    assert err[err.index(" > [b 3/3] RUN echo before; echo last-a; echo last-b; exit 3:") :][1:4] == [
        "0.230 before",
        "0.231 last-a",
        "0.231 last-b \\x1b[2J",
    ]
    assert err[-1].startswith("ERROR: failed to solve: process")
    assert not any(("fake" in line or "line 40" in line or "bidi" in line) for line in err)
    assert all(line.strip() and "\x1b" not in line and "\r" not in line for line in err)
    # On a terminal every line, each escaped and the URL's password redacted.
    relay = buildlog.Relay(log.raw, plain=False)
    for line in REAL.split("\n")[:-1]:  # python-on-whales splits on newlines only (not a CR)
        relay(log.redact(line))
    err = capsys.readouterr().err
    assert "#6 0.259 \\x1b]0;pwn\\x07title\\x0d" in err and "\\u202ebidi https://***@example.org/x" in err
    assert "s3cret" not in err and "\x1b" not in err and "\u202e" not in err
