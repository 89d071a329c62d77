"""`build evidence`: save what the host, the engine, the image and the container look like now,
before anything is changed, into one timestamped archive with a manifest of what was captured and
what was not (and why). Works with no GPU, no nvidia-smi and no Docker. Secrets never reach it:
values of secret-looking names (in every file, in every form), known secret values, URL
credentials and queries, private PEM blocks and credential-looking values are redacted
(builder/host/redaction.py); the archive is 0600.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

from builder import log
from builder.config import contract
from builder.errors import BuilderError
from builder.fsutil import atomic_write, reserve_stem
from builder.host import redaction
from builder.host.doctor import output_dir, read_nvidia_smi


def redacted_environment(environ: dict[str, str]) -> str:
    """The environment, sorted: values of secret-looking names, credential-looking values, known
    secret values and URL credentials hidden; a value is shown only when every word of it is
    harmless (builder/host/redaction.py). When unsure, redacted."""
    lines = []
    for name in sorted(environ):
        value = redaction.scrub(environ[name])
        if redaction.SECRET_NAME.search(name) or not redaction.harmless(value):
            value = "***"
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


class _Collector:
    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.captured: list[str] = []
        self.missing: dict[str, str] = {}

    def capture(self, name: str, produce: Callable[[], str]) -> None:
        try:
            self.files[name] = log.redact(produce())
            self.captured.append(name)
        except (BuilderError, OSError, subprocess.SubprocessError, ValueError) as exc:
            self.missing[name] = log.redact(getattr(exc, "message", None) or str(exc))


def _vllm_labels(inspect_json: str | None) -> str:
    if inspect_json is None:
        raise ValueError("no labels (image not inspected)")
    doc = json.loads(inspect_json)[0]
    labels = (doc.get("Config") or {}).get("Labels") or {}
    if not labels:
        raise ValueError("no labels (image not inspected)")
    own = contract.keys_in(labels)
    keys = (
        contract.OCI_VERSION,
        contract.OCI_REVISION,
        contract.OCI_SOURCE,
        own.builder_source,
        own.cuda,
        own.expires,
        own.owner,
    )
    return (
        "".join(f"{k}={labels.get(k, '(absent)')}\n" for k in keys)
        + f"repo_digests={','.join(doc.get('RepoDigests') or [])}\n"
    )


def _smi(smi_file: Path | None) -> str:
    text, source = read_nvidia_smi(smi_file)
    if text is None:
        raise OSError(source)
    return text


def run_tool(args: list[str]) -> str:
    """A host command's output (stdout, then stderr); OSError naming it when it is not installed."""
    exe = shutil.which(args[0])
    if exe is None:
        raise OSError(f"{args[0]} not installed")
    proc = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and not proc.stdout:
        raise OSError(f"`{' '.join(args)}` exited {proc.returncode}: {proc.stderr.strip()[:200]}")
    return proc.stdout + proc.stderr


# Kernel modules the field guides ask for: the driver's own (nvidia, nvidia_uvm, nvidia_drm, ...)
# and the GPUDirect RDMA peer-memory modules.
_MODULES = re.compile(r"^(nvidia\w*|nv_peer_mem)\s", re.M)
# Where the kernel says it (module globals, so a test can point them at a tree of its own).
PROC_MODULES = Path("/proc/modules")
DRIVER_VERSION = Path("/proc/driver/nvidia/version")  # the loaded kernel module's version (NVML mismatch)
SYS_INFINIBAND = Path("/sys/class/infiniband")


def nvidia_modules() -> str:
    """`lsmod` filtered to NVIDIA modules (read from /proc/modules, which is what lsmod prints)."""
    if not PROC_MODULES.is_file():
        raise OSError(f"no {PROC_MODULES} (not a Linux host, or a container that hides it)")
    text = PROC_MODULES.read_text()
    found = [line for line in text.splitlines() if _MODULES.match(line)]
    return "\n".join(found) + "\n" if found else "no nvidia, nvidia_* or nv_peer_mem module is loaded\n"


def infiniband() -> str:
    """Each RDMA device's ports with their state, physical state, rate and link layer."""
    sys_class = SYS_INFINIBAND
    if not sys_class.is_dir():
        raise OSError(f"no {sys_class} (no RDMA device or no RDMA driver loaded)")
    lines = []
    for port in sorted(sys_class.glob("*/ports/*")):
        fields = {
            n: (port / n).read_text().strip() if (port / n).is_file() else "?"
            for n in ("state", "phys_state", "rate", "link_layer")
        }
        lines.append(f"{port.parent.parent.name} port {port.name}: " + ", ".join(f"{k} {v}" for k, v in fields.items()))
    return "\n".join(lines) + "\n" if lines else f"{sys_class} lists no device\n"


