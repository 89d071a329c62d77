"""Reading any nvidia-smi output doctor knows (docs/r575.md): the table (R610's `KMD Version` /
`CUDA UMD Version` header too), `-q`, `-q -x` and `--query-gpu` CSVs (builder/host/smiforms.py),
`--version`, and the messages of a broken host. Windows captures: a byte-order mark and CRLF are fine.

A broken host prints a message instead of a table: each known message is a fault with its own route
(builder/host/compat.py ``BROKEN``); any other short error from nvidia-smi is the fault
"unknown-error", quoted. Only a capture with no nvidia-smi output at all is bad input.
"""

from __future__ import annotations

import re

from builder.host import smiforms
from builder.host.hostgpu import HostGPU, SmiParseError, escape, version_tuple

# (fault, pattern). Order matters: the most specific message first.
FAULTS = (
    ("nvml-mismatch", re.compile(r"Failed to initialize NVML: Driver/library version mismatch", re.I)),
    ("nvml-unknown-error", re.compile(r"Failed to initialize NVML: Unknown Error", re.I)),
    ("insufficient-permissions", re.compile(r"Failed to initialize NVML: Insufficient Permissions", re.I)),
    ("wsl-blocked", re.compile(r"GPU access blocked by the operating system", re.I)),
    (
        "device-handle",
        re.compile(
            r"Unable to (?:determine|detect) the device handle for GPU\s*+([0-9A-Fa-f:.]++)\s*+:?[ \t]*+(.*)", re.I
        ),
    ),
    ("no-nvml-library", re.compile(r"couldn't find libnvidia-ml\.so|libnvidia-ml\.so[.\d]*: cannot open shared", re.I)),
    (
        "no-driver",
        re.compile(r"couldn't communicate with the NVIDIA driver|Failed to initialize NVML: Driver Not Loaded", re.I),
    ),
    ("no-devices", re.compile(r"^[ \t]*+No devices were found", re.I | re.M)),
    ("failed", re.compile(r"NVIDIA-SMI has failed", re.I)),
)
_VER = r"(\d+\.\d+(?:\.\d+)?)"
_ERRORISH = re.compile(
    r"\b(fail\w*|unable|error|unknown|not found|not supported|insufficient|denied|blocked|lost|cannot|"
    r"can't|couldn't|invalid|timed out)\b",
    re.I,
)
# A shell's, not nvidia-smi's: nvidia-smi is not installed where the capture was taken.
_SHELL = re.compile(
    r"nvidia-smi.*(?:command not found|: not found|No such file or directory)|is not recognized as", re.I
)


# A pasted table's line prefix: a Markdown list's or code block's indentation, a quote's "> ".
_PASTE_INDENT = re.compile(r"^[ \t>]+(?=[|+])", re.M)
# One GPU row of the table: index, name, Persistence-M (On/Off/N/A) or the Windows driver model,
# then the Bus-Id cell (a PCI address, or N/A on a Jetson). Spaces only, never a line break, so a
# clean table is read row by row and a table whose line breaks a forum swallowed reads the same.
# The name is bounded (80 characters; the longest product name is under 40) and the space runs are
# possessive, so a long run of spaces is read in linear time, not retried at every length.
_GPU_ROW = re.compile(
    r"\|[ \t]*+\d+[ \t]++(\S[^|\n]{0,80}?)[ \t]++(?:On|Off|N/A|WDDM|TCC|MCDM)[ \t]*+\|[ \t]*+"
    r"(?:[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]|N/A)\b"
)
_SMI_VERSION = re.compile(r"NVIDIA-SMI(?: version)?\s*+:?\s*+" + _VER, re.I)
# Where a GPU row starts: `|`, its index, then a letter (the name). Counted against the rows read, so a
# row cut off partway (a capture that ends mid-row) is seen. Fan rows start with N/A or "30%", MIG and
# process rows with a second number; those sections are cut off before counting.
_ROW_START = re.compile(r"\|[ \t]*+(\d+)[ \t]++[A-Za-z]")
_TABLE_HEADER = re.compile(r"NVIDIA-SMI[ \t]++\d")
_ONE_HOST = "capture one host at a time (one nvidia-smi output per file)"
# Spaces a web page or word processor puts in a pasted table: no-break (U+00A0) and narrow no-break (U+202F).
_NBSP = str.maketrans({"\u00a0": " ", "\u202f": " "})


