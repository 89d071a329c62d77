"""Can this image start on this host? Driver/CUDA compatibility, as NVIDIA documents it.

Sources: the CUDA release notes' "Toolkit Driver Version" table (minimum Linux driver per CUDA
release) and NVIDIA's "CUDA Compatibility" guide (minor-version compatibility within a major;
forward compatibility through the cuda-compat package, data-center GPUs only). The numbers below
are copied from that table (docs/r575.md, `build doctor`); a release not listed falls back to its family minimum
with minor-version compatibility, which is what the guide promises. The same table lists Windows minimums; none
could be confirmed from this project's sources, so a Windows/WSL driver is judged by the CUDA version it reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from builder.host.gpus import gpu_class
from builder.host.hostgpu import HostGPU, SmiParseError
from builder.host.hostgpu import fmt_version as _fmt
from builder.host.nvsmi import FAULTS, parse_smi

__all__ = ["FAULTS", "HostGPU", "SmiParseError", "gpu_class", "parse_smi"]

# (major, minor, update) -> minimum driver for full compatibility (release notes, Linux x86_64)
MIN_DRIVER = {
    (12, 9, 0): (575, 51, 3),  # CUDA 12.9 GA
    (12, 9, 1): (575, 57, 8),  # CUDA 12.9 Update 1
    (13, 0, 0): (580, 65, 6),  # CUDA 13.0 GA
    (13, 0, 1): (580, 82, 7),  # CUDA 13.0 Update 1
    (13, 0, 2): (580, 95, 5),  # CUDA 13.0 Update 2
}
# Minor-version compatibility: any 12.x runs (limited features: no newer PTX JIT) on a driver of
# the 12 family; 13.x needs the 13 family. The family minimum is its .0 GA driver.
FAMILY_MIN = {12: (525, 60, 13), 13: (580, 65, 6)}
# Forward compatibility (a newer CUDA major on an older driver through cuda-compat-X-Y) is only
# supported on data-center GPUs, and only on GPUs the newer CUDA supports (builder/host/gpus.py).


def implied_cuda(driver: tuple[int, ...]) -> str | None:
    """The newest CUDA release of the table a Linux driver fully supports ("12.9" for 575.51.03);
    None below the table. A header reporting a lower "CUDA Version" does not add up."""
    fits = [cuda for cuda, floor in MIN_DRIVER.items() if floor <= driver]
    return ".".join(map(str, max(fits)[:2])) if fits else None


def parse_cuda(text: str) -> tuple[int, int, int]:
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        raise ValueError(f"not a CUDA version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def image_cuda(labels: dict[str, str], env: dict[str, str], label_key: str) -> tuple[str, str] | None:
    """(CUDA version, where it was read) from the image's label, CUDA_VERSION or NVIDIA_REQUIRE_CUDA."""
    if labels.get(label_key):
        return labels[label_key], f"label {label_key}"
    if env.get("CUDA_VERSION"):
        return env["CUDA_VERSION"], "env CUDA_VERSION"
    m = re.search(r"cuda>=(\d+\.\d+(?:\.\d+)?)", env.get("NVIDIA_REQUIRE_CUDA", ""))
    if m:
        return m.group(1), "env NVIDIA_REQUIRE_CUDA"
    return None


class Route(Enum):
    """What the route tells the operator to do, as a value: the decision record and every other
    decision key on this, never on the route's wording."""

    RUN = "run the image"
    RUN_JIT = "run the image; its first start JIT-compiles PTX"
    USE_CU129 = "use the cu129 build on this CUDA 12 driver"
    UPGRADE_DRIVER = "upgrade the driver"
    REPAIR_HOST = "repair the host or install a driver"
    GPU_RUNTIME = "give the container the NVIDIA runtime"
    VGPU_GUEST = "run in a VM with a vGPU or passthrough"
    WDDM = "switch the GPU to WDDM or use a Linux host"
    OTHER_PLATFORM = "run an image built for the host's platform"
    JETSON = "run an image built for Jetson (L4T/JetPack)"
    OTHER_IMAGE = "run an image with code for these GPUs"
    SOME_GPUS = "restrict the image to the covered GPUs"
    CAPTURE = "capture more of the host and run doctor again"


