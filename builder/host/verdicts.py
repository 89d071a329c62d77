"""doctor's verdicts: the host (its kind, CPU, GPUs, driver) against what the image really carries
(builder/host/imagefacts.py). One verdict per host, the first blocker in ``ORDER``; everything else it
found is a note. docs/r575.md lists every verdict and what it tells the operator to do.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from builder.config import contract
from builder.host import compat
from builder.host.compat import Route
from builder.host.gpus import CUDA13_MIN_CC
from builder.host.hostctx import HostContext, host_platform
from builder.host.hostgpu import HostGPU, version_tuple
from builder.host.imagefacts import NONE, PARTIAL, ImageFacts
from builder.log import printable

# verdict -> exit code (0: the image runs here; 1: it does not, or not yet). Exit 2 (bad input) is
# only for a capture with no nvidia-smi output; 3 for an engine or registry out of reach.
EXIT = {
    "broken-host": 1,
    "no-driver": 1,
    "container-no-runtime": 1,
    "vgpu-manager": 1,
    "windows-tcc": 1,
    "jetson": 1,
    "cpu-mismatch": 1,
    "gpu-none": 1,
    "gpu-partial": 1,
    "driver-unknown": 1,
    "driver-too-old": 1,
    "driver-below-floor": 1,
    "cuda-unusable": 1,
    "gpu-unread": 1,
    "gpu-unknown": 1,
    "compatible-ptx-jit": 0,
    "compatible": 0,
}
ORDER = tuple(EXIT)  # the first that applies is the verdict
_CAPTURE = "capture `nvidia-smi` (or `nvidia-smi -q`) on the host and run doctor on it"
_ASK_CC = "capture `nvidia-smi --query-gpu=name,compute_cap --format=csv` and run doctor on it"
_ASK_GPUS = (
    "capture `nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv` (or `nvidia-smi -L`) on the "
    "host and run doctor on it; do not start the image until doctor has read every GPU"
)


@dataclass(frozen=True)
class HostVerdict:
    """The host's verdict for an image, named (``EXIT``'s keys): host kind, CPU, GPUs and the
    driver's verdict (compat.DriverVerdict) together; doctor.Diagnosis carries it to the user."""

    name: str
    reason: str
    route: str
    save: str = ""
    kind: Route = Route.RUN  # what the route asks for, as a value
    also: str = ""  # a driver verdict the GPU verdict came before (never hidden)

    @property
    def compatible(self) -> bool:
        return EXIT[self.name] == 0


def host_kind(host: HostGPU, in_container: bool, tegra: bool = False) -> str:
    if host.driver is None and in_container and not host.fault:
        return "container-no-runtime"
    if host.vgpu == "manager":
        return "vgpu-manager"
    if host.tegra or (tegra and host.platform == "linux"):
        return "jetson"
    if host.platform == "windows":
        return "windows-tcc" if "TCC" in host.driver_models else "windows"
    if host.platform == "wsl":
        return "wsl"
    return "linux-vgpu-guest" if host.vgpu == "guest" else "linux"


def gpu_findings(host: HostGPU, facts: ImageFacts) -> list[dict]:
    """Each GPU: name, compute capability, class, where the capability came from, the image's
    coverage of it (sass, ptx-jit-only, partial, none, unknown; None when the image declares nothing)
    and the required kernels without code for it (judged per kernel only with a build record)."""
    out = []
    for g in host.infos:
        judged = [facts.serves(cc) for cc in g.ccs]
        statuses = {j.status for j in judged}
        coverage = None if not facts.declared else statuses.pop() if len(statuses) == 1 else "unknown"
        out.append(
            {
                "name": g.name,
                "cc": g.cc or ("/".join(g.ccs) or None),
                "class": g.klass,
                "from": g.source,
                "coverage": coverage,
                "missing_kernels": sorted({k for j in judged for k in j.missing}),
                "per_kernel": bool(facts.kernels),
            }
        )
    return out


def cpu_finding(host: HostGPU, facts: ImageFacts, ctx: HostContext) -> dict:
    """The host's CPU architecture (builder/host/hostctx.py ``host_platform``) against the image's platforms."""
    arch, source = host_platform(ctx, host)
    image = sorted({p.split("/")[1] for p in facts.platforms if p.startswith("linux/")})
    return {
        "host": arch,
        "from": source,
        "image": list(facts.platforms),
        "match": (arch in image) if arch and image else None,
    }


