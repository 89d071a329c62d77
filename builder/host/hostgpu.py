"""The host as nvidia-smi shows it (``HostGPU``), whichever form it was read from (builder/host/nvsmi.py)."""

from __future__ import annotations

from dataclasses import dataclass

from builder.host import gpus as gpu_table
from builder.log import printable


class SmiParseError(ValueError):
    pass


@dataclass(frozen=True)
class HostGPU:
    driver: tuple[int, ...] | None  # None: no driver reachable (no GPU, or driver not loaded)
    cuda: str | None  # the highest CUDA the driver supports, as nvidia-smi reports it
    gpus: tuple[str, ...]
    note: str = ""
    platform: str = "linux"  # "linux", "windows" (a WDDM/TCC/MCDM driver) or "wsl" (Linux tools, Windows driver)
    form: str = ""  # which nvidia-smi output was read: table, query (-q), xml (-q -x), version, csv
    fault: str | None = None  # a broken host (nvsmi.FAULTS, or "unknown-error"), with the driver unknown
    nvml: str | None = None  # the user-space NVML library version a mismatch message names
    mig_devices: int = 0  # MIG devices the table's "MIG devices" section lists
    caps: tuple[str | None, ...] = ()  # each GPU's compute_cap, when the capture carries it
    archs: tuple[str | None, ...] = ()  # each GPU's `-q` Product Architecture, when shown
    driver_models: tuple[str, ...] = ()  # Windows driver models shown (WDDM, TCC, MCDM), one per GPU
    vgpu: str | None = None  # "manager" (a hypervisor's vGPU manager driver), "guest" (a VM's vGPU) or None
    fault_line: str | None = None  # the failure line as printed (control characters escaped)
    missing: str | None = None  # nvidia-smi output that names no driver (-L, a CSV of unknown columns): what to capture
    version_text: str = ""  # the driver version as printed (a Jetson's 540.4.0 is not 540.04.00)
    smi_version: str | None = None  # the table header's NVIDIA-SMI version, when shown
    header_notes: tuple[str, ...] = ()  # what the capture's header says that does not add up
    unread: str = ""  # why some GPU rows of the table were not read (a row cut off); "" when all were
    cuda_unusable: bool = False  # the header says "CUDA Version: N/A" (or ERR!): libcuda is not usable

    @property
    def branch(self) -> str:
        return f"r{self.driver[0]}" if self.driver else "none"

    @property
    def driver_text(self) -> str:
        if not self.driver:
            return "none"
        return self.version_text or fmt_version(self.driver)

    @property
    def infos(self) -> tuple[gpu_table.GpuInfo, ...]:
        """Each GPU from the table, its capture's compute_cap and its Product Architecture."""
        return tuple(
            gpu_table.identify(
                name,
                self.caps[i] if i < len(self.caps) else None,
                self.archs[i] if i < len(self.archs) else None,
            )
            for i, name in enumerate(self.gpus)
        )

    @property
    def data_center(self) -> bool:
        return bool(self.gpus) and all(g.klass == gpu_table.DC for g in self.infos)

    @property
    def forward_capable(self) -> bool:
        """Forward compatibility to CUDA 13 (cuda-compat): every GPU a data-center GPU CUDA 13 supports
        (not assessed on vGPU)."""
        return self.vgpu is None and self.data_center and all(g.cuda13 is True for g in self.infos)

    @property
    def unsure_gpus(self) -> tuple[str, ...]:
        """GPU names nvidia-smi cut so far that their class cannot be told (each once)."""
        return tuple(dict.fromkeys(g.name for g in self.infos if g.cut and g.klass == gpu_table.UNKNOWN))

    @property
    def grace(self) -> bool:
        """A Grace GPU (GH200, GB200, GB300, GB10): the host's CPU is aarch64."""
        return any(g.grace for g in self.infos)

    @property
    def tegra(self) -> bool:
        """A Jetson's integrated GPU (Orin, Xavier, Thor): an aarch64 L4T host whose driver is JetPack's."""
        return any(g.tegra for g in self.infos)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def fmt_version(v: tuple[int, ...]) -> str:
    return ".".join(f"{p:02d}" if i else str(p) for i, p in enumerate(v))


def escape(line: str, limit: int = 300) -> str:
    """A line from a capture, safe to print: control characters (a terminal escape, a carriage
    return) shown as \\xNN, cut at ``limit`` characters."""
    shown = printable(line.strip(), field=True)
    return shown if len(shown) <= limit else shown[:limit] + "..."
