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
# supported on data-center GPUs.
DATA_CENTER = re.compile(
    r"\b(A100|A800|A30|A40|A10G?|A16|A2|H100|H800|H200|H20|GH200|B100|B200|GB200|B300|GB300|"
    r"L40S?|L4|L20|T4|V100)\b"
)


class SmiParseError(ValueError):
    pass


# A broken host prints one of these instead of a table. Each is a diagnosis with a route (exit 1),
# not bad input: (fault, pattern). Order matters: the mismatch message is the most specific.
FAULTS = (
    ("nvml-mismatch", re.compile(r"Failed to initialize NVML: Driver/library version mismatch", re.I)),
    ("no-nvml-library", re.compile(r"couldn't find libnvidia-ml\.so", re.I)),
    ("no-driver", re.compile(r"couldn't communicate with the NVIDIA driver", re.I)),
    ("no-devices", re.compile(r"^\s*No devices were found", re.I | re.M)),
    ("failed", re.compile(r"NVIDIA-SMI has failed", re.I)),
)
_VER = r"(\d+\.\d+(?:\.\d+)?)"
# Driver models of a Windows driver (WDDM, TCC, MCDM): the table row, the header, -q and the CSV say it.
_WINDOWS_MODEL = re.compile(r"\b(WDDM|TCC|MCDM)\b")


@dataclass(frozen=True)
class HostGPU:
    driver: tuple[int, ...] | None  # None: no driver reachable (no GPU, or driver not loaded)
    cuda: str | None  # the highest CUDA the driver supports, as nvidia-smi reports it
    gpus: tuple[str, ...]
    note: str = ""
    platform: str = "linux"  # "linux", "windows" (a WDDM/TCC/MCDM driver) or "wsl" (Linux tools, Windows driver)
    form: str = ""  # which nvidia-smi output was read: table, query (-q), version (--version), csv
    fault: str | None = None  # a broken host (FAULTS), with the driver unknown
    nvml: str | None = None  # the user-space NVML library version a mismatch message names
    mig_devices: int = 0  # MIG devices the table's "MIG devices" section lists

    @property
    def branch(self) -> str:
        return f"r{self.driver[0]}" if self.driver else "none"

    @property
    def driver_text(self) -> str:
        return _fmt(self.driver) if self.driver else "none"

    @property
    def data_center(self) -> bool:
        return bool(self.gpus) and all(gpu_class(g) == "data-center" for g in self.gpus)

    @property
    def unsure_gpus(self) -> tuple[str, ...]:
        """GPU names nvidia-smi truncated so far that their class cannot be told (each once)."""
        return tuple(dict.fromkeys(g for g in self.gpus if gpu_class(g) == "unknown"))