def evaluate(cuda: str, host: HostGPU, facts: ImageFacts, cpu: dict, found: list[dict], kind: str) -> HostVerdict:
    if host.missing:  # nvidia-smi output without a driver version: what the GPUs and CPU tell, then what to capture
        blocker = _blocked(cuda, host, cpu, kind) or _gpu_blocker(found, facts)
        return blocker or HostVerdict(
            "driver-unknown", f"image needs CUDA {cuda}; {host.missing}", _CAPTURE, kind=Route.CAPTURE
        )
    verdict = compat.decide(cuda, host)
    if host.fault:
        return HostVerdict("broken-host", verdict.reason, verdict.route, verdict.save, verdict.kind)
    if host.driver is None:
        if kind == "container-no-runtime":
            return HostVerdict(
                "container-no-runtime",
                f"image needs CUDA {cuda}; this is a container without the NVIDIA GPU runtime (no nvidia-smi)",
                "run the container with `--gpus all` (or `--runtime=nvidia`, or the CDI device nvidia.com/gpu=all) "
                "on a host where nvidia-container-toolkit is configured; then run doctor in it again",
                kind=Route.GPU_RUNTIME,
            )
        return HostVerdict("no-driver", verdict.reason, verdict.route, kind=verdict.kind)
    blocked = _blocked(cuda, host, cpu, kind)
    if blocked:
        return blocked
    driver = _driver_blocker(verdict, host, facts)
    gpu = _gpu_blocker(found, facts)
    if gpu:  # the GPU verdict first; a driver that fails too is said with it, never hidden
        return replace(gpu, also=f"{driver.name}: {driver.reason}; route: {driver.route}") if driver else gpu
    if driver:
        return driver
    return _unusable(host) or _unread(host) or _gpu_known(found) or _compatible(verdict, found)


def _unusable(host: HostGPU) -> HostVerdict | None:
    """The driver is new enough but says "CUDA Version: N/A": its CUDA library (libcuda) is not
    usable where nvidia-smi ran, so nothing CUDA starts there (public report: shkhln/libc6-shim#14)."""
    if not host.cuda_unusable:
        return None
    return HostVerdict(
        "cuda-unusable",
        f"driver {host.driver_text} is new enough, but nvidia-smi reports 'CUDA Version: N/A': the driver's CUDA "
        "library (libcuda) is not usable where it ran (not installed, a mismatched user-space library, or not "
        "mounted into this container), so no CUDA program starts there",
        "repair the host's GPU runtime (install the driver's CUDA library, libcuda, matching the kernel driver; in "
        "a container run it with `--gpus all` on a host with nvidia-container-toolkit), or capture `nvidia-smi` "
        "where the runtime works, and run doctor again",
        kind=Route.REPAIR_HOST,
    )


def _unread(host: HostGPU) -> HostVerdict | None:
    if host.gpus and not host.unread:
        return None
    why = host.unread or "no GPU row of this nvidia-smi output was"
    return HostVerdict(
        "gpu-unread",
        f"the driver was read ({host.driver_text}) but {why}: whether the image has code for every GPU cannot be told",
        _ASK_GPUS,
        kind=Route.CAPTURE,
    )


def _thor(cuda: str, host: HostGPU) -> HostVerdict:
    """Jetson Thor: JetPack 7 puts it on the unified Arm (SBSA) CUDA 13 stack (NVIDIA's blog "What's New
    in CUDA Toolkit 13.0 for Jetson Thor"; JetPack 7.1 release notes), so an SBSA image can run there when
    it is a CUDA 13 one with code for 11.0. A CUDA 12 image is not confirmed to (CUDA 12.x named Thor
    10.1): not judged compatible."""
    return HostVerdict(
        "jetson",
        f"image needs CUDA {cuda}; this is a Jetson Thor (driver {host.driver_text}, JetPack's): with JetPack 7 "
        "Thor runs the unified Arm (SBSA) CUDA 13 stack, so an arm64 server image built with CUDA 13 and code for "
        "compute capability 11.0 can run on it; that a CUDA 12 image runs there is not confirmed (CUDA 12.x named "
        "Thor 10.1), so this one is not judged compatible",
        "run a linux/arm64 CUDA 13 image with code for 11.0 (sm_110) on JetPack 7; do not install or upgrade a "
        "driver apart from JetPack",
        kind=Route.OTHER_IMAGE,
    )


def _driver_blocker(verdict: compat.DriverVerdict, host: HostGPU, facts: ImageFacts) -> HostVerdict | None:
    if not verdict.compatible:
        return HostVerdict("driver-too-old", verdict.reason, verdict.route, kind=verdict.kind)
    return _below_floor(host, facts)