def parse_smi(text: str, columns: tuple[str, ...] | None = None) -> HostGPU:
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").translate(_NBSP)
    text = _PASTE_INDENT.sub("", text)
    for fault, pattern in FAULTS:
        m = pattern.search(text)
        if m:
            nvml = re.search(r"NVML library version:\s*" + _VER, text)
            line = text[text.rfind("\n", 0, m.start()) + 1 : (text.find("\n", m.end()) + 1 or len(text) + 1) - 1]
            return HostGPU(
                None,
                None,
                (),
                note="nvidia-smi reports no usable driver or GPU",
                fault=fault,
                nvml=nvml.group(1) if nvml else None,
                fault_line=escape(line),
            )
    if "<nvidia_smi_log" in text:
        return smiforms.parse_xml(text)
    csv_host = smiforms.parse_csv(text, columns)
    if csv_host is not None:
        return csv_host
    driver = _driver_version(text)
    if driver is None:
        return _no_driver_version(text)
    version, form = driver
    _one_host(text)
    cuda, cuda_note = _cuda_version(text)
    q_names = tuple(n.strip() for n in re.findall(r"^[ \t]*+Product Name[ \t]*+:[ \t]*+(.+)$", text, re.M))
    names, unread = (q_names, "") if q_names else _table_gpus(text)
    mig = len(
        re.findall(r"^\|[ \t]++\d++[ \t]++\d++[ \t]++\d++[ \t]++\d++[ \t]++\|", _section(text, "MIG devices:"), re.M)
    )
    smi = _SMI_VERSION.search(text)
    return HostGPU(
        version_tuple(version),
        cuda,
        names,
        note=" ".join(n for n in (cuda_note, _driver_na(text, smi)) if n),
        version_text=version,
        smi_version=smi.group(1) if smi else None,
        platform=_platform(text, version),
        form=form,
        mig_devices=mig,
        archs=tuple(a.strip() for a in re.findall(r"^[ \t]*+Product Architecture[ \t]*+:[ \t]*+(.+)$", text, re.M)),
        driver_models=_driver_models(text),
        vgpu=_vgpu(text, names),
        unread=unread,
        cuda_unusable=cuda is None and bool(cuda_note) and "Not Found" not in cuda_note,
    )


def _one_host(text: str) -> None:
    """Two captures pasted into one file (two tables, two drivers, GPU index 0 twice) cannot be
    judged as one host: refused, never read as the first driver with every GPU."""
    drivers = set(
        re.findall(r"^[ \t|]*+(?:NVIDIA-SMI[ \t]++\S++[ \t]++)?Driver Version[ \t]*+:[ \t]*+" + _VER, text, re.M)
    )
    kmds = set(re.findall(r"KMD Version[ \t]*+:[ \t]*+" + _VER, text))
    if len(drivers) > 1 or len(kmds) > 1:
        raise SmiParseError(f"more than one driver version ({', '.join(sorted(drivers | kmds))}); {_ONE_HOST}")
    if len(_TABLE_HEADER.findall(text)) > 1:
        raise SmiParseError(f"more than one nvidia-smi table header; {_ONE_HOST}")
    buses = re.findall(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f:.]+)[ \t]*$", text, re.M)
    if len(set(buses)) != len(buses):
        raise SmiParseError(f"a GPU ({', '.join(b for b in buses if buses.count(b) > 1)}) shown twice; {_ONE_HOST}")