@dataclass(frozen=True)
class DriverVerdict:
    """The driver's verdict on one CUDA version (the driver rules alone); verdicts.HostVerdict
    names the host's from it, and doctor.Diagnosis is what doctor prints and records."""

    compatible: bool
    reason: str
    route: str
    save: str = ""  # what to save before acting on the route (a broken host's evidence)
    kind: Route = Route.RUN  # what the route asks for, as a value


_INSTALL = "r575 for the cu129 build, r580 for the official CUDA 13 image"
# fault -> (the host's state, the route the field guides give, the evidence to save first)
BROKEN = {
    "nvml-mismatch": (
        "nvidia-smi cannot initialise NVML: the loaded NVIDIA kernel module and the user-space driver library "
        "differ{lib} (a driver upgraded or reinstalled without reloading the module)",
        "reboot the host, or stop every GPU process and reload the NVIDIA kernel modules (`rmmod nvidia_uvm "
        "nvidia_drm nvidia_modeset nvidia`, then `modprobe nvidia`); then run doctor again",
        "/proc/driver/nvidia/version (the loaded module's version), `lsmod` and the installed driver packages "
        "(`build evidence` saves the first two), `dmesg | grep -i nvrm`",
    ),
    "no-nvml-library": (
        "nvidia-smi finds no libnvidia-ml.so: no NVIDIA user-space driver is visible here",
        f"on a host, install the NVIDIA driver ({_INSTALL}); in a container, the container runtime did not mount "
        "the driver: run it with `--gpus all` (or `--runtime=nvidia`) where nvidia-container-toolkit is "
        "configured; then run doctor again",
        "`ldconfig -p | grep libnvidia-ml` on the host and in the container, `docker info` (its runtimes), the "
        "container's `docker inspect`",
    ),
    "no-driver": (
        "nvidia-smi couldn't communicate with the NVIDIA driver: the kernel module is not loaded",
        f"install a driver ({_INSTALL}) or load it (`modprobe nvidia`; after a kernel update rebuild it for the "
        "new kernel), then run doctor again",
        "`lsmod` (nvidia modules), `uname -a` (a kernel without the module), `dmesg | grep -i nvrm`",
    ),
    "no-devices": (
        "the NVIDIA driver is loaded but reports no GPU",
        "make the GPU visible to this machine or container (`lspci | grep -i nvidia`; passthrough, device plugin "
        "or `--gpus`), then run doctor again",
        "`lspci -nn | grep -i nvidia`, `dmesg | grep -i nvrm`",
    ),
    "nvml-unknown-error": (
        "nvidia-smi cannot initialise NVML (Unknown Error): typically a container that lost its GPU devices when "
        "systemd re-applied its cgroup (`systemctl daemon-reload`, often by a package update; NVIDIA's notice "
        "NVIDIA/nvidia-docker#1730)",
        "recreate the container (it gets its devices back); for good, on the host create the /dev/char links "
        "runc needs (`nvidia-ctk system create-dev-char-symlinks --create-all`, as NVIDIA's notice says) or run "
        "Docker with the cgroupfs cgroup driver; on a bare host, reboot; then run doctor again",
        "the container's /sys/fs/cgroup/devices/devices.list (cgroup v1), `docker info` (cgroup driver and "
        "version), `journalctl -u docker | grep -i reload`",
    ),
    "insufficient-permissions": (
        "nvidia-smi may not open the GPU devices (Insufficient Permissions)",
        "give this user or container access to /dev/nvidia* (`ls -l /dev/nvidia*`: the device group; SELinux: "
        "`setsebool -P container_use_devices 1`; rootless Podman: the CDI devices, `--device nvidia.com/gpu=all`), "
        "or run as root to confirm; then run doctor again",
        "`ls -l /dev/nvidia*`, `id`, `getenforce`, the container runtime's configuration",
    ),
    "wsl-blocked": (
        "Windows does not give this WSL2 distribution the GPU (GPU access blocked by the operating system)",
        "in Windows: put the GPU in WDDM mode (a GPU in TCC/MCDM mode is not shared with WSL2, as public reports "
        "on Windows Server show: microsoft/WSL#11865), update the Windows NVIDIA driver and WSL (`wsl --update`), "
        "and install no Linux NVIDIA driver inside WSL; then run doctor again inside WSL",
        "`nvidia-smi` and `nvidia-smi -q` run in Windows (the driver model), `wsl --version`",
    ),
    "device-handle": (
        "the driver lists a GPU it cannot reach ({line}): a GPU that fell off the bus, overheated or failed "
        "(Unknown Error), or one the driver does not own (Not Found)",
        "find the GPU in `dmesg` (Xid 79 'fell off the bus', NVRM errors): reset it (`nvidia-smi -r -i <bus id>`) "
        "or reboot; if it recurs, reseat or replace it (cooling, power); until then run on the other GPUs "
        "(CUDA_VISIBLE_DEVICES); then run doctor again",
        "`dmesg | grep -iE 'nvrm|xid'`, `lspci -nn | grep -i nvidia`, `nvidia-smi -L` (the GPUs still reachable)",
    ),
    "unknown-error": (
        "nvidia-smi printed an error this tool does not know: {line}",
        "look the message up with NVIDIA's or your provider's support before changing launch flags; then run "
        "doctor again",
        "the full nvidia-smi output, `dmesg | grep -i nvrm`, `build evidence`",
    ),
    "failed": (
        "nvidia-smi failed",
        f"install or repair the driver ({_INSTALL}), then run doctor again",
        "the full nvidia-smi output, `dmesg | grep -i nvrm`",
    ),
}
# NVIDIA's release notes publish Windows minimums in the same table; none could be confirmed from
# this project's sources, so a Windows/WSL driver is judged by the CUDA version it reports itself.
WINDOWS_TABLE = (
    "NVIDIA publishes separate Windows minimums per CUDA release (release notes, 'CUDA Toolkit and "
    "Corresponding Driver Versions'); this tool carries none it could confirm"
)


