"""Every failure class the tool knows, each with its exit code.

Only ``cli.main()`` turns these into an exit; everything else raises. Messages are one line
and say what to do next (modelled on cibuildwheel's errors.py).
"""

from __future__ import annotations


class BuilderError(Exception):
    """Base class: a failure the tool understands and reports without a traceback."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(BuilderError):
    """Bad input: the matrix, a CLI option, a target name. Nothing has been written."""

    exit_code = 2


class RecordError(BuilderError):
    """A committed record (image.json, a lock) is corrupt or does not match; never rebuilt over."""

    exit_code = 2


class SourceError(BuilderError):
    """The pinned source cannot be fetched, or the branch does not carry the pinned commit."""

    exit_code = 2


class Unreachable(BuilderError):
    """A remote (git host, package index) cannot be reached from here: not bad input."""

    exit_code = 3


_NETWORK = (
    "could not resolve host",
    "unable to access",
    "connection refused",
    "connection timed out",
    "timed out",
    "network is unreachable",
    "name or service not known",
    "temporary failure in name",
    "failed to connect",
    "no route to host",
    "dns error",
    "error sending request",
    "failed to fetch",
    "dial tcp",
    "i/o timeout",
    "connection reset by peer",
)


def is_network_failure(text: str) -> bool:
    """Whether a tool's error message says the network, not the input, was the problem."""
    low = text.lower()
    return any(marker in low for marker in _NETWORK)


_RESOURCES = (
    "no space left on device",
    "read-only file system",
    "disk quota exceeded",
    "cannot allocate memory",
    "out of memory",
    "too many open files",
    "failed to create new os thread",
)


def failure_kind(text: str, default: type) -> type:
    """The error class a child's (git, uv, pip) failure text stands for: this host out of a
    resource (exit 74), the network (exit 3), else ``default`` (the input's fault)."""
    low = text.lower()
    if any(marker in low for marker in _RESOURCES):
        return HostResources
    return Unreachable if is_network_failure(text) else default


class LockError(BuilderError):
    """A lock cannot be made or is missing/stale for the build being asked for."""

    exit_code = 2


class EngineUnavailable(BuilderError):
    """The Docker engine, buildx or the registry cannot be reached."""

    exit_code = 3


class RegistryUnavailable(EngineUnavailable):
    """The registry cannot be reached or refuses a request (it is out of our hands: exit 3)."""


class BuildError(BuilderError):
    """The engine ran and the build, push or inspect failed. The log is kept."""

    exit_code = 1

    def __init__(self, message: str, log_path: str | None = None) -> None:
        if log_path:
            message = f"{message} (log: {log_path})"
        super().__init__(message)
        self.log_path = log_path


class CheckFailed(BuilderError):
    """An image check failed. The image is kept; the JUnit report says which and why."""

    exit_code = 1


class KernelPlanFailed(BuilderError):
    """The source's build files at the pin would compile no code a claimed GPU family loads for a
    kernel ``kernels.required`` names (or the plan cannot be computed): found before any compile,
    the finding `build plan` exits 1 for."""

    exit_code = 1


class VerifyFailed(BuilderError):
    """A link in the audit chain does not hold; the table says which."""

    exit_code = 1


class NotReproduced(BuilderError):
    """A rebuild from the records gave another digest; the report says what differs."""

    exit_code = 1


class DriftError(BuilderError):
    """A committed generated file differs from what its source makes now: a Dockerfile from the
    matrix (`build render --check`), the matrix schema from the models (`build schema --check`)."""

    exit_code = 1


class Busy(BuilderError):
    """Another build of the same target holds its lock; records are never written by two at once."""

    exit_code = 75  # EX_TEMPFAIL: try again later


class HostResources(BuilderError):
    """This machine ran out of something (disk space, a writable filesystem, memory, threads):
    neither bad input nor an unreachable remote; free the resource and run again."""

    exit_code = 74  # EX_IOERR


# errno values that mean the host, not the input or a remote, failed.
RESOURCE_ERRNOS = frozenset({28, 30, 122, 12, 24, 23})  # ENOSPC EROFS EDQUOT ENOMEM EMFILE ENFILE


def host_resources(exc: BaseException) -> HostResources | None:
    """The HostResources an OSError/MemoryError/thread failure stands for, or None."""
    import os

    if isinstance(exc, MemoryError):
        return HostResources("out of memory (MemoryError); raise the memory limit or free memory, then run again")
    if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
        where = f" writing {exc.filename}" if exc.filename else ""
        return HostResources(f"{os.strerror(exc.errno)}{where}; free space (or make it writable) and run again")
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return HostResources("cannot start a thread (a process or memory limit); raise the limit and run again")
    return None


class Interrupted(BuilderError):
    """SIGINT/SIGTERM during a step; records are untouched."""

    exit_code = 130