# Inside the image: NCCL's distributions (nvidia-nccl-cu12/-cu13) and torch's own NCCL when present.
_NCCL_SCRIPT = """import importlib.metadata as m
for d in m.distributions():
    n = (d.metadata['Name'] or '').lower()
    if n.startswith('nvidia-nccl'):
        print(n, d.version)
try:
    import torch
    print('torch.cuda.nccl', '.'.join(map(str, torch.cuda.nccl.version())))
except Exception as exc:
    print('torch.cuda.nccl: not readable:', type(exc).__name__)
"""


def image_nccl(engine, image: str) -> str:
    out = log.redact(engine.containers.run_python(image, _NCCL_SCRIPT))
    if "nvidia-nccl" not in out and "torch.cuda.nccl " not in out:
        raise ValueError(f"no NCCL in {image}: no nvidia-nccl-* distribution and no torch NCCL ({out.strip()})")
    return out


def _driver_version() -> str:
    if not DRIVER_VERSION.is_file():
        raise OSError(f"no {DRIVER_VERSION} (no NVIDIA kernel module loaded)")
    return DRIVER_VERSION.read_text()


def _host(c: _Collector, run: Callable[[list[str]], str]) -> None:
    c.capture("uname.txt", lambda: run(["uname", "-a"]))
    c.capture("hostname.txt", lambda: run(["hostname"]))
    c.capture("nvidia-modules.txt", nvidia_modules)
    c.capture("nvidia-driver-version.txt", _driver_version)
    c.capture("nvidia-smi-topo.txt", lambda: run(["nvidia-smi", "topo", "-m"]))
    c.capture("infiniband.txt", infiniband)
    c.capture("ibv_devinfo.txt", lambda: run(["ibv_devinfo"]))


def collect(
    engine,
    image: str | None,
    container: str | None,
    smi_file: Path | None,
    environ: dict[str, str],
    now: dt.datetime,
    run: Callable[[list[str]], str] = run_tool,
) -> _Collector:
    c = _Collector()
    c.capture("date-utc.txt", lambda: now.strftime("%a %b %d %H:%M:%S UTC %Y") + "\n")
    c.capture("nvidia-smi.txt", lambda: _smi(smi_file))
    _host(c, run)
    described: dict = {}

    def docker(name: str) -> str:
        if not described:
            described.update(engine.describe())  # one `docker version` and one `docker info`
        return described[name]

    c.capture("docker-version.txt", lambda: docker("docker-version"))
    c.capture("docker-info.txt", lambda: docker("docker-info"))
    c.capture(
        "containers.txt",
        lambda: (
            run(["docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Image}} {{.Status}} {{.Names}}"])
            or "no running container\n"
        ),
    )
    if image:
        c.capture("image-inspect.json", lambda: engine.image_inspect(image))
        c.capture("vllm-version.txt", lambda: _vllm_labels(c.files.get("image-inspect.json")))
        c.capture("nccl-version.txt", lambda: image_nccl(engine, image))
    c.capture("environment.txt", lambda: redacted_environment(environ))
    if container:
        c.capture("container.log", lambda: log.redact(engine.containers.logs(container)))
    return c


def evidence(
    engine,
    out_dir: Path,
    image: str | None,
    container: str | None,
    smi_file: Path | None = None,
    environ: dict[str, str] | None = None,
    run: Callable[[list[str]], str] = run_tool,
) -> tuple[Path, dict]:
    """Collect everything into one timestamped tar.gz with a manifest; never fails for a missing part."""
    out = output_dir(out_dir, "--out")
    now = dt.datetime.now(dt.timezone.utc)
    environ = environ if environ is not None else dict(os.environ)
    redaction.register_environment(environ)  # hidden in every file, not only in environment.txt
    c = collect(engine, image, container, smi_file, environ, now, run)
    manifest = {
        "created": now.strftime(contract.TIME_FORMAT),
        "captured": c.captured,
        "missing": {name: redaction.scrub(why) for name, why in c.missing.items()},
        "image": image,
        "container": container,
    }
    files = {
        **{name: redaction.scrub(text) for name, text in c.files.items()},
        "manifest.json": json.dumps(manifest, indent=2, sort_keys=True) + "\n",
    }
    # Two runs in the same second keep both archives (an exclusive placeholder per name).
    stem = reserve_stem(out, f"k3-evidence-{now.strftime('%Y%m%dT%H%M%SZ')}", (".tar.gz",))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in sorted(files):
            data = files[name].encode("utf-8", "replace")
            info = tarfile.TarInfo(f"{stem}/{name}")
            info.size, info.mtime, info.mode = len(data), int(now.timestamp()), 0o600
            tar.addfile(info, io.BytesIO(data))
    path = out / f"{stem}.tar.gz"
    atomic_write(path, buf.getvalue(), mode=0o600)  # it describes a host: its owner's, not everyone's
    return path, manifest