def _gpu_known(found: list[dict]) -> HostVerdict | None:
    unknown = [f["name"] for f in found if f["coverage"] == "unknown"]
    if not unknown:
        return None
    return HostVerdict(
        "gpu-unknown",
        f"the compute capability of {', '.join(dict.fromkeys(unknown))} is unknown to this tool, so its "
        "coverage by the image cannot be told",
        _ASK_CC,
        kind=Route.CAPTURE,
    )


def _compatible(verdict: compat.DriverVerdict, found: list[dict]) -> HostVerdict:
    jit = [f for f in found if f["coverage"] == "ptx-jit-only"]
    if jit:
        return HostVerdict(
            "compatible-ptx-jit",
            f"{verdict.reason}; the image carries only PTX for {_names(jit)}: the driver JIT-compiles it",
            "run the image; its first start JIT-compiles the PTX (minutes): keep the CUDA cache on a volume "
            "(CUDA_CACHE_PATH)",
            kind=Route.RUN_JIT,
        )
    return HostVerdict("compatible", verdict.reason, verdict.route, kind=verdict.kind)


def _blocked(cuda: str, host: HostGPU, cpu: dict, kind: str) -> HostVerdict | None:
    if kind == "vgpu-manager":
        return HostVerdict(
            "vgpu-manager",
            f"image needs CUDA {cuda}; {host.driver_text} is a vGPU manager (hypervisor) driver: it reports "
            "'CUDA Version: Not Found' and runs no CUDA itself",
            "give a virtual machine a vGPU (a C-series compute profile) or the whole GPU by passthrough, with the "
            "matching guest driver, and run the image and doctor inside that VM",
            kind=Route.VGPU_GUEST,
        )
    if kind == "windows-tcc":
        return HostVerdict(
            "windows-tcc",
            f"image needs CUDA {cuda}; the GPU runs in TCC mode, which serves native Windows CUDA only: WSL2 and "
            "Docker Desktop, where this Linux image runs on Windows, cannot use it (public reports: "
            "microsoft/WSL#11865)",
            "switch the GPU to WDDM where the board allows it (`nvidia-smi -i <index> -dm 0` as administrator, then "
            "reboot) and run doctor inside WSL2, or run the image on a Linux host",
            kind=Route.WDDM,
        )
    if kind == "jetson" and any(g.tegra and g.cc == "11.0" for g in host.infos):
        return _thor(cuda, host)
    if kind == "jetson":
        return HostVerdict(
            "jetson",
            f"image needs CUDA {cuda}; this is a Jetson (an integrated Tegra GPU on L4T, driver {host.driver_text}): "
            "its driver comes with JetPack, and an image for server arm64 (SBSA) hosts, as this tool and "
            "upstream build, does not run on an integrated GPU",
            "run an image built for Jetson (on an L4T/JetPack base, for the JetPack release the board runs); do not "
            "install or upgrade a driver apart from JetPack: a newer driver comes with a newer JetPack",
            kind=Route.JETSON,
        )
    if cpu["match"] is False:
        return HostVerdict(
            "cpu-mismatch",
            f"the host's CPU is {cpu['host']} ({cpu['from']}); the image is built for {', '.join(cpu['image'])} only",
            f"run an image built for linux/{cpu['host']} (a matrix target for that platform); this one cannot start "
            "here whatever the driver",
            kind=Route.OTHER_PLATFORM,
        )
    return None


def _names(found: list[dict], kernels: bool = False) -> str:
    shown = [
        f"{f['name']} (cc {f['cc'] or '?'})"
        + (f": no code in {', '.join(f['missing_kernels'])}" if kernels and f.get("missing_kernels") else "")
        for f in found
    ]
    return ", ".join(f"{n} x {s}" if (n := shown.count(s)) > 1 else s for s in dict.fromkeys(shown))


