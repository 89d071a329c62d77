#!/usr/bin/env python3
"""Where one smoke-roots run's time goes, step by step (docs/smoke.md, "Where the arm64 roots'
time goes"): a script, not a timed test.

    sudo nice -n 19 .venv/bin/python benchmarks/rootsprof.py [--arch arm64] [--dpkgopt OPT ...]

Runs the mmdebstrap command smokeroots builds (both roots of one architecture), plus --verbose and
any --dpkgopt given (to weigh a cut), in a temp dir, from a copy of the machine's download cache
(the shared one is only read). Each output line is stamped with the wall clock and the CPU counter
of a cgroup of its own holding only the run (cgroup v2, or v1's cpuacct), and each line's CPU and
wall are charged to the step or package the last marker line named (`Unpacking X`, `Setting up X`,
`Processing triggers for X`, mmdebstrap's `I:` phases). Prints CPU and wall per phase and the
packages above --min seconds of CPU. Needs root (mmdebstrap --mode=root, the cgroup).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from builder.fsutil import cache_dir  # noqa: E402  (after sys.path: run as a script from the checkout)
from builder.smoke import smoke, smokeroots  # noqa: E402

_MARKER = re.compile(r"(Unpacking|Setting up|Processing triggers for) (\S+?)(?::\w+)? \(")
_KINDS = {"Unpacking": "unpack", "Setting up": "configure", "Processing triggers for": "trigger"}

Key = tuple[str, str, str]  # (mmdebstrap phase, kind, package or "")


def charge(stamped: Iterable[tuple[float, float, str]]) -> dict[Key, list[float]]:
    """(phase, kind, package) -> [cpu, wall]: each stamped line (wall s, cpu s, text) is charged
    the time until the next line to what the last marker named; a phase line starts a new phase
    (kind "phase" until a package line)."""
    rows = list(stamped)
    out: dict[Key, list[float]] = defaultdict(lambda: [0.0, 0.0])
    phase, kind, name = "start", "phase", ""
    for (wall, cpu, text), (next_wall, next_cpu, _) in zip(rows, rows[1:], strict=False):  # the last line has no next
        if text.startswith("I: "):
            phase, kind, name = text[3:].split("...")[0].strip(), "phase", ""
        elif m := _MARKER.match(text):
            kind, name = _KINDS[m.group(1)], m.group(2)
        elif text.startswith("Preparing to unpack "):
            # the preinst runs between this line and "Unpacking"; apt numbers its files (".../12-x_1_all.deb")
            kind, name = "unpack", re.sub(r"^\d+-", "", text.split()[3].rsplit("/", 1)[-1]).split("_")[0]
        out[(phase, kind, name)][0] += next_cpu - cpu
        out[(phase, kind, name)][1] += next_wall - wall
    return dict(out)


class CpuCounter:
    """A cgroup of our own and its CPU counter in seconds (cgroup v2 or v1's cpuacct); on leaving
    the ``with``, what still runs in it is killed (a run cut short by Ctrl-C or an error) and the
    cgroup removed: a cgroup with processes in it cannot be."""

    def __init__(self, name: str) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        self.dir = Path("/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/cpuacct") / name
        self.dir.mkdir()
        self._v2 = v2
        self._procs = self.dir / ("cgroup.procs" if v2 else "tasks")

    def __enter__(self) -> CpuCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        # The run's mounts live in its own mount namespace (smokeroots' unshare): they go with it.
        for _ in range(300):  # killed processes leave the cgroup at once; a fork may race the kill
            pids = [int(p) for p in self._procs.read_text().split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        self.dir.rmdir()

    def seconds(self) -> float:
        if self._v2:
            stat = dict(line.split() for line in (self.dir / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int((self.dir / "cpuacct.usage").read_text()) / 1e9

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` moved into the cgroup before it starts (its children follow)."""
        return ["sh", "-c", f'echo $$ > {self._procs} && exec "$@"', "sh", *cmd]


def command(arch: str, dpkgopts: list[str], tmp: Path, debs: Path) -> list[str]:
    """smokeroots' mmdebstrap command for both roots of ``arch`` under ``tmp``, with --verbose and
    ``dpkgopts`` added: what smoke-init runs, nothing else changed."""
    (_, runtime_pkgs), (_, devel_pkgs) = smoke.BASES["runtime"], smoke.BASES["devel"]
    extra = [p for p in devel_pkgs if p not in runtime_pkgs]
    runtime, devel = tmp / "runtime" / "rootfs", tmp / "devel" / "rootfs"
    cmd = smokeroots._command(arch, runtime, devel, runtime_pkgs, extra, debs)
    at = cmd.index("mmdebstrap") + 1
    return [*cmd[:at], "--verbose", *(f"--dpkgopt={o}" for o in dpkgopts), *cmd[at:]]


def run(arch: str, dpkgopts: list[str], tmp: Path) -> tuple[list[tuple[float, float, str]], int]:
    debs, shared = tmp / "debs", cache_dir() / "mmdebstrap" / arch
    if not shared.is_dir():  # the profile is of the packages' work, not of a download
        sys.exit(f"no {arch} download cache at {shared}: run `build smoke-init` first, as the same user")
    shutil.copytree(shared, debs)  # a copy: the shared cache is only read
    for role in ("runtime", "devel"):
        (tmp / role).mkdir()
    with CpuCounter(f"k3-rootsprof-{os.getpid()}") as counter:
        return stamp(command(arch, dpkgopts, tmp, debs), counter)


def stamp(cmd: list[str], counter: CpuCounter) -> tuple[list[tuple[float, float, str]], int]:
    """``cmd`` run in ``counter``'s cgroup: each output line (stdout and stderr, undecodable bytes
    replaced) with the wall seconds since the start and the cgroup's CPU seconds as it came, then
    an "end" line; and the exit code."""
    stamped = []
    start = time.monotonic()
    proc = subprocess.Popen(
        counter.wrap(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        stamped.append((time.monotonic() - start, counter.seconds(), line.rstrip("\n")))
    code = proc.wait()
    stamped.append((time.monotonic() - start, counter.seconds(), "end"))
    return stamped, code


def report(charged: dict[Key, list[float]], least: float) -> None:
    phases: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (phase, _, _), (cpu, wall) in charged.items():
        phases[phase][0] += cpu
        phases[phase][1] += wall
    print(f"{'CPU s':>7} {'wall s':>7}  phase")
    for phase, (cpu, wall) in phases.items():
        print(f"{cpu:7.1f} {wall:7.1f}  {phase[:90]}")
    print(f"\n{'CPU s':>7} {'wall s':>7}  package steps with at least {least} s of CPU")
    for (phase, kind, name), (cpu, wall) in sorted(charged.items(), key=lambda kv: -kv[1][0]):
        if name and cpu >= least:
            print(f"{cpu:7.1f} {wall:7.1f}  {kind:9} {name}  ({phase[:40]})")
    print(f"\ntotal: {sum(c for c, _ in charged.values()):.1f} s CPU, {sum(w for _, w in charged.values()):.1f} s wall")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="arm64", help="Debian architecture (default arm64, under QEMU on x86)")
    ap.add_argument("--dpkgopt", action="append", default=[], help="an extra dpkg option to weigh (repeatable)")
    ap.add_argument("--min", type=float, default=1.0, help="list package steps with at least this CPU (s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="k3-rootsprof-") as tmp:
        stamped, code = run(args.arch, args.dpkgopt, Path(tmp))
    if code != 0:
        print("\n".join(text for _, _, text in stamped[-20:]), file=sys.stderr)
        sys.exit(f"mmdebstrap failed (exit {code})")
    print(os.getloadavg(), "load average at the end")
    report(charge(stamped), args.min)


if __name__ == "__main__":
    main()
