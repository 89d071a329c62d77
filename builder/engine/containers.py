"""Containers of built images: the idle container the image checks run in, throwaway runs that
print what the SBOM inventory and the comparisons need, and container logs for evidence.

Every container this tool starts carries the label ``contract.CONTAINER_LABEL`` with the pid of
the process that started it, so one left behind by a killed run is found and removed at the next
start, and one that a concurrent run (another target, --jobs) is using is left alone.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from builder.config import contract
from builder.errors import BuildError, EngineUnavailable

if TYPE_CHECKING:
    from python_on_whales import DockerClient


class ContainerSeam(Protocol):
    """What the checks, the SBOM inventory and the evidence ask of containers; fakes implement this."""

    def start(self, ref: str, platform: str | None = None, mounts: tuple[tuple[Path, str], ...] = ()) -> str: ...
    def exec(self, container_id: str, argv: list[str], timeout: float) -> Ran: ...
    def export(self, container_id: str) -> contextlib.AbstractContextManager[IO[bytes]]: ...
    def copy_into(self, container_id: str, src: Path, dest: str) -> None: ...
    def remove(self, container_id: str) -> None: ...
    def remove_stale(self) -> int: ...
    def run_python(self, ref: str, script: str) -> str: ...
    def run_capture(self, ref: str, entrypoint: str, args: list[str]) -> str: ...
    def logs(self, name: str) -> str: ...
    def run_online(self, ref: str, script: str, platform: str | None = None) -> str: ...


# The checks' container (issue 49): no capability, no privilege gained through set-id files, no
# network, and bounded processes, memory and CPU, so a check that forks or allocates without end
# stops at a limit instead of taking the host. Its root stays writable: least_privilege measures
# what the image's user can write, which a read-only root would hide (docs/checks.md).
PIDS, MEMORY, CPUS = 4096, "8g", float(min(4, os.cpu_count() or 1))
NO_PRIVILEGE = ["no-new-privileges"]
OUTPUT_HEAD = 1 << 20  # bytes of a command's stdout/stderr kept from its start ...
OUTPUT_TAIL = 16 << 20  # ... and from its end (where a probe prints its facts)


@dataclass(frozen=True)
class Ran:
    """A command run in a container: its exit status (None: killed at its timeout), and its output
    cut to OUTPUT_HEAD + OUTPUT_TAIL bytes per stream (``dropped``: bytes left out of the middle)."""

    rc: int | None
    stdout: str
    stderr: str
    dropped: int = 0

    @property
    def timed_out(self) -> bool:
        return self.rc is None


class _Capped:
    """One stream read to its end, keeping its head and its tail only."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.head, self.tail, self.tail_size, self.dropped = bytearray(), deque[bytes](), 0, 0
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream: IO[bytes]) -> None:
        for chunk in iter(lambda: stream.read(1 << 16), b""):
            room = OUTPUT_HEAD - len(self.head)
            self.head += chunk[:room]
            rest = chunk[room:] if room > 0 else chunk
            if rest:
                self.tail.append(rest)
                self.tail_size += len(rest)
            while self.tail and self.tail_size - len(self.tail[0]) >= OUTPUT_TAIL:
                self.dropped += len(self.tail[0])
                self.tail_size -= len(self.tail.popleft())

    def text(self) -> str:
        cut = b"\n[... %d bytes left out ...]\n" % self.dropped if self.dropped else b""
        return (bytes(self.head) + cut + b"".join(self.tail)).decode("utf-8", "replace")