def _no_driver_version(text: str) -> HostGPU:
    """No driver version: a short error nvidia-smi printed is a broken host; anything else is bad input."""
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    listed = re.findall(r"^GPU \d+: (.+?) \(UUID: [^)]*\)", text, re.M)
    if listed:
        migs = len(re.findall(r"^[ \t]++MIG .+Device[ \t]++\d++: \(UUID: MIG-", text, re.M))
        return HostGPU(
            None,
            None,
            tuple(listed),
            form="list",
            mig_devices=migs,
            missing=f"`nvidia-smi -L` output ({len(listed)} GPUs, {migs} MIG devices) names no driver "
            "version; capture `nvidia-smi` or `nvidia-smi -q` instead",
        )
    shell = next((line for line in lines if _SHELL.search(line) and "error while loading" not in line), None)
    if shell:
        raise SmiParseError(
            f"no nvidia-smi output: the capture holds the shell's {escape(shell, 120)!r}; nvidia-smi is not "
            "installed where it ran (in a container: the GPU runtime did not mount it, run it with `--gpus all`)"
        )
    errors = [line for line in lines if _ERRORISH.search(line) and "|" not in line]
    if errors and len(lines) <= 4:
        return HostGPU(
            None,
            None,
            (),
            note="nvidia-smi reports no usable driver or GPU",
            fault="unknown-error",
            fault_line=escape(errors[0]),
        )
    raise SmiParseError(
        "no 'Driver Version' or 'KMD Version' in the nvidia-smi output; capture `nvidia-smi`, "
        "`nvidia-smi -q` or `nvidia-smi --version`"
    )


def _driver_version(text: str) -> tuple[str, str] | None:
    """(version, form). R610+ names the kernel driver `KMD Version` and deprecates `Driver Version`
    (whose line then says "Deprecated, see ..." or carries a "[Deprecated ...]" note): KMD first."""
    for label in ("KMD Version", "Driver Version"):
        m = re.search(label + r"\s*:\s*" + _VER, text, re.I)
        smi = _SMI_VERSION.search(text) if m is None and label == "Driver Version" else None
        if smi is not None and _driver_na(text, smi):
            return smi.group(1), "table"
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


def _driver_na(text: str, smi: re.Match | None) -> str:
    """A table whose header says "Driver Version: N/A" (seen on Jetson L4T) but names its NVIDIA-SMI
    version: that version is read as the driver's, and the note says so."""
    if smi is None or not re.search(r"Driver Version\s*:\s*N/A", text, re.I):
        return ""
    return f"the header says 'Driver Version: N/A'; the NVIDIA-SMI version {smi.group(1)} is read as the driver's"


def _cuda_version(text: str) -> tuple[str | None, str]:
    """(the driver's CUDA version, a note when it reports none). `CUDA UMD Version` first (R610+)."""
    for label in ("CUDA UMD Version", "CUDA Version"):
        m = re.search(label + r"\s*:\s*(\d+\.\d+|N/A|ERR!|Not Found)", text, re.I)
        if m and m.group(1)[0].isdigit():
            return m.group(1), ""
        if m and m.group(1) == "Not Found":
            return None, "the driver reports 'CUDA Version: Not Found': a vGPU manager (hypervisor) driver runs no CUDA"
        if m:
            return None, (
                f"the driver reports 'CUDA Version: {m.group(1)}': its CUDA library (libcuda) is not "
                "usable here (not installed, or not mounted into this container)"
            )
    return None, ""


def _vgpu(text: str, names: tuple[str, ...]) -> str | None:
    """A vGPU manager (the hypervisor's driver: no CUDA) or a guest's vGPU, from -q or the names."""
    if re.search(
        r"CUDA (?:UMD )?Version\s*:\s*Not Found|vGPU Driver Capability|Virtualization Mode\s*:\s*Host VGPU", text, re.I
    ):
        return "manager"
    if re.search(r"Virtualization Mode\s*:\s*VGPU\b", text) or any(re.search(r"-\d+[ABCQ]\b", n) for n in names):
        return "guest"
    return None