def decide(cuda: str, host: HostGPU) -> DriverVerdict:
    major, minor, update = parse_cuda(cuda)
    if host.fault:
        state, route, save = BROKEN[host.fault]
        lib = f" (user-space NVML library {host.nvml})" if host.nvml else ""
        state = state.format(lib=lib, line=host.fault_line or "")
        return DriverVerdict(
            False,
            f"image needs CUDA {cuda} but this host has no usable NVIDIA driver: {state}",
            route,
            save,
            Route.REPAIR_HOST,
        )
    if host.driver is None:
        return DriverVerdict(
            False,
            f"image needs CUDA {cuda} but this host has no usable NVIDIA driver ({host.note})",
            f"install a driver ({_INSTALL}), then run doctor again",
            kind=Route.REPAIR_HOST,
        )
    if host.platform != "linux":
        return _windows(cuda, (major, minor), host)
    return _linux(cuda, (major, minor, update), host, host.driver)


def _windows(cuda: str, need: tuple[int, int], host: HostGPU) -> DriverVerdict:
    where = "a WSL host's Windows driver" if host.platform == "wsl" else "a Windows driver"
    have = parse_cuda(host.cuda)[:2] if host.cuda else None
    if have and have >= need:
        return DriverVerdict(
            True,
            f"CUDA {cuda}: {host.driver_text} is {where} that reports CUDA up to {host.cuda} ({WINDOWS_TABLE})",
            "run the image as it is",
        )
    says = f"reports CUDA up to {host.cuda}" if have else "reports no CUDA version"
    reason = (
        f"CUDA {cuda}: {host.driver_text} is {where} that {says}; minor-version compatibility would need the "
        f"Windows family minimum, not confirmed here ({WINDOWS_TABLE})"
    )
    if need[0] >= 13 and have and have[0] == 12:
        kind, route = (
            Route.USE_CU129,
            (
                "use the cu129 build (this project) on this CUDA 12 driver, or upgrade the Windows driver to one "
                "that reports CUDA 13"
            ),
        )
    else:
        kind, route = (
            Route.UPGRADE_DRIVER,
            (
                f"upgrade the Windows driver to one that reports CUDA {need[0]}.{need[1]} or newer (NVIDIA's table "
                "gives the minimum)"
            ),
        )
    tail = "; forward compatibility (cuda-compat) is not assessed for this driver"
    return DriverVerdict(False, reason, route + tail, kind=kind)


