"""Can this image start on this host? Driver/CUDA compatibility, as NVIDIA documents it.

Sources: the CUDA release notes' "Toolkit Driver Version" table (minimum Linux driver per CUDA
release) and NVIDIA's "CUDA Compatibility" guide (minor-version compatibility within a major;
forward compatibility through the cuda-compat package, data-center GPUs only). The numbers below
are copied from that table (README, "Driver and CUDA facts"); a release not listed falls back to its family minimum
with minor-version compatibility, which is what the guide promises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# (major, minor, update) -> minimum driver for full compatibility (release notes, Linux x86_64)
MIN_DRIVER = {
    (12, 9, 0): (575, 51, 3),   # CUDA 12.9 GA
    (12, 9, 1): (575, 57, 8),   # CUDA 12.9 Update 1
    (13, 0, 0): (580, 65, 6),   # CUDA 13.0 GA
    (13, 0, 1): (580, 82, 7),   # CUDA 13.0 Update 1
    (13, 0, 2): (580, 95, 5),   # CUDA 13.0 Update 2
}
# Minor-version compatibility: any 12.x runs (limited features: no newer PTX JIT) on a driver of
# the 12 family; 13.x needs the 13 family. The family minimum is its .0 GA driver.
FAMILY_MIN = {12: (525, 60, 13), 13: (580, 65, 6)}
# Forward compatibility (a newer CUDA major on an older driver through cuda-compat-X-Y) is only
# supported on data-center GPUs.
DATA_CENTER = re.compile(r"\b(A100|A800|A30|A40|A10G?|A16|A2|H100|H800|H200|H20|GH200|B100|B200|GB200|B300|GB300|"
                         r"L40S?|L4|L20|T4|V100)\b")


class SmiParseError(ValueError):
    pass


@dataclass(frozen=True)
class HostGPU:
    driver: tuple[int, ...] | None  # None: no driver reachable (no GPU, or driver not loaded)
    cuda: str | None  # the highest CUDA the driver supports, as nvidia-smi reports it
    gpus: tuple[str, ...]
    note: str = ""

    @property
    def branch(self) -> str:
        return f"r{self.driver[0]}" if self.driver else "none"

    @property
    def driver_text(self) -> str:
        return _fmt(self.driver) if self.driver else "none"

    @property
    def data_center(self) -> bool:
        return bool(self.gpus) and all(DATA_CENTER.search(g) for g in self.gpus)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def parse_smi(text: str) -> HostGPU:
    """Read `nvidia-smi`, `nvidia-smi -q` or `--query-gpu=driver_version,name --format=csv` output."""
    if re.search(r"couldn't communicate with the NVIDIA driver|No devices were found|NVIDIA-SMI has failed", text):
        return HostGPU(None, None, (), note="nvidia-smi reports no usable driver or GPU")
    driver = re.search(r"Driver Version\s*:?\s*(\d+\.\d+(?:\.\d+)?)", text)
    cuda = re.search(r"CUDA Version\s*:?\s*(\d+\.\d+)", text)
    names = re.findall(r"Product Name\s*:\s*(.+)", text)
    if not names:
        names = [m.strip() for m in re.findall(r"^\|\s+\d+\s+(NVIDIA [^|]*?)\s{2,}(?:On|Off)\s+\|", text, re.M)]
    if not driver:
        csv = re.findall(r"^\s*(\d{3}\.\d+(?:\.\d+)?)\s*,\s*(.+?)\s*$", text, re.M)
        if csv:
            return HostGPU(_version(csv[0][0]), None, tuple(n for _, n in csv))
        raise SmiParseError("no 'Driver Version' in the nvidia-smi output; capture `nvidia-smi` or `nvidia-smi -q`")
    return HostGPU(_version(driver.group(1)), cuda.group(1) if cuda else None, tuple(n.strip() for n in names))


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


def _fmt(v: tuple[int, ...]) -> str:
    return ".".join(f"{p:02d}" if i else str(p) for i, p in enumerate(v))


@dataclass(frozen=True)
class Verdict:
    compatible: bool
    reason: str
    route: str


def decide(cuda: str, host: HostGPU) -> Verdict:
    major, minor, update = parse_cuda(cuda)
    full = MIN_DRIVER.get((major, minor, update)) or MIN_DRIVER.get((major, minor, 0))
    family = FAMILY_MIN.get(major)
    if host.driver is None:
        return Verdict(False, f"image needs CUDA {cuda} but this host has no usable NVIDIA driver ({host.note})",
                       "install a driver (r575 for the cu129 build, r580 for the official CUDA 13 image), "
                       "then run doctor again")
    drv = host.driver
    if full and drv >= full:
        return Verdict(True, f"CUDA {cuda} needs driver >= {_fmt(full)}; host has {host.driver_text} ({host.branch})",
                       "run the image as it is")
    if full is None and host.cuda and parse_cuda(host.cuda)[:2] >= (major, minor):
        # No table entry: nvidia-smi's "CUDA Version" is the newest CUDA the driver fully supports.
        return Verdict(True, f"CUDA {cuda}: host driver {host.driver_text} ({host.branch}) supports CUDA up to "
                             f"{host.cuda}", "run the image as it is")
    if family and drv >= family:
        need = f" (full support from {_fmt(full)})" if full else ""
        return Verdict(True, f"CUDA {cuda} runs on driver {host.driver_text} ({host.branch}) through minor-version "
                             f"compatibility within CUDA {major}.x (family minimum {_fmt(family)}){need}; "
                             "features that need a newer driver (PTX JIT of newer code) are unavailable",
                       "run the image; upgrade the driver within the branch for full support")
    wanted = full or family
    reason = (f"CUDA {cuda} needs driver >= {_fmt(wanted)} (branch r{wanted[0]})" if wanted else
              f"CUDA {cuda} is not in the compatibility table") + f"; host has {host.driver_text} ({host.branch})"
    if major >= 13 and drv < FAMILY_MIN[13]:
        route = (f"use the cu129 build (this project) on this CUDA 12 driver ({host.branch}), "
                 "or upgrade the driver to r580+")
        if host.data_center:
            route += "; forward compatibility (cuda-compat-13-0) is possible on these data-center GPUs in an isolated environment"
        else:
            route += "; forward compatibility is not available on these GPUs (data-center GPUs only)"
        return Verdict(False, reason, route)
    return Verdict(False, reason, f"upgrade the driver to at least {_fmt(wanted)}" if wanted else "upgrade the driver")