def run_capped(argv: list[str], timeout: float, stdin: bytes | None = None) -> Ran:
    """Run ``argv`` (``stdin`` its input) with a timeout (then killed: rc None) and its output capped."""
    feed = subprocess.DEVNULL if stdin is None else subprocess.PIPE
    proc = subprocess.Popen(argv, stdin=feed, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _Capped(proc.stdout), _Capped(proc.stderr)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    try:
        rc: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = None
    for reader in (out, err):
        reader.thread.join(timeout=30)  # a grandchild holding the pipe open is not waited for
    return Ran(rc, out.text(), err.text(), out.dropped + err.dropped)


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except OSError:  # the command exited without reading it all
        pass


@contextlib.contextmanager
def docker_errors(what: str, unreachable: bool = False) -> Iterator[None]:
    """One translation of the Docker CLI's failures: ``what`` failed (exit 1), or the engine is out
    of reach (exit 3) when ``unreachable`` or the CLI itself is missing."""
    from python_on_whales.exceptions import DockerException

    try:
        yield
    except DockerException as exc:
        detail = (exc.stderr or str(exc)).strip().splitlines()
        kind = EngineUnavailable if unreachable or _daemon_down(exc) else BuildError
        raise kind(f"{what}: {detail[-1][:300] if detail else exc}") from None
    except FileNotFoundError:
        raise EngineUnavailable("docker CLI not found; run ci/setup.sh") from None


def _daemon_down(exc) -> bool:
    text = (exc.stderr or "").lower()
    return "cannot connect to the docker daemon" in text or "is the docker daemon running" in text


def _labels() -> dict[str, str]:
    return {contract.CONTAINER_LABEL: str(os.getpid())}


def _alive(pid: str) -> bool:
    """Whether the process that started a container still runs here (then it still needs it)."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = Path(f"/proc/{pid}/stat")
    return not (state.exists() and state.read_text().rsplit(")", 1)[-1].split()[0] == "Z")


class DockerContainers:
    def __init__(self, docker: DockerClient | Callable[[], DockerClient]) -> None:
        self._docker = docker  # or a factory: the engine makes its client on first use

    @property
    def docker(self) -> DockerClient:
        return self._docker() if callable(self._docker) else self._docker

    def start(self, ref: str, platform: str | None = None, mounts: tuple[tuple[Path, str], ...] = ()) -> str:
        """Start a container of ``ref`` that idles (no network) for checks; returns its id.
        ``platform``: the image's (another machine's runs emulated), else the engine's own. ``mounts``:
        (host file, path in the container) bound read-only: the host's QEMU for cpu_level."""
        with docker_errors(f"cannot start a container of {ref}"):
            container = self._hardened(ref, ["infinity"], "sleep", detach=True, platform=platform, mounts=mounts)
        return container.id

    def _pulled(self, ref: str, platform: str | None) -> None:
        """Pull ``ref`` quietly when the engine lacks it. python-on-whales' own pull before a run
        prints "Unable to find image" and the pull's progress to this process's stdout, where
        ``--json`` output goes (vet of an image the engine has not pulled)."""
        if not self.docker.image.exists(ref):
            self.docker.image.pull(ref, quiet=True, platform=platform)

    def _hardened(
        self, ref: str, args: list[str], entrypoint: str, *, detach: bool, platform: str | None = None, mounts=()
    ):
        """``docker run`` as every container of an image under check runs: no network, no capability,
        no-new-privileges, bounded; detached (a container) or removed when done (its stdout)."""
        self._pulled(ref, platform)
        return self.docker.run(  # type: ignore[call-overload]  # ``detach`` picks the overload at run time
            ref,
            args,
            entrypoint=entrypoint,
            detach=detach,
            remove=not detach,
            labels=_labels(),
            platform=platform,
            networks=["none"],
            cap_drop=["ALL"],
            security_options=NO_PRIVILEGE,
            pids_limit=PIDS,
            memory=MEMORY,
            cpus=CPUS,
            volumes=[(str(src), dest, "ro") for src, dest in mounts],
        )

    def exec(self, container_id: str, argv: list[str], timeout: float) -> Ran:
        """Run ``argv`` in the container (``docker exec``), at most ``timeout`` seconds, output capped.
        Past its timeout the command is killed in the container too: killing the ``docker exec``
        client leaves the process running there, taking CPU from every later check (issue 49)."""
        cli = self.docker.client_config.docker_cmd
        try:
            ran = run_capped([*cli, "exec", container_id, *argv], timeout)
        except FileNotFoundError:
            raise EngineUnavailable("docker CLI not found; run ci/setup.sh") from None
        if ran.timed_out:
            self._reap(container_id)
        return ran

    def _reap(self, container_id: str) -> None:
        """Kill every process in the container, by the engine (no program of the image is trusted to
        do it): a restart with no grace period SIGKILLs its init, and with it the whole PID namespace,
        then starts the idle ``sleep`` again; the container's files are kept for the later checks."""
        with docker_errors(f"cannot kill a timed-out command in container {container_id[:12]}"):
            self.docker.container.restart(container_id, time=0)

    @contextlib.contextmanager
    def export(self, container_id: str) -> Iterator[IO[bytes]]:
        """The container's root file system as the engine exports it: a tar stream, read forward."""
        cli = self.docker.client_config.docker_cmd
        with subprocess.Popen([*cli, "export", container_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            try:
                yield proc.stdout
            finally:
                proc.stdout.close()
                proc.kill()

    def copy_into(self, container_id: str, src: Path, dest: str) -> None:
        with docker_errors(f"cannot copy into container {container_id[:12]}"):
            self.docker.container.copy(src, (container_id, dest))

    def remove(self, container_id: str) -> None:
        from python_on_whales.exceptions import DockerException

        try:
            self.docker.container.remove(container_id, force=True, volumes=True)
        except DockerException:
            pass  # already gone

    def remove_stale(self) -> int:
        """Remove every container an earlier run of this tool left behind when it was killed."""
        from python_on_whales.exceptions import NoSuchContainer

        with docker_errors("cannot list containers", unreachable=True):
            ours = self.docker.container.list(all=True, filters={"label": contract.CONTAINER_LABEL})
        removed = 0
        for container in ours:
            with docker_errors("cannot inspect a container of this tool"):
                try:
                    labels = container.config.labels or {}  # inspected here, after the list
                except NoSuchContainer:
                    continue  # removed since the list (another run's, finished): nothing left to remove
            if not _alive(labels.get(contract.CONTAINER_LABEL, "")):
                self.remove(container.id)
                removed += 1
        return removed

    def run_python(self, ref: str, script: str) -> str:
        """Run a Python script in a throwaway container of ``ref`` with whichever python it has."""
        return self.run_capture(ref, "sh", ["-c", 'exec "$(command -v python3 || command -v python)" -c "$0"', script])

    def run_capture(self, ref: str, entrypoint: str, args: list[str]) -> str:
        """Run ``entrypoint args`` in a throwaway container of ``ref`` (no network); its stdout."""
        with docker_errors(f"cannot run {entrypoint} in {ref}"):
            return self._hardened(ref, args, entrypoint, detach=False, platform=self._own_platform(ref))

    def _own_platform(self, ref: str) -> str | None:
        """The image's own os/arch, asked for explicitly: a run of another machine's image (emulated)
        then prints no "does not match the detected host platform" warning, which python-on-whales
        would leave on our stderr (it does not capture a non-detached run's). None when the engine
        does not hold the image (the run pulls it, for the engine's own platform, as before)."""
        from python_on_whales.exceptions import DockerException

        try:
            image = self.docker.image.inspect(ref)
        except DockerException:
            return None
        return f"{image.os}/{image.architecture}" if image.os and image.architecture else None

    def run_online(self, ref: str, script: str, platform: str | None = None) -> str:
        """Run ``sh -c script`` in a throwaway container of ``ref`` WITH the engine's default network
        (the OS package resolution reaches the archive this way); its stdout. A base that cannot be
        pulled is out of reach (exit 3): the engine has no other way to get it. ``platform``: of an
        index, that platform's image (another machine's runs emulated), else the engine's own."""
        with docker_errors(f"cannot run the OS package resolution in {ref}", unreachable=True):
            self._pulled(ref, platform)
            return self.docker.run(
                ref, ["-c", script], entrypoint="sh", remove=True, labels=_labels(), platform=platform
            )

    def logs(self, name: str) -> str:
        with docker_errors(f"cannot read the log of container {name}"):
            from python_on_whales.utils import run

            out, err = run(self.docker.client_config.docker_cmd + ["logs", "--timestamps", name], return_stderr=True)
        return out + err
