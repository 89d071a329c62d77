"""The image's imports on the oldest CPU its target claims (check ``cpu_level``; issue 51).

Every file everything_loads loads (the extension modules under the prefix, imported; the other
shared objects, opened RTLD_NOW) is loaded in ONE process of the image's interpreter, in order
(the loads probe's ``in_order``), twice: as the container runs it, then under the host's QEMU
user-mode binary with ``-cpu MODEL`` (builder/config/cpulevel.py), mounted read-only into the
hardened checks container, so the image's code never runs on the host. A file that fails only
under the model, or whose load kills the process there (SIGILL: an instruction the model lacks),
is the finding; what fails in both runs is everything_loads'.

A load that kills the process loses nothing already done: each result is written as it completes,
and the run starts again past the file that killed it (at most ``RESTARTS`` times). Each top-level
package is imported first as a step of its own: when that import kills the process, the package is
the finding and its files are not tried again (each would import it again).

Under emulation (an arm64 image on an amd64 host) the host's ``qemu-aarch64-static`` is an amd64
program: it runs natively in the container and emulates the image's code with the model, as on an
arm64 host; the "as the container runs it" baseline is then the binfmt handler's default CPU.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from builder.checks import probes
from builder.config import cpulevel

MOUNT_DIR = "/tmp/k3-qemu"  # where the host's QEMU binary is mounted, read-only, in the checks' container
RESTARTS = 8  # runs started again past a file whose load killed the process
AT, ITEM = "K3-AT ", "K3-ITEM "  # builder/checks/probes/loads.py, in_order
SIGNALS = {4: "SIGILL", 7: "SIGBUS", 11: "SIGSEGV", 6: "SIGABRT", 8: "SIGFPE", 9: "SIGKILL"}
TCG_WARNING = re.compile(r"warning: TCG doesn't support requested feature")  # QEMU on Haswell-v4: harmless
INSTALL = "apt-get install qemu-user-static (Debian, Ubuntu; ci/setup.sh installs it)"


def host_qemu(platform: str) -> Path | None:
    """The host's QEMU user-mode binary for ``platform``'s code, or None (not installed here)."""
    found = shutil.which(cpulevel.qemu_binary(platform))
    return Path(found) if found else None


def mounts(claims: dict[str, str], platform: str) -> tuple[tuple[Path, str], ...]:
    """(host path, container path) of what the checks' container gets read-only: the QEMU binary,
    only when the row will run it (``claims``, the target's ``cpu``, names a level QEMU models)."""
    level = cpulevel.LEVELS.get(claims.get(platform, ""))
    qemu = host_qemu(platform) if level is not None and level.model else None
    return ((qemu.resolve(), in_container(platform)),) if qemu else ()


def in_container(platform: str) -> str:
    return f"{MOUNT_DIR}/{cpulevel.qemu_binary(platform)}"


@dataclass(frozen=True)
class Plan:
    """What the row runs: the claimed level and its QEMU model, or why it cannot (``not_checked``)."""

    platform: str
    level: cpulevel.Level | None
    qemu: str | None  # the binary's path in the container
    not_checked: str = ""


def plan(claims: dict[str, str], platform: str, qemu: str | None) -> Plan:
    """The row's plan for an image of ``platform`` under ``claims`` (the target's ``cpu``), with the
    QEMU binary mounted at ``qemu`` (None: the host has none)."""
    name = claims.get(platform)
    if name is None:
        why = f"the target claims no oldest CPU for {platform} (matrix key cpu: {{{platform}: LEVEL}})"
        return Plan(platform, None, qemu, why)
    level = cpulevel.LEVELS[name]
    if level.model is None:
        return Plan(platform, level, qemu, f"NOT CHECKED: {name}: {cpulevel.NO_MODEL[name]}")
    if qemu is None:
        binary = cpulevel.qemu_binary(platform)
        return Plan(platform, level, qemu, f"NOT CHECKED: {name}: no {binary} on this host; install it: {INSTALL}")
    return Plan(platform, level, qemu)


def command(python: str, env: str, qemu: str | None = None, model: str | None = None) -> str:
    """The probe's command line (``%s %s``: script, request), under ``qemu -cpu model`` when given."""
    if qemu is None:
        return f"{env}{python} -c %s %s"
    exe, _, flags = python.partition(" ")
    return f'{env}{qemu} -cpu {model} "$(command -v {exe})" {flags} -c %s %s'


@dataclass
class Run:
    """One loading of every file (possibly over several processes): each file's result (None: it
    loaded), the files whose load killed the process and how, and the end of the last stderr."""

    results: dict[str, str | list | None]
    killed: dict[str, str]
    complete: bool
    tail: str = ""
    unstarted: bool = False  # QEMU could not start the interpreter: exit 1, nothing said (not an ELF program)


def lines(stdout: str) -> tuple[dict[str, str | list | None], str | None]:
    """The items a run wrote and the file it announced last without a result (where it died)."""
    results: dict[str, str | list | None] = {}
    last = None
    for line in stdout.splitlines():
        try:
            if line.startswith(AT):
                last = json.loads(line[len(AT) :])
            elif line.startswith(ITEM):
                path, result = json.loads(line[len(ITEM) :])
                results[path] = result
        except (ValueError, TypeError):
            continue
    return results, (last if isinstance(last, str) and last not in results else None)


def death(rc: int | None, stderr: str) -> str:
    """How a run ended without its report: the signal (a shell reports 128+N) and stderr's last line."""
    sig = rc - 128 if rc is not None and rc > 128 else None
    last = next((ln.strip() for ln in reversed((stderr or "").splitlines()) if ln.strip()), "")[:300]
    what = f"killed by {SIGNALS.get(sig, f'signal {sig}')}" if sig else f"exit {rc}: {last or '(no output)'}"
    qemu = re.search(r"qemu: uncaught target signal (\d+) \(([^)]*)\)", stderr)
    if qemu:
        what = f"killed by {SIGNALS.get(int(qemu.group(1)), 'signal ' + qemu.group(1))} ({qemu.group(2)})"
    return what


def load_all(image_host, cmd: str, request: dict) -> Run:
    """Every file of the request loaded, started again past each that kills the process."""
    run = Run({}, {}, False)
    for _ in range(RESTARTS + 1):
        steps = {"in_order": True, "skip": sorted({*run.results, *run.killed}), "killed": sorted(run.killed)}
        ran = image_host.run(cmd, probes.script("loads"), json.dumps({**request, **steps}))
        found, last = lines(ran.stdout)
        run.results.update(found)
        run.tail = " | ".join(ln.strip() for ln in (ran.stderr or "").splitlines()[-3:] if ln.strip())[-400:]
        if probes.parse(ran.stdout) is not None:
            run.complete = True
            return run
        if last is None:  # died before or after every file: nothing to start again past
            run.killed.setdefault("(the interpreter)", death(ran.rc, ran.stderr))
            said = [ln for ln in (ran.stderr or "").splitlines() if ln.strip() and not TCG_WARNING.search(ln)]
            run.unstarted = not found and ran.rc == 1 and not said and not ran.stdout.strip()
            return run
        run.killed[last] = death(ran.rc, ran.stderr)
    return run


def findings(native: Run, model: Run, level: cpulevel.Level) -> list[tuple[str, str]]:
    """(path, why) of each file that loads as the container runs it and not on the level's model."""
    where = f"on {level.name} (QEMU -cpu {level.model})"
    out = []
    for step, how in sorted(model.killed.items()):
        if step not in native.killed:  # a file, or "import P": the package whose files then were not tried
            rest = "; its files not tried" if step.startswith("import ") else ""
            out.append((step, f"{how} {where}; loads as the container runs it{rest}"))
    for path, result in sorted(model.results.items()):
        if result is not None and native.results.get(path, "") is None:
            out.append((path, f"fails {where}: {result if isinstance(result, str) else result[1]}"))
    return out