def _driver_models(text: str) -> tuple[str, ...]:
    """The Windows driver model of each GPU: `-q`'s "Driver Model / Current", or the table rows."""
    current = re.findall(r"Driver Model[ \t]*+\n[ \t]*+Current[ \t]*+:[ \t]*+(\S+)", text)
    if current:
        return tuple(m for m in current if smiforms.WINDOWS_MODEL.fullmatch(m))
    rows = re.findall(r"^\|[ \t]++\d++[ \t]++[^|\n]*?\b(WDDM|TCC|MCDM)[ \t]*+\|", text, re.M)
    return tuple(rows)


def _section(text: str, heading: str) -> str:
    """The table section under ``heading`` ("MIG devices:", "Processes:"), up to the next blank line."""
    at = text.find(heading)
    if at < 0:
        return ""
    end = text.find("\n\n", at)
    return text[at : end if end >= 0 else len(text)]


def _table_gpus(text: str) -> tuple[tuple[str, ...], str]:
    """(GPU names, why some are unread or ""). Names come from the table's GPU rows (above its "MIG
    devices" and "Processes" sections), row by row or from a table whose line breaks were swallowed:
    each row is its index, the name, then the Persistence-M (or Windows driver-model) cell and the
    Bus-Id cell after it. A row that starts but is not read, or a table that ends inside a row (no
    closing border), leaves GPUs unread."""
    cut = min((i for i in (text.find("MIG devices:"), text.find("Processes:")) if i >= 0), default=len(text))
    names = tuple(m.group(1).strip() for m in _GPU_ROW.finditer(text[:cut]))
    starts = _ROW_START.findall(text[:cut])
    if len(set(starts)) != len(starts):
        raise SmiParseError(
            f"GPU index {', '.join(sorted(set(i for i in starts if starts.count(i) > 1)))} shown twice; {_ONE_HOST}"
        )
    if len(starts) > len(names):
        return names, f"{len(starts)} GPU rows start in the table but {len(names)} could be read (a row cut off?)"
    if starts and _open_table(text[:cut]):
        return names, "the table ends inside a GPU row (no closing border): the capture was cut off"
    return names, ""


def _open_table(section: str) -> bool:
    """The table's GPU section does not end on a border line (`+---+`): the capture stops inside a row.
    Only table lines count (a shell prompt after it does not); the start of the "| Processes:" line
    before the cut is left out."""
    lines = [line.strip() for line in section.split("\n") if line.lstrip()[:1] in ("|", "+")]
    tail = "\n".join(lines).rstrip(" \t\n|")
    return bool(tail) and tail[-1] not in "+-="


def _platform(text: str, driver: str) -> str:
    """Windows: a Windows driver model is named. WSL: the Linux nvidia-smi reports a Windows driver, a
    two-part version newer than its own (555.52.01 / 555.99); a two-part version alone is not Windows
    (Linux has 595.80, with nvidia-smi 595.80)."""
    smi = _SMI_VERSION.search(text)
    # WSL's nvidia-smi is a Linux build no newer than the Windows driver it reports (545.46 / 546.80);
    # an nvidia-smi newer than a two-part Linux driver (450.66 / 418.67) is a mismatched Linux host.
    if smi is not None and driver.count(".") == 1 and version_tuple(smi.group(1)) < version_tuple(driver):
        return "wsl"
    model = re.search(r"Driver Model[ \t]*+\n[ \t]*+Current[ \t]*+:[ \t]*+(\S+)", text)
    header = re.search(r"Driver-Model|TCC/WDDM", text)
    rows = smiforms.WINDOWS_MODEL.search(" ".join(re.findall(r"^\|[ \t]++\d++[ \t]++[^|\n]*+\|", text, re.M)))
    return "windows" if header or rows or (model and smiforms.WINDOWS_MODEL.match(model.group(1))) else "linux"
