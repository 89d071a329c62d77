"""benchmarks/rootsprof.py: the profile of a smoke-roots run charges each line's time to the step
its output names, and runs the command smoke-init runs."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from builder.smoke import smoke, smokeroots

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "rootsprof.py"
_SPEC = importlib.util.spec_from_file_location("rootsprof", _PATH)
assert _SPEC and _SPEC.loader
rootsprof = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(rootsprof)

# (wall s, CPU s, line), shaped as mmdebstrap --verbose prints them (from a real arm64 run).
_LOG = [
    (0.0, 0.0, "I: installing remaining packages inside the chroot..."),
    (1.0, 0.5, "Selecting previously unselected package ca-certificates."),
    (1.5, 0.6, "Preparing to unpack .../22-ca-certificates_20230311+deb12u1_all.deb ..."),
    (2.0, 0.9, "Unpacking ca-certificates (20230311+deb12u1) ..."),
    (3.0, 1.4, "Setting up libc6:arm64 (2.36-9+deb12u14) ..."),
    (4.0, 2.0, "Setting up ca-certificates (20230311+deb12u1) ..."),
    (10.0, 6.0, "Updating certificates in /etc/ssl/certs..."),
    (20.0, 13.0, "142 added, 0 removed; done."),
    (21.0, 13.5, "Processing triggers for ca-certificates (20230311+deb12u1) ..."),
    (30.0, 18.5, "I: running --customize-hook in shell: sh -c 'cp -ax ...'"),
    (31.0, 19.0, "end"),
]


def test_each_lines_time_goes_to_the_step_the_last_marker_named():
    charged = rootsprof.charge(_LOG)
    phase = "installing remaining packages inside the chroot"
    assert charged[(phase, "phase", "")] == pytest.approx([0.6, 1.5])  # apt's own lines before the first package
    assert charged[(phase, "unpack", "ca-certificates")] == pytest.approx([0.8, 1.5])  # its preinst and unpacking
    assert charged[(phase, "configure", "libc6")] == pytest.approx([0.6, 1.0])  # the architecture suffix dropped
    assert charged[(phase, "configure", "ca-certificates")] == pytest.approx([11.5, 17.0])  # its script's own lines too
    assert charged[(phase, "trigger", "ca-certificates")] == pytest.approx([5.0, 9.0])
    assert charged[("running --customize-hook in shell: sh -c 'cp -ax", "phase", "")] == pytest.approx([0.5, 1.0])
    assert sum(c for c, _ in charged.values()) == pytest.approx(19.0)  # every second charged once


def test_the_profiled_command_is_smoke_inits_with_verbose_and_the_options_weighed(tmp_path):
    debs = tmp_path / "debs"
    cmd = rootsprof.command("arm64", ["path-exclude=/usr/share/man/*"], tmp_path, debs)
    (_, runtime_pkgs), (_, devel_pkgs) = smoke.BASES["runtime"], smoke.BASES["devel"]
    made = smokeroots._command(
        "arm64",
        tmp_path / "runtime" / "rootfs",
        tmp_path / "devel" / "rootfs",
        runtime_pkgs,
        [p for p in devel_pkgs if p not in runtime_pkgs],
        debs,
    )
    at = made.index("mmdebstrap") + 1
    assert cmd[at : at + 2] == ["--verbose", "--dpkgopt=path-exclude=/usr/share/man/*"]
    assert cmd[:at] + cmd[at + 2 :] == made


_V2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/sys/fs/cgroup" if _V2 else "/sys/fs/cgroup/cpuacct", os.W_OK),
    reason="a cgroup of its own needs root and a writable cgroup tree",
)


@_ROOT
def test_each_output_line_is_stamped_with_the_cgroups_cpu_even_undecodable_ones():
    with rootsprof.CpuCounter(f"k3-rootsprof-test-{os.getpid()}") as counter:
        stamped, code = rootsprof.stamp(["sh", "-c", r"printf 'one\n\377two\n'; exit 3"], counter)
    assert code == 3
    assert [text for _, _, text in stamped] == ["one", "\ufffdtwo", "end"]
    assert [cpu for _, cpu, _ in stamped] == sorted(cpu for _, cpu, _ in stamped)


@_ROOT
def test_a_run_cut_short_leaves_no_process_and_no_cgroup_behind():
    with pytest.raises(KeyboardInterrupt):
        with rootsprof.CpuCounter(f"k3-rootsprof-test-{os.getpid()}") as counter:
            proc = subprocess.Popen(counter.wrap(["sh", "-c", "sleep 60 & exec sleep 60"]))
            for _ in range(1000):  # until the shell has moved itself in and forked
                if len((counter.dir / "cgroup.procs").read_text().split()) == 2:
                    break
                time.sleep(0.01)
            raise KeyboardInterrupt  # Ctrl-C while mmdebstrap runs
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert not counter.dir.exists()


def test_without_a_download_cache_it_says_so_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SystemExit, match=r"no arm64 download cache at .*/cache/mmdebstrap/arm64"):
        rootsprof.run("arm64", [], tmp_path / "work")
    assert not (tmp_path / "work").exists()