def gpu_class(name: str) -> str:
    """ "data-center", "consumer" or "unknown". nvidia-smi's table cuts long names ("NVIDIA GeForce RTX
    2080 ...", "NVIDIA A100-PCI..."): the word the cut runs into is dropped, never guessed from."""
    whole = re.sub(r"[A-Za-z0-9]*\.\.\.\s*$", "", name)
    if re.search(r"\b(GeForce|TITAN|Quadro|RTX)\b", whole):
        return "consumer"
    if DATA_CENTER.search(whole):
        return "data-center"
    return "unknown" if whole != name else "consumer"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def parse_smi(text: str) -> HostGPU:
    """Read any nvidia-smi output doctor knows (docs/r575.md): the table (R610's `KMD
    Version`/`CUDA UMD Version` header too), `-q`, `--version`, a `--query-gpu ... --format=csv` with its
    header, and the messages of a broken host. Windows captures: a byte-order mark and CRLF are fine."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    for fault, pattern in FAULTS:
        if pattern.search(text):
            nvml = re.search(r"NVML library version:\s*" + _VER, text)
            return HostGPU(
                None,
                None,
                (),
                note="nvidia-smi reports no usable driver or GPU",
                fault=fault,
                nvml=nvml.group(1) if nvml else None,
            )
    csv_host = _parse_csv(text)
    if csv_host is not None:
        return csv_host
    driver = _driver_version(text)
    if driver is None:
        listed = re.findall(r"^GPU \d+: (.+?) \(UUID: GPU-", text, re.M)
        if listed:
            migs = len(re.findall(r"^\s+MIG .+Device\s+\d+: \(UUID: MIG-", text, re.M))
            raise SmiParseError(
                f"`nvidia-smi -L` output ({len(listed)} GPUs, {migs} MIG devices) names no driver "
                "version; capture `nvidia-smi` or `nvidia-smi -q` instead"
            )
        raise SmiParseError(
            "no 'Driver Version' or 'KMD Version' in the nvidia-smi output; capture `nvidia-smi`, "
            "`nvidia-smi -q` or `nvidia-smi --version`"
        )
    version, form = driver
    cuda, cuda_note = _cuda_version(text)
    names = tuple(n.strip() for n in re.findall(r"^\s*Product Name\s*:\s*(.+)$", text, re.M)) or _table_gpus(text)
    mig = len(re.findall(r"^\|\s+\d+\s+\d+\s+\d+\s+\d+\s+\|", _section(text, "MIG devices:"), re.M))
    return HostGPU(
        _version(version), cuda, names, note=cuda_note, platform=_platform(text, version), form=form, mig_devices=mig
    )


def _driver_version(text: str) -> tuple[str, str] | None:
    """(version, form). R610+ names the kernel driver `KMD Version` and deprecates `Driver Version`
    (whose line then says "Deprecated, see ..." or carries a "[Deprecated ...]" note): KMD first."""
    for label in ("KMD Version", "Driver Version"):
        m = re.search(label + r"\s*:\s*" + _VER, text, re.I)
        if m:
            line = text[: m.start()].rsplit("\n", 1)[-1]  # the table's header line names NVIDIA-SMI too
            form = (
                "version"
                if re.search(r"NVIDIA-SMI version\s*:", text)
                else "table"
                if "NVIDIA-SMI" in line
                else "query"
            )
            return m.group(1), form
    return None


def _cuda_version(text: str) -> tuple[str | None, str]:
    """(the driver's CUDA version, a note when it reports none). `CUDA UMD Version` first (R610+)."""
    for label in ("CUDA UMD Version", "CUDA Version"):
        m = re.search(label + r"\s*:\s*(\d+\.\d+|N/A|ERR!)", text, re.I)
        if m and m.group(1)[0].isdigit():
            return m.group(1), ""
        if m:
            return None, (
                f"the driver reports 'CUDA Version: {m.group(1)}': its CUDA library (libcuda) is not "
                "usable here (not installed, or not mounted into this container)"
            )
    return None, ""


def _section(text: str, heading: str) -> str:
    """The table section under ``heading`` ("MIG devices:", "Processes:"), up to the next blank line."""
    at = text.find(heading)
    if at < 0:
        return ""
    end = text.find("\n\n", at)
    return text[at : end if end >= 0 else len(text)]


def _table_gpus(text: str) -> tuple[str, ...]:
    """GPU names from the table's GPU rows (above its "MIG devices" and "Processes" sections): the
    name sits between the index and the Persistence-M (On/Off) or Windows driver-model column."""
    cut = min((i for i in (text.find("MIG devices:"), text.find("Processes:")) if i >= 0), default=len(text))
    rows = re.findall(r"^\|\s+\d+\s+(\S[^|]*?)\s+(?:On|Off|WDDM|TCC|MCDM)\s+\|", text[:cut], re.M)
    return tuple(r.strip() for r in rows)


def _platform(text: str, driver: str) -> str:
    """Windows: a Windows driver model is named. WSL: the Linux nvidia-smi reports a Windows driver, a
    two-part version other than its own (555.52.01 / 555.99); a two-part version alone is not Windows
    (Linux has 595.80, with nvidia-smi 595.80)."""
    smi = re.search(r"NVIDIA-SMI(?: version)?\s*:?\s*" + _VER, text, re.I)
    wsl = smi is not None and driver.count(".") == 1 and smi.group(1) != driver
    if wsl:
        return "wsl"
    model = re.search(r"Driver Model\s*\n\s*Current\s*:\s*(\S+)", text)
    header = re.search(r"Driver-Model|TCC/WDDM", text)
    rows = _WINDOWS_MODEL.search(" ".join(re.findall(r"^\|\s+\d+\s+.*?\|", text, re.M)))
    return "windows" if header or rows or (model and _WINDOWS_MODEL.match(model.group(1))) else "linux"


def _parse_csv(text: str) -> HostGPU | None:
    """`--query-gpu=... --format=csv`: the header names the columns (exporters capture ~240, with
    driver_version anywhere). Without a header only the two-column `driver_version,name` form is read."""
    import csv

    lines = [line for line in text.splitlines() if line.strip()]
    head = next((i for i, line in enumerate(lines) if re.search(r"(^|,)\s*driver_version\s*(,|$)", line)), None)
    if head is None:
        rows = [m for line in lines if (m := re.fullmatch(r"\s*(\d{3}\.\d+(?:\.\d+)?)\s*,\s*([^,]+?)\s*", line))]
        if lines and len(rows) == len(lines):
            return HostGPU(_version(rows[0].group(1)), None, tuple(r.group(2) for r in rows), form="csv")
        if lines and all(line.count(",") >= 2 for line in lines):
            raise SmiParseError(
                "a --query-gpu CSV without its header (`--format=csv,noheader`) has no column names; "
                "capture it with `--format=csv` (header kept), or capture "
                "`nvidia-smi --query-gpu=driver_version,name --format=csv,noheader`"
            )
        return None
    table = list(csv.DictReader(lines[head:], skipinitialspace=True))
    versions = [v for row in table if (v := _csv_driver(row))]
    if not table or len(versions) != len(table):
        raise SmiParseError("the --query-gpu CSV has a driver_version column but a row without a version")
    names = tuple((row.get("name") or row.get("gpu_name") or "").strip() for row in table)
    models = " ".join(row.get("driver_model.current") or "" for row in table)
    return HostGPU(
        _version(versions[0]),
        None,
        tuple(n for n in names if n),
        form="csv",
        platform="windows" if _WINDOWS_MODEL.search(models) else "linux",
    )


def _csv_driver(row: dict) -> str | None:
    """kmd_version (R610+) when it holds a version, else driver_version."""
    for column in ("kmd_version", "driver_version"):
        value = (row.get(column) or "").strip()
        if re.fullmatch(_VER, value):
            return value
    return None


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
    save: str = ""  # what to save before acting on the route (a broken host's evidence)


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


def decide(cuda: str, host: HostGPU) -> Verdict:
    major, minor, update = parse_cuda(cuda)
    if host.fault:
        state, route, save = BROKEN[host.fault]
        state = state.format(lib=f" (user-space NVML library {host.nvml})" if host.nvml else "")
        return Verdict(
            False, f"image needs CUDA {cuda} but this host has no usable NVIDIA driver: {state}", route, save
        )
    if host.driver is None:
        return Verdict(
            False,
            f"image needs CUDA {cuda} but this host has no usable NVIDIA driver ({host.note})",
            f"install a driver ({_INSTALL}), then run doctor again",
        )
    if host.platform != "linux":
        return _windows(cuda, (major, minor), host)
    return _linux(cuda, (major, minor, update), host, host.driver)


def _windows(cuda: str, need: tuple[int, int], host: HostGPU) -> Verdict:
    where = "a WSL host's Windows driver" if host.platform == "wsl" else "a Windows driver"
    have = parse_cuda(host.cuda)[:2] if host.cuda else None
    if have and have >= need:
        return Verdict(
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
        route = (
            "use the cu129 build (this project) on this CUDA 12 driver, or upgrade the Windows driver to one "
            "that reports CUDA 13"
        )
    else:
        route = (
            f"upgrade the Windows driver to one that reports CUDA {need[0]}.{need[1]} or newer (NVIDIA's table "
            "gives the minimum)"
        )
    return Verdict(False, reason, route + "; forward compatibility (cuda-compat) is not assessed for this driver")


def _linux(cuda: str, version: tuple[int, int, int], host: HostGPU, drv: tuple[int, ...]) -> Verdict:
    """``drv``: the host's driver version (``host.driver``, known to be there)."""
    major, minor, update = version
    full = MIN_DRIVER.get(version) or MIN_DRIVER.get((major, minor, 0))
    family = FAMILY_MIN.get(major)
    if full and drv >= full:
        return Verdict(
            True,
            f"CUDA {cuda} needs driver >= {_fmt(full)}; host has {host.driver_text} ({host.branch})",
            "run the image as it is",
        )
    if full is None and host.cuda and parse_cuda(host.cuda)[:2] >= (major, minor):
        # No table entry: nvidia-smi's "CUDA Version" is the newest CUDA the driver fully supports.
        return Verdict(
            True,
            f"CUDA {cuda}: host driver {host.driver_text} ({host.branch}) supports CUDA up to {host.cuda}",
            "run the image as it is",
        )
    if family and drv >= family:
        need = f" (full support from {_fmt(full)})" if full else ""
        return Verdict(
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
        return Verdict(
            False,
            reason,
            f"use the cu129 build (this project) on this CUDA 12 driver ({host.branch}), "
            "or upgrade the driver to r580+; " + _forward(host),
        )
    if major >= 13 and drv < FAMILY_MIN[12]:
        return Verdict(
            False,
            reason,
            f"upgrade the driver to r580+ (even the cu129 build needs a CUDA 12 driver, >= {_fmt(FAMILY_MIN[12])})",
        )
    return Verdict(False, reason, f"upgrade the driver to at least {_fmt(wanted)}" if wanted else "upgrade the driver")


def _forward(host: HostGPU) -> str:
    if host.data_center:
        return (
            "forward compatibility (cuda-compat-13-0) is possible on these data-center GPUs in an isolated environment"
        )
    if host.unsure_gpus:
        return (
            f"forward compatibility needs data-center GPUs, and nvidia-smi cut the name of "
            f"{', '.join(host.unsure_gpus)}: capture `nvidia-smi -q` or `nvidia-smi -L` for the full name"
        )
    return "forward compatibility is not available on these GPUs (data-center GPUs only)"