def _gpu_blocker(found: list[dict], facts: ImageFacts) -> HostVerdict | None:
    missing = [f for f in found if f["coverage"] in (NONE, PARTIAL)]
    if not missing:
        return None
    kinds = "no code" if all(f["coverage"] == NONE for f in missing) else "no or partial code"
    reason = f"the image has {kinds} for {_names(missing, kernels=True)}; {_judged_by(facts)}"
    old = [f for f in missing if f["cc"] and "/" not in f["cc"] and version_tuple(f["cc"]) < CUDA13_MIN_CC]
    build = f"an image with code for compute capability {' '.join(sorted({f['cc'] or '?' for f in missing}))}"
    tail = " (CUDA 13 dropped Volta and older: only a CUDA 12 build can serve them)" if old else ""
    if len(missing) == len(found):
        return HostVerdict(
            "gpu-none", reason, f"run {build}: a target whose gpu.families lists it{tail}", kind=Route.OTHER_IMAGE
        )
    covered = [str(i) for i, f in enumerate(found) if f not in missing]
    return HostVerdict(
        "gpu-partial",
        reason + f"; covered: GPU {', '.join(covered)}",
        f"restrict the image to the covered GPUs (CUDA_VISIBLE_DEVICES={','.join(covered)}), or run {build} "
        f"for the others{tail}",
        kind=Route.SOME_GPUS,
    )


def _judged_by(facts: ImageFacts) -> str:
    """What the GPU verdict was judged on: each required kernel of the build record, or the label only."""
    if facts.kernels:
        claimed = sorted({cc for row in facts.kernels.values() for cc in row}, key=version_tuple)
        return (
            f"judged kernel by kernel from the build record (the kernels it requires on families {' '.join(claimed)}, "
            "each by where its code runs: sm_XY on X.Y and up within X, sm_XYa on X.Y only, sm_XYf on its family)"
        )
    return (
        f"the image serves compute capability {' '.join(facts.families or ()) or 'nothing'} (label gpu-families; "
        "the per-kernel view is missing: no build record of this image)"
    )


def _below_floor(host: HostGPU, facts: ImageFacts) -> HostVerdict | None:
    if not facts.floor or host.platform != "linux" or host.driver is None:
        return None
    floor = version_tuple(facts.floor)
    if host.driver >= floor:
        return None
    return HostVerdict(
        "driver-below-floor",
        f"the image's GPU code needs driver >= {facts.floor} (label driver-floor: the newest PTX ISA and toolkit "
        f"of its binaries, proven by the gpu_code check); host has {host.driver_text} ({host.branch}). "
        "Minor-version compatibility does not cover this: an older driver refuses newer PTX (K3 JIT-compiles "
        "ISA 8.8 PTX on Hopper)",
        f"upgrade the driver to >= {facts.floor} (r{floor[0]}) or to r580+",
        kind=Route.UPGRADE_DRIVER,
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
    if host.driver is not None and not host.gpus:
        out.append("this nvidia-smi output names no GPU: the image's GPU coverage is not checked")
    out += _header_notes(host)
    if facts.families is not None and not facts.kernels and host.gpus and host.driver is not None:
        out.append(
            "the GPU code was judged by the gpu-families label alone: the per-kernel view (the build record's "
            "coverage table) is missing, so a kernel built only arch-specific (12.0a on a 12.1 GB10, 10.0a on a "
            "10.3 B300) is not seen; doctor --target T reads the record of a target built here"
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


def _header_notes(host: HostGPU) -> list[str]:
    """What the capture's header says that does not add up (an nvidia-smi of another install, a CUDA
    version below the driver's): said, not judged."""
    if host.driver is None or host.platform != "linux":
        return []
    out = []
    if host.smi_version and host.version_text and host.smi_version != host.version_text:
        out.append(
            f"the header's NVIDIA-SMI version ({host.smi_version}) differs from its driver version "
            f"({host.version_text}): nvidia-smi and the loaded driver come from different installs (a driver "
            "changed without a reboot, or a container's own nvidia-smi); capture again after a reboot"
        )
    implied = compat.implied_cuda(host.driver)
    if host.cuda and implied and compat.parse_cuda(host.cuda)[:2] < compat.parse_cuda(implied)[:2]:
        out.append(
            f"the header's CUDA Version ({host.cuda}) is lower than driver {host.driver_text} supports ({implied}): "
            "the capture does not add up (a container's or another install's libcuda); the driver version was judged"
        )
    return out


def expiry(labels: dict[str, str], today: dt.date) -> str | None:
    keys = contract.keys_in(labels)
    raw = labels.get(keys.expires)
    if raw is None:
        return None
    try:
        expires = dt.date.fromisoformat(raw)
    except ValueError:
        return f"expiry label {keys.expires}={raw!r} is not a date"
    owner = printable(labels.get(keys.owner, "its owner"), field=True)  # a label: one line, escaped
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
    return {
        "driver_floor": facts.floor,
        "gpu_families": list(facts.families) if facts.families is not None else None,
        "kernels": {ext: {cc: cell.show() for cc, cell in row.items()} for ext, row in facts.kernels.items()},
    }