def _linux(cuda: str, version: tuple[int, int, int], host: HostGPU, drv: tuple[int, ...]) -> DriverVerdict:
    """``drv``: the host's driver version (``host.driver``, known to be there)."""
    major, minor, update = version
    full = MIN_DRIVER.get(version) or MIN_DRIVER.get((major, minor, 0))
    family = FAMILY_MIN.get(major)
    if full and drv >= full:
        return DriverVerdict(
            True,
            f"CUDA {cuda} needs driver >= {_fmt(full)}; host has {host.driver_text} ({host.branch})",
            "run the image as it is",
        )
    if full is None and host.cuda and parse_cuda(host.cuda)[:2] >= (major, minor):
        # No table entry: nvidia-smi's "CUDA Version" is the newest CUDA the driver fully supports.
        return DriverVerdict(
            True,
            f"CUDA {cuda}: host driver {host.driver_text} ({host.branch}) supports CUDA up to {host.cuda}",
            "run the image as it is",
        )
    if family and drv >= family:
        need = f" (full support from {_fmt(full)})" if full else ""
        return DriverVerdict(
            True,
            f"CUDA {cuda} runs on driver {host.driver_text} ({host.branch}) through minor-version "
            f"compatibility within CUDA {major}.x (family minimum {_fmt(family)}){need}; "
            "features that need a newer driver (PTX JIT of newer code) are unavailable",
            "run the image; upgrade the driver within the branch for full support",
        )
    wanted = full or family
    reason = (
        f"CUDA {cuda} needs driver >= {_fmt(wanted)} (branch r{wanted[0]})"
        if wanted
        else f"CUDA {cuda} is not in the compatibility table"
    ) + f"; host has {host.driver_text} ({host.branch})"
    if major >= 13 and FAMILY_MIN[12] <= drv < FAMILY_MIN[13]:
        return DriverVerdict(
            False,
            reason,
            f"use the cu129 build (this project) on this CUDA 12 driver ({host.branch}), "
            "or upgrade the driver to r580+; " + _forward(host),
            kind=Route.USE_CU129,
        )
    if major >= 13 and drv < FAMILY_MIN[12]:
        return DriverVerdict(
            False,
            reason,
            f"upgrade the driver to r580+ (even the cu129 build needs a CUDA 12 driver, >= {_fmt(FAMILY_MIN[12])})",
            kind=Route.UPGRADE_DRIVER,
        )
    route = f"upgrade the driver to at least {_fmt(wanted)}" if wanted else "upgrade the driver"
    return DriverVerdict(False, reason, route, kind=Route.UPGRADE_DRIVER)


def _forward(host: HostGPU) -> str:
    if host.forward_capable:
        return (
            "forward compatibility (cuda-compat-13-0) is possible on these data-center GPUs in an isolated environment"
        )
    if host.unsure_gpus:
        return (
            f"forward compatibility needs data-center GPUs, and nvidia-smi cut the name of "
            f"{', '.join(host.unsure_gpus)}: capture `nvidia-smi -q` or `nvidia-smi -L` for the full name"
        )
    old = [g.describe() for g in host.infos if g.cuda13 is not True]
    if host.data_center and old:
        return (
            "forward compatibility is not available: CUDA 13 supports compute capability 7.5 and up (it dropped "
            f"Volta and older), and this host has {', '.join(dict.fromkeys(old))}"
        )
    return "forward compatibility is not available on these GPUs (data-center GPUs only)"
