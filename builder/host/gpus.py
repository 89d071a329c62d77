"""The GPU table: the names nvidia-smi prints -> compute capability and class, in one place.

Sources: NVIDIA's "CUDA GPUs" list (developer.nvidia.com/cuda-gpus: the compute capability of each
product) and the CUDA C++ Programming Guide's table of compute capabilities; the names are spelled
as nvidia-smi prints them in the captures under tests/fixtures/nvidia-smi (SOURCES.md names each).
Neither NVIDIA page is reachable from this project's machines, so the table was not re-checked here:
where a name is missing or wrong, `nvidia-smi --query-gpu=name,compute_cap --format=csv` (modern
drivers) prints the capability itself, and a capture's ``compute_cap`` always wins over this table.

Class: "data-center" (forward compatibility through cuda-compat is for data-center GPUs only,
NVIDIA's "CUDA Compatibility" guide), "consumer" (GeForce, TITAN, Quadro and RTX workstation parts,
laptops included), "integrated" (a Jetson's Tegra GPU: its driver comes with JetPack/L4T, and a
server arm64 (SBSA) image does not run on it) or "unknown". CUDA 13 dropped Volta (sm_70) and
older, so forward compatibility to CUDA 13 is offered only from compute capability 7.5 up.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

DC, CONSUMER, IGPU, UNKNOWN = "data-center", "consumer", "integrated", "unknown"
CUDA13_MIN_CC = (7, 5)  # CUDA 13 dropped Volta (7.0) and older

# (name as nvidia-smi prints it, without a leading "NVIDIA " or "Tesla "; compute capability; class).
# A printed name matches an entry when it is the entry or the entry followed by a space or a dash
# ("H100 80GB HBM3", "A100-SXM4-40GB", "GeForce RTX 4090 Laptop GPU"); the longest entry wins.
_ROWS: tuple[tuple[str, str, str], ...] = (
    # Kepler, Maxwell, Pascal: older than anything this project's images serve
    *((n, "3.7", DC) for n in ("K80",)),
    *((n, "3.5", DC) for n in ("K40c", "K40m", "K20Xm")),
    *((n, "5.2", DC) for n in ("M40", "M60", "M4", "M6")),
    ("M10", "5.0", DC),
    *((f"GeForce GTX {n}", "5.2", CONSUMER) for n in ("950", "960", "970", "980")),
    ("P100", "6.0", DC),
    ("Quadro GP100", "6.0", CONSUMER),
    *((n, "6.1", DC) for n in ("P40", "P4", "P6")),
    *((f"GeForce GTX {n}", "6.1", CONSUMER) for n in ("1050", "1060", "1070", "1080")),
    *((n, "6.1", CONSUMER) for n in ("TITAN Xp", "TITAN X (Pascal)")),
    *((f"Quadro P{n}", "6.1", CONSUMER) for n in ("400", "600", "620", "1000", "2000", "2200", "4000", "5000", "6000")),
    # Volta (7.0): Tesla V100 / V100S and the vGPU guest names V100D, V100DX, V100L, V100X
    *((n, "7.0", DC) for n in ("V100", "V100S", "V100D", "V100DX", "V100L", "V100X")),
    *((n, "7.0", CONSUMER) for n in ("TITAN V", "Quadro GV100")),
    # Turing (7.5)
    *((n, "7.5", DC) for n in ("T4", "T4G")),
    *((f"GeForce RTX {n}", "7.5", CONSUMER) for n in ("2060", "2070", "2080")),
    *((f"GeForce GTX {n}", "7.5", CONSUMER) for n in ("1630", "1650", "1660")),
    *((f"Quadro RTX {n}", "7.5", CONSUMER) for n in ("3000", "4000", "5000", "6000", "8000")),
    *((n, "7.5", CONSUMER) for n in ("TITAN RTX", "T400", "T500", "T550", "T600", "T1000", "T1200", "T2000")),
    # Ampere (8.0 data-center, 8.6 the rest)
    *((n, "8.0", DC) for n in ("A100", "A100X", "A800", "A30")),
    *((n, "8.6", DC) for n in ("A10", "A10G", "A10M", "A16", "A2", "A40")),
    *((f"GeForce RTX {n}", "8.6", CONSUMER) for n in ("3050", "3060", "3070", "3080", "3090")),
    *((f"RTX A{n}", "8.6", CONSUMER) for n in ("500", "1000", "2000", "3000", "4000", "4500", "5000", "5500", "6000")),
    ("A1000", "8.6", CONSUMER),
    # Ada Lovelace (8.9)
    *((n, "8.9", DC) for n in ("L4", "L40", "L40S", "L40G", "L20", "L2")),
    *((f"GeForce RTX {n}", "8.9", CONSUMER) for n in ("4050", "4060", "4070", "4080", "4090")),
    *(
        (f"RTX {n} Ada Generation", "8.9", CONSUMER)
        for n in ("2000", "3500", "4000", "4000 SFF", "4500", "5000", "5880", "6000")
    ),
    # Hopper (9.0); GH200 is a Grace (aarch64) host
    *((n, "9.0", DC) for n in ("H100", "H100XM", "H100L", "H800", "H200", "H20", "GH200")),
    # Blackwell: B200/GB200 10.0, B300/GB300 10.3 (sm_103), GeForce and RTX PRO 12.0, GB10 12.1
    *((n, "10.0", DC) for n in ("B100", "B200", "GB200")),
    *((n, "10.3", DC) for n in ("B300", "GB300")),
    *((f"GeForce RTX {n}", "12.0", CONSUMER) for n in ("5050", "5060", "5070", "5080", "5090")),
    *((f"RTX PRO {n} Blackwell", "12.0", CONSUMER) for n in ("2000", "4000", "4500", "5000", "6000")),
    ("RTX PRO 6000 Blackwell Server Edition", "12.0", DC),
    ("GB10", "12.1", CONSUMER),
    # Jetson (integrated Tegra GPUs, as nvidia-smi on L4T prints them: "Orin (nvgpu)", "NVIDIA Thor").
    # Orin is 8.7 (sglang#3331's collect_env: "GPU 0: Orin ... Compute Capability: 8.7"); Thor is 11.0
    # under CUDA 13 (10.1 under CUDA 12.9's nvgpu driver: xformers#1278, flashinfer#3003, vllm#39233).
    *((n, "8.7", IGPU) for n in ("Orin", "Jetson AGX Orin", "Jetson Orin")),
    *((n, "7.2", IGPU) for n in ("Xavier", "Jetson AGX Xavier", "Jetson Xavier")),
    *((n, "11.0", IGPU) for n in ("Thor", "Jetson Thor", "Jetson AGX Thor")),
)
TABLE: dict[str, tuple[str, str]] = {name.lower(): (cc, klass) for name, cc, klass in _ROWS}
# `nvidia-smi -q` "Product Architecture" -> the capabilities it can be (one when unambiguous).
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "kepler": ("3.0", "3.5", "3.7"),
    "maxwell": ("5.0", "5.2", "5.3"),
    "pascal": ("6.0", "6.1", "6.2"),
    "volta": ("7.0", "7.2"),
    "turing": ("7.5",),
    "ampere": ("8.0", "8.6", "8.7"),
    "ada lovelace": ("8.9",),
    "hopper": ("9.0",),
    "blackwell": ("10.0", "10.3", "11.0", "12.0", "12.1"),
}
# Grace hosts: the GPU shares a module with an Arm CPU, so the host is aarch64.
GRACE = ("GH200", "GB200", "GB300", "GB10")
_PREFIX = re.compile(r"^(?:NVIDIA\s+|Tesla\s+|GRID\s+)+", re.I)
_BRAND_CONSUMER = re.compile(r"\b(GeForce|TITAN|Quadro|RTX)\b", re.I)
_BRAND_DC = re.compile(r"^\s*(?:NVIDIA\s+)?Tesla\b", re.I)
# A vGPU profile as a guest sees it: "GRID V100D-8C", "NVIDIA A100-40C", "NVIDIA H100XM-80C".
VGPU_PROFILE = re.compile(r"-\d+[ABCQ]\b")
_CC = re.compile(r"[1-9][0-9]?\.[0-9]")


@dataclass(frozen=True)
class GpuInfo:
    name: str  # as nvidia-smi printed it
    ccs: tuple[str, ...]  # the compute capabilities it can be: one when known, () when nothing is known
    klass: str  # DC, CONSUMER or UNKNOWN
    source: str  # "compute_cap", "table", "table (cut name)", "architecture", "unknown"

    @property
    def cc(self) -> str | None:
        return self.ccs[0] if len(self.ccs) == 1 else None

    @property
    def cut(self) -> bool:
        return _uncut(self.name) is not None

    @property
    def grace(self) -> bool:
        return _norm(self.name).split(" ")[0].split("-")[0].upper() in GRACE

    @property
    def tegra(self) -> bool:
        """A Jetson's integrated GPU (Orin, Xavier, Thor): an aarch64 L4T host."""
        return self.klass == IGPU

    @property
    def cuda13(self) -> bool | None:
        """Does CUDA 13 support it (compute capability 7.5 up)? None when its capability is unknown."""
        if not self.ccs:
            return None
        ok = {cc_tuple(cc) >= CUDA13_MIN_CC for cc in self.ccs}
        return ok.pop() if len(ok) == 1 else None

    def describe(self) -> str:
        cc = self.cc or ("/".join(self.ccs) if self.ccs else "?")
        return f"{self.name} (cc {cc}, {self.klass})"


