"""What doctor knows of the host besides nvidia-smi: its CPU architecture (`uname -m` here, or the
`uname` a `build evidence` archive saved), whether it runs in a container, and the column list of a
headerless `--query-gpu` CSV (`--columns`); and ``host_platform``, the one place the host's
platform is decided (the index's platform and the build record doctor reads both follow it).
"""

from __future__ import annotations

import platform
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from builder.errors import ConfigError
from builder.host.hostgpu import HostGPU

MAX_MEMBER = 1 << 20  # an evidence file larger than this is not read
_MACHINE = re.compile(r"\b(x86_64|amd64|aarch64|arm64|ppc64le|s390x)\b")
# Files a container engine leaves in a container's root (Docker, Podman).
CONTAINER_MARKERS = (Path("/.dockerenv"), Path("/run/.containerenv"))


@dataclass(frozen=True)
class HostContext:
    machine: str | None = None  # the CPU architecture, as uname -m prints it
    machine_from: str = ""  # where it was read
    in_container: bool = False  # doctor runs inside a container (only asked when nvidia-smi is missing)
    columns: tuple[str, ...] | None = None  # a headerless CSV's columns (--columns)
    tegra: bool = False  # the uname names an L4T (Jetson) kernel ("-tegra")


_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}


def arch_name(machine: str) -> str | None:
    """x86_64/amd64 -> amd64, aarch64/arm64 -> arm64 (the OCI names), else None."""
    return _ARCH.get(machine.strip().lower())


def host_platform(ctx: HostContext, host: HostGPU) -> tuple[str | None, str]:
    """(the host's CPU architecture as an OCI name, where it was read), or (None, "") when unknown.

    The uname doctor was given (an evidence archive's, or this machine's when doctor runs
    nvidia-smi here itself: builder/host/hostctx.gather); else the GPU: a Grace part (GH200, GB200,
    GB300, GB10) or a Jetson's integrated GPU sits on an aarch64 CPU. Never the machine running the
    tool for a capture taken elsewhere."""
    if ctx.machine and arch_name(ctx.machine):
        return arch_name(ctx.machine), ctx.machine_from
    if host.grace:
        return "arm64", "a Grace GPU (GH200, GB200, GB300, GB10) is on an aarch64 host"
    if host.tegra or ctx.tegra:
        return "arm64", "a Jetson (integrated Tegra GPU, L4T) is an aarch64 host"
    return None, ""


def evidence_files(archive: Path) -> dict[str, str]:
    """The small text files of a `build evidence` archive, by base name (uname.txt, nvidia-smi.txt...)."""
    out: dict[str, str] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                if member.isreg() and member.size <= MAX_MEMBER:
                    data = tar.extractfile(member)
                    if data is not None:
                        out[Path(member.name).name] = data.read().decode("utf-8", "replace")
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise ConfigError(f"--evidence {archive}: not a readable `build evidence` archive ({exc})") from None
    return out


def machine_of(uname: str) -> str | None:
    """The machine field of `uname -m` or `uname -a` output."""
    found = _MACHINE.findall(uname)
    return found[-1] if found else None


def gather(
    smi_file: Path | None, archive: Path | None, columns: str | None, live_smi_missing: bool = False
) -> HostContext:
    """The host context: the archive's uname when one is given, else this machine's when doctor runs
    nvidia-smi itself (a captured file may come from another host)."""
    cols = tuple(c.strip() for c in columns.split(",") if c.strip()) if columns else None
    machine, source, tegra = None, "", False
    if archive is not None:
        files = evidence_files(archive)
        tegra = bool(re.search(r"-tegra\b", files.get("uname.txt", "")))
        for name in ("uname-m.txt", "uname.txt"):
            machine = machine_of(files.get(name, ""))
            if machine:
                source = f"{archive.name}: {name}"
                break
    if machine is None and smi_file is None:
        machine, source = platform.machine() or None, "uname -m of this machine"
    in_container = smi_file is None and live_smi_missing and any(p.exists() for p in CONTAINER_MARKERS)
    if smi_file is None and archive is None:
        tegra = "tegra" in platform.release()
    return HostContext(machine, source, in_container, cols, tegra)
