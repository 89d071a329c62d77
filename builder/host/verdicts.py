"""doctor's verdicts: the host (its kind, CPU, GPUs, driver) against what the image really carries
(builder/host/imagefacts.py). One verdict per host, the first blocker in ``ORDER``; everything else it
found is a note. docs/r575.md lists every verdict and what it tells the operator to do.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from builder.config import contract
from builder.host import compat
from builder.host.gpus import CUDA13_MIN_CC
from builder.host.hostgpu import HostGPU, version_tuple
from builder.host.imagefacts import ImageFacts, arch_name

# verdict -> exit code (0: the image runs here; 1: it does not, or not yet). Exit 2 (bad input) is
# only for a capture with no nvidia-smi output; 3 for an engine or registry out of reach.
EXIT = {
    "broken-host": 1,
    "no-driver": 1,
    "container-no-runtime": 1,
    "vgpu-manager": 1,
    "windows-tcc": 1,
    "cpu-mismatch": 1,
    "gpu-none": 1,
    "gpu-partial": 1,
    "driver-unknown": 1,
    "driver-too-old": 1,
    "driver-below-floor": 1,
    "gpu-unknown": 1,
    "compatible-ptx-jit": 0,
    "compatible": 0,
}
ORDER = tuple(EXIT)  # the first that applies is the verdict
_CAPTURE = "capture `nvidia-smi` (or `nvidia-smi -q`) on the host and run doctor on it"
_ASK_CC = "capture `nvidia-smi --query-gpu=name,compute_cap --format=csv` and run doctor on it"


@dataclass(frozen=True)
class Outcome:
    name: str
    reason: str
    route: str
    save: str = ""

    @property
    def compatible(self) -> bool:
        return EXIT[self.name] == 0


def host_kind(host: HostGPU, in_container: bool) -> str:
    if host.driver is None and in_container and not host.fault:
        return "container-no-runtime"
    if host.vgpu == "manager":
        return "vgpu-manager"
    if host.platform == "windows":
        return "windows-tcc" if "TCC" in host.driver_models else "windows"
    if host.platform == "wsl":
        return "wsl"
    return "linux-vgpu-guest" if host.vgpu == "guest" else "linux"


def gpu_findings(host: HostGPU, facts: ImageFacts) -> list[dict]:
    """Each GPU: name, compute capability, class, where the capability came from, and the image's
    coverage of it (sass, ptx-jit-only, partial, none, unknown; None when the image declares nothing)."""
    out = []
    for g in host.infos:
        statuses = {facts.status(cc) for cc in g.ccs}
        declared = facts.families is not None or bool(facts.coverage)
        coverage = None if not declared else statuses.pop() if len(statuses) == 1 else "unknown"
        out.append(
            {
                "name": g.name,
                "cc": g.cc or ("/".join(g.ccs) or None),
                "class": g.klass,
                "from": g.source,
                "coverage": coverage,
            }
        )
    return out


def cpu_finding(host: HostGPU, facts: ImageFacts, machine: str | None, machine_from: str) -> dict:
    """The host's CPU architecture (uname, or implied by a Grace GPU) against the image's platforms."""
    arch, source = (arch_name(machine), machine_from) if machine else (None, "")
    if arch is None and host.grace:
        arch, source = "arm64", "a Grace GPU (GH200, GB200, GB300) is on an aarch64 host"
    image = sorted({p.split("/")[1] for p in facts.platforms if p.startswith("linux/")})
    return {
        "host": arch,
        "from": source,
        "image": list(facts.platforms),
        "match": (arch in image) if arch and image else None,
    }


def evaluate(cuda: str, host: HostGPU, facts: ImageFacts, cpu: dict, found: list[dict], kind: str) -> Outcome:
    if host.missing:  # nvidia-smi output without a driver version: what the GPUs and CPU tell, then what to capture
        blocker = _blocked(cuda, host, cpu, kind) or _gpu_blocker(found, facts)
        return blocker or Outcome("driver-unknown", f"image needs CUDA {cuda}; {host.missing}", _CAPTURE)
    verdict = compat.decide(cuda, host)
    if host.fault:
        return Outcome("broken-host", verdict.reason, verdict.route, verdict.save)
    if host.driver is None:
        if kind == "container-no-runtime":
            return Outcome(
                "container-no-runtime",
                f"image needs CUDA {cuda}; this is a container without the NVIDIA GPU runtime (no nvidia-smi)",
                "run the container with `--gpus all` (or `--runtime=nvidia`, or the CDI device nvidia.com/gpu=all) "
                "on a host where nvidia-container-toolkit is configured; then run doctor in it again",
            )
        return Outcome("no-driver", verdict.reason, verdict.route)
    blocked = _blocked(cuda, host, cpu, kind)
    if blocked:
        return blocked
    gpu = _gpu_blocker(found, facts)
    if gpu:
        return gpu
    if not verdict.compatible:
        return Outcome("driver-too-old", verdict.reason, verdict.route)
    floor = _below_floor(host, facts)
    if floor:
        return floor
    unknown = [f["name"] for f in found if f["coverage"] == "unknown"]
    if unknown:
        return Outcome(
            "gpu-unknown",
            f"the compute capability of {', '.join(dict.fromkeys(unknown))} is unknown to this tool, so its "
            "coverage by the image cannot be told",
            _ASK_CC,
        )
    jit = [f for f in found if f["coverage"] == "ptx-jit-only"]
    if jit:
        return Outcome(
            "compatible-ptx-jit",
            f"{verdict.reason}; the image carries only PTX for {_names(jit)}: the driver JIT-compiles it",
            "run the image; its first start JIT-compiles the PTX (minutes): keep the CUDA cache on a volume "
            "(CUDA_CACHE_PATH)",
        )
    return Outcome("compatible", verdict.reason, verdict.route)


def _blocked(cuda: str, host: HostGPU, cpu: dict, kind: str) -> Outcome | None:
    if kind == "vgpu-manager":
        return Outcome(
            "vgpu-manager",
            f"image needs CUDA {cuda}; {host.driver_text} is a vGPU manager (hypervisor) driver: it reports "
            "'CUDA Version: Not Found' and runs no CUDA itself",
            "give a virtual machine a vGPU (a C-series compute profile) or the whole GPU by passthrough, with the "
            "matching guest driver, and run the image and doctor inside that VM",
        )
    if kind == "windows-tcc":
        return Outcome(
            "windows-tcc",
            f"image needs CUDA {cuda}; the GPU runs in TCC mode, which serves native Windows CUDA only: WSL2 and "
            "Docker Desktop, where this Linux image runs on Windows, cannot use it (public reports: "
            "microsoft/WSL#11865)",
            "switch the GPU to WDDM where the board allows it (`nvidia-smi -i <index> -dm 0` as administrator, then "
            "reboot) and run doctor inside WSL2, or run the image on a Linux host",
        )
    if cpu["match"] is False:
        return Outcome(
            "cpu-mismatch",
            f"the host's CPU is {cpu['host']} ({cpu['from']}); the image is built for {', '.join(cpu['image'])} only",
            f"run an image built for linux/{cpu['host']} (a matrix target for that platform); this one cannot start "
            "here whatever the driver",
        )
    return None


def _names(found: list[dict]) -> str:
    shown = [f"{f['name']} (cc {f['cc'] or '?'})" for f in found]
    return ", ".join(f"{n} x {s}" if (n := shown.count(s)) > 1 else s for s in dict.fromkeys(shown))


def _gpu_blocker(found: list[dict], facts: ImageFacts) -> Outcome | None:
    missing = [f for f in found if f["coverage"] in ("none", "partial")]
    if not missing:
        return None
    serves = " ".join(facts.families or sorted(cc for cc, s in facts.coverage.items() if s != "none")) or "nothing"
    where = f"the image serves compute capability {serves} (label gpu-families)"
    kinds = "no code" if all(f["coverage"] == "none" for f in missing) else "no or partial code"
    reason = f"the image has {kinds} for {_names(missing)}; {where}"
    old = [f for f in missing if f["cc"] and "/" not in f["cc"] and version_tuple(f["cc"]) < CUDA13_MIN_CC]
    build = f"an image with code for compute capability {' '.join(sorted({f['cc'] or '?' for f in missing}))}"
    tail = " (CUDA 13 dropped Volta and older: only a CUDA 12 build can serve them)" if old else ""
    if len(missing) == len(found):
        return Outcome("gpu-none", reason, f"run {build}: a target whose gpu.families lists it{tail}")
    covered = [str(i) for i, f in enumerate(found) if f not in missing]
    return Outcome(
        "gpu-partial",
        reason + f"; covered: GPU {', '.join(covered)}",
        f"restrict the image to the covered GPUs (CUDA_VISIBLE_DEVICES={','.join(covered)}), or run {build} "
        f"for the others{tail}",
    )


def _below_floor(host: HostGPU, facts: ImageFacts) -> Outcome | None:
    if not facts.floor or host.platform != "linux" or host.driver is None:
        return None
    floor = version_tuple(facts.floor)
    if host.driver >= floor:
        return None
    return Outcome(
        "driver-below-floor",
        f"the image's GPU code needs driver >= {facts.floor} (label driver-floor: the newest PTX ISA and toolkit "
        f"of its binaries, proven by the gpu_code check); host has {host.driver_text} ({host.branch}). "
        "Minor-version compatibility does not cover this: an older driver refuses newer PTX (K3 JIT-compiles "
        "ISA 8.8 PTX on Hopper)",
        f"upgrade the driver to >= {facts.floor} (r{floor[0]}) or to r580+",
    )


def notes(host: HostGPU, facts: ImageFacts, cpu: dict, kind: str) -> list[str]:
    out = [host.note] if host.note and host.driver is not None else []
    if host.mig_devices:
        out.append(f"MIG is on: {host.mig_devices} MIG devices; each runs the image with its GPU's driver")
    if host.unsure_gpus and host.driver is not None:
        out.append(
            f"nvidia-smi cut the GPU name {', '.join(host.unsure_gpus)}: its class (data-center or not) "
            "is unknown; `nvidia-smi -q` or `nvidia-smi -L` prints the full name"
        )
    if kind == "linux-vgpu-guest":
        out.append("a vGPU guest: CUDA needs a compute-capable vGPU profile; forward compatibility is not assessed")
    if kind == "windows":
        out.append(
            "a Windows driver (WDDM): this Linux image runs on it through WSL2; a capture taken on Windows itself "
            "says nothing of WSL2: run doctor inside WSL2"
        )
    if host.driver is not None and not host.gpus and (facts.families is not None or facts.coverage):
        out.append(
            "this nvidia-smi output names no GPU: the image's GPU coverage is not checked (capture `nvidia-smi`)"
        )
    if not cpu["host"] and cpu["image"]:
        out.append(
            f"the host's CPU architecture is unknown (give --evidence ARCHIVE: its uname says it); the image is "
            f"{', '.join(cpu['image'])}"
        )
    if facts.floor and host.platform != "linux" and host.driver is not None:
        out.append(f"the driver floor {facts.floor} is a Linux driver version; a Windows driver is not compared")
    if cpu["host"] and cpu["match"] is None and not cpu["image"]:
        out.append(f"host CPU {cpu['host']}; the image's platform is unknown, so it is not compared")
    return out + list(facts.notes)


def expiry(labels: dict[str, str], today: dt.date) -> str | None:
    keys = contract.keys_in(labels)
    raw = labels.get(keys.expires)
    if raw is None:
        return None
    try:
        expires = dt.date.fromisoformat(raw)
    except ValueError:
        return f"expiry label {keys.expires}={raw!r} is not a date"
    owner = labels.get(keys.owner, "its owner")
    if expires < today:
        return f"EXPIRED on {raw}: this bridge build is past its exit date; ask {owner}"
    return f"expires {raw} ({(expires - today).days} days left; owner {owner})"


def host_facts(host: HostGPU, smi_source: str) -> dict:
    return {
        "host_driver": host.driver_text,
        "host_branch": host.branch,
        "host_cuda": host.cuda,
        "gpus": list(host.gpus),
        "data_center": host.data_center,
        "nvidia_smi": smi_source,
        "nvidia_smi_form": host.form,
        "platform": host.platform,
        "fault": host.fault,
        "nvml_library": host.nvml,
        "mig_devices": host.mig_devices,
    }


def image_facts(facts: ImageFacts) -> dict:
    return {"driver_floor": facts.floor, "gpu_families": list(facts.families) if facts.families is not None else None}