def cc_tuple(cc: str) -> tuple[int, ...]:
    return tuple(int(p) for p in cc.split("."))


def _norm(name: str) -> str:
    return re.sub(r"\s+", " ", _PREFIX.sub("", name.strip()))


def _entries_for(name: str) -> tuple[list[tuple[str, str]], str]:
    """(matching table rows, how): a whole name matches its longest entry; a name nvidia-smi cut
    ("...") matches every entry it can be the start of."""
    whole = _norm(name).lower()
    if (cut := _uncut(name)) is not None:
        start = _norm(cut).lower()
        rows = [
            TABLE[k] for k in TABLE if k.startswith(start) or start.startswith(k + " ") or start.startswith(k + "-")
        ]
        return rows, "table (cut name)"
    keys = [k for k in TABLE if whole == k or whole.startswith(k + " ") or whole.startswith(k + "-")]
    return ([TABLE[max(keys, key=len)]] if keys else []), "table"


def _uncut(name: str) -> str | None:
    """A name nvidia-smi cut ("NVIDIA GeForce RTX 3090 ..."): what is left before the "...", or None.
    String operations, not a regex searched from every position (quadratic on a run of spaces)."""
    bare = name.rstrip()
    return bare[:-3].rstrip() if bare.endswith("...") else None


# Cached: a host's GPUs repeat one name, and doctor asks for each GPU's facts several times (an
# 18,000-GPU XML took 18 s scanning the table per question).
@functools.lru_cache(maxsize=4096)
def identify(name: str, compute_cap: str | None = None, architecture: str | None = None) -> GpuInfo:
    """What a GPU is, from its printed name, a capture's compute_cap (which wins) and its
    `-q` Product Architecture (used when the name alone does not tell)."""
    rows, how = _entries_for(name)
    classes = {klass for _, klass in rows}
    klass = classes.pop() if len(classes) == 1 else UNKNOWN
    if klass == UNKNOWN and not rows:
        bare = _uncut(name) or name
        klass = CONSUMER if _BRAND_CONSUMER.search(bare) else DC if _BRAND_DC.search(bare) else UNKNOWN
    ccs = tuple(sorted({cc for cc, _ in rows}, key=cc_tuple))
    if compute_cap and _CC.fullmatch(compute_cap.strip()):
        return GpuInfo(name, (compute_cap.strip(),), klass, "compute_cap")
    arch = ARCHITECTURES.get((architecture or "").strip().lower(), ())
    if arch and (len(ccs) != 1):
        narrowed = tuple(cc for cc in ccs if cc in arch) or arch
        return GpuInfo(name, narrowed, klass, "architecture")
    return GpuInfo(name, ccs, klass, how if ccs else "unknown")


def gpu_class(name: str) -> str:
    """DC, CONSUMER or UNKNOWN for a printed name (a cut name only when every reading agrees)."""
    return identify(name).klass
