"""`build doctor`, for the operator of an r575 host before anyone changes a launch flag: does
this image start on this host, and if not, which route applies. Works with no GPU and no
nvidia-smi (it says what is missing); `build evidence` (builder/host/evidence.py) saves the state.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from builder.config import contract
from builder.errors import ConfigError
from builder.fsutil import read_regular
from builder.host import compat, imagefacts, verdicts
from builder.host.compat import Route
from builder.host.decisionmd import BLANKS, TO_FILL, decision_markdown
from builder.host.hostctx import HostContext, host_platform

MAX_SMI_BYTES = 1 << 20  # `nvidia-smi -q` for 8 GPUs is ~100 KB


def read_nvidia_smi(path: Path | None) -> tuple[str | None, str]:
    """(output, where from): a captured file, or `nvidia-smi` when it is installed, or nothing."""
    if path is not None:
        data = read_regular(path, MAX_SMI_BYTES, "a captured nvidia-smi output")
        return decode_capture(data), str(path)
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not installed"
    proc = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr, exe


def decode_capture(data: bytes) -> str:
    """A capture's text. Windows PowerShell's `nvidia-smi > file` writes UTF-16 with a byte-order
    mark, `Out-File -Encoding utf8` UTF-8 with one; anything else is read as UTF-8, bad bytes replaced."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return data.decode("utf-16", "replace")
    return data.decode("utf-8-sig", "replace")


@dataclass
class Diagnosis:
    compatible: bool
    line: str
    route: str
    expiry: str | None = None
    facts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the output showed besides the verdict
    save: str = ""  # evidence to save before acting on the route (broken hosts)
    reason: str = ""  # the verdict's reason (the line without its "compatible: image:" prefix)
    name: str = ""  # the verdict (builder/host/verdicts.py EXIT)
    kind: Route = Route.RUN  # what the route asks for, as a value: decisions key on this, never on its text


def host_of(smi_text: str | None, smi_source: str, columns: tuple[str, ...] | None = None) -> compat.HostGPU:
    """The host as nvidia-smi's output shows it; output doctor cannot read is bad input naming its source."""
    if smi_text is None:
        return compat.HostGPU(None, None, (), note=smi_source)
    try:
        return compat.parse_smi(smi_text, columns)
    except compat.SmiParseError as exc:
        raise ConfigError(f"{smi_source}: {exc}") from None


def diagnose(
    smi_text: str | None,
    smi_source: str,
    labels: dict[str, str],
    env: dict[str, str],
    image: str,
    today: dt.date | None = None,
    *,
    facts: imagefacts.ImageFacts | None = None,
    ctx: HostContext | None = None,
) -> Diagnosis:
    ctx = ctx or HostContext()
    host = host_of(smi_text, smi_source, ctx.columns)
    keys = contract.keys_in(labels)
    found = compat.image_cuda(labels, env, keys.cuda)
    if found is None:
        raise ConfigError(
            f"{image}: no CUDA version in its labels ({keys.cuda}) or env "
            "(CUDA_VERSION, NVIDIA_REQUIRE_CUDA); is it a CUDA image?"
        )
    cuda, where = found
    facts = facts or imagefacts.from_labels(labels)
    kind = verdicts.host_kind(host, ctx.in_container, ctx.tegra)
    cpu = verdicts.cpu_finding(host, facts, ctx)
    gpus = verdicts.gpu_findings(host, facts)
    try:
        out = verdicts.evaluate(cuda, host, facts, cpu, gpus, kind)
    except ValueError as exc:
        raise ConfigError(f"{image}: {where}: {exc}") from None
    line = f"{'compatible' if out.compatible else 'INCOMPATIBLE'}: {image}: {out.reason}"
    expiry = _expiry(labels, today or dt.date.today())
    return Diagnosis(
        out.compatible,
        line,
        out.route,
        expiry,
        {
            "image": image,
            "image_cuda": cuda,
            "image_cuda_from": where,
            **verdicts.host_facts(host, smi_source),
            "host_kind": kind,
            "forward_capable": host.forward_capable,
            "cpu": cpu,
            "gpu_findings": gpus,
            **verdicts.image_facts(facts),
        },
        ([f"also: {out.also}"] if out.also else []) + verdicts.notes(host, facts, cpu, kind),
        out.save,
        out.reason,
        out.name,
        out.kind,
    )


def gpu_lines(d: Diagnosis) -> list[str]:
    return [
        f"gpu: {g['name']}: cc {g['cc'] or '?'} ({g['class']}), image coverage {g['coverage'] or 'not declared'}"
        + (f", no code in {', '.join(g['missing_kernels'])}" if g["missing_kernels"] else "")
        + ("" if g["per_kernel"] or g["coverage"] is None else " (label only: the per-kernel view is missing)")
        for g in d.facts["gpu_findings"]
    ]


def host_arch(smi_text: str | None, smi_source: str, ctx: HostContext) -> str | None:
    """The host's CPU architecture (OCI name) doctor judges, from the one rule in hostctx.host_platform."""
    return host_platform(ctx, host_of(smi_text, smi_source, ctx.columns))[0]


_expiry = verdicts.expiry  # kept under its old name (tests read it here)


# --- the decision record ---------------------------------------------------------------------------
# What the field guides end with: evidence, the path chosen and the paths not chosen (with why), the
# verification, the exit conditions, the rollback, the next review. Filled from what the tool knows;
# what only a person knows is a marked blank (TO_FILL in Markdown, null under "to_fill" in JSON).

DECISION_SCHEMA = 1
PATHS = ("upgrade the driver", "the cu129 bridge", "an isolated environment")
REVIEW_DAYS = 30  # the next review: this many days on, or the bridge's expiry date when that is sooner


def image_record(plan, arch: str | None = None) -> dict | None:
    """What the build record of ``plan``'s target says about its image (digest, whether the image
    checks ran), for the decision record; None when the target was never built here. ``arch``: the
    host's platform (host_arch), which picks the platform record of an index."""
    from builder.records import index
    from builder.records import store as records

    path = contract.record_path(plan.root, plan.target.name)
    if index.kind_of(path) == contract.INDEX_KIND:
        return _index_record(path, arch)
    record = records.read(path)
    if record is None:
        return None
    return {
        "target": record.target,
        "image": record.image,
        "digest": record.digest,
        "checks": record.checks,
        "record": str(contract.record_path(plan.root, plan.target.name)),
    }


def archive_facts(path: Path | None) -> dict | None:
    """The evidence archive the record points at (name and sha256), or None when none was given."""
    import hashlib

    if path is None:
        return None
    if not path.is_file():
        raise ConfigError(f"--evidence {path}: not a file (give the archive `build evidence` wrote)")
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"archive": path.name, "sha256": digest.hexdigest()}


def _choice(d: Diagnosis, bridge: bool) -> tuple[str | None, str]:
    """(the path doctor recommends, why) from the verdict: None while the host has no usable driver."""
    f = d.facts
    if d.name in _NO_PATH:  # none of the three paths helps until this is resolved: the route says what does
        return None, f"no path until this is resolved ({d.name}): {d.route}"
    if f["fault"] or f["host_driver"] == "none":
        return None, f"no path until the host has a usable driver: {d.route}"
    if d.name == "driver-below-floor":
        return PATHS[0], f"the image's GPU code needs a newer driver: {d.reason}; route: {d.route}"
    on_580 = int(f["host_branch"][1:]) >= 580
    if d.kind is Route.USE_CU129:
        return PATHS[1], f"this host runs a CUDA 12 driver ({f['host_branch']}); the cu129 build runs on it"
    if bridge and d.compatible and not on_580:
        return PATHS[1], f"the bridge runs on this host as it is ({d.reason})"
    if d.compatible:
        return PATHS[0], (
            f"done: the host driver ({f['host_driver']}) already runs this image"
            + ("; on r580+ the bridge is not needed: run the official CUDA 13 image" if bridge else "")
        )
    return PATHS[0], f"the image does not start on this driver: {d.reason}; route: {d.route}"


def _not_chosen(path: str, d: Diagnosis, chosen: str | None, bridge: bool) -> str:
    f = d.facts
    if chosen is None:
        return (
            "not yet: repair the host first" if d.name in ("broken-host", "no-driver") else f"not yet: {d.name} first"
        )
    if path == PATHS[0]:
        return f"not now: CUDA 13 needs r580+ on the host (it runs {f['host_branch']}); {TO_FILL}: when"
    if path == PATHS[1]:
        if d.compatible:
            return "not needed: the host driver runs the image" + (
                " (r580+ runs the official CUDA 13 image)" if bridge else ""
            )
        return (
            "the bridge itself does not start here (see the verdict)"
            if bridge
            else f"does not help: the bridge needs a CUDA 12 driver (>= 525.60.13); the host runs {f['host_branch']}"
        )
    if f["platform"] != "linux":
        return "not assessed: forward compatibility (cuda-compat) on a Windows/WSL driver"
    if not f["data_center"]:
        return "not available: forward compatibility (cuda-compat) needs data-center GPUs; host has " + (
            ", ".join(sorted(set(f["gpus"]))) or "none named in this nvidia-smi output"
        )
    if not f["forward_capable"]:
        return "not available: forward compatibility to CUDA 13 needs GPUs CUDA 13 supports (7.5 and up; not vGPU)"
    return (
        "possible on these data-center GPUs (cuda-compat in an isolated environment), not needed while the "
        f"chosen path ({chosen}) holds; it swaps the driver's user-space libraries inside the container"
    )


def paths(d: Diagnosis, bridge: bool) -> list[dict]:
    chosen, why = _choice(d, bridge)
    return [
        {"path": p, "chosen": p == chosen, "why": why if p == chosen else _not_chosen(p, d, chosen, bridge)}
        for p in PATHS
    ]


def decision(d: Diagnosis, labels: dict[str, str], built: dict | None, archive: dict | None, now: dt.datetime) -> dict:
    """The decision record as a JSON-ready document (docs/r575.md, "The decision record")."""
    keys = contract.keys_in(labels)
    bridge = keys.expires in labels
    options = paths(d, bridge)
    chosen, why = _choice(d, bridge)
    label_keys = (
        keys.cuda,
        keys.owner,
        keys.expires,
        keys.target,
        keys.lock_sha256,
        keys.builder_source,
        contract.OCI_VERSION,
        contract.OCI_REVISION,
        contract.OCI_SOURCE,
        contract.OCI_CREATED,
        contract.OCI_BASE_NAME,
        contract.OCI_BASE_DIGEST,
    )
    # The build record counts only when it is of this very image.
    recorded = built if built is not None and built["image"] == d.facts["image"] else None
    return {
        "schema": DECISION_SCHEMA,
        "created": now.strftime(contract.TIME_FORMAT),
        "image": d.facts["image"],
        "fault_evidence": {
            "verdict": d.line,
            "route": d.route,
            "host": {k: d.facts[k] for k in _HOST_FACTS},
            "notes": d.notes,
            "save_first": d.save or None,
            "evidence_archive": archive,
        },
        "paths": options,
        "chosen": chosen,
        "chosen_why": why,
        "verification": {
            "compatible": d.compatible,
            "verdict": d.name,
            "image_cuda": d.facts["image_cuda"],
            "labels": {k: labels.get(k) for k in label_keys},
            "build_record": recorded,
            "checks": recorded["checks"] if recorded else None,
        },
        "exit_conditions": _exit_conditions(labels, keys, d.expiry),
        "rollback": _rollback(chosen, d),
        "next_review": _next_review(labels.get(keys.expires), now.date()).isoformat(),
        "to_fill": {name: None for name in BLANKS},
    }


# Verdicts none of the three paths answers (builder/host/verdicts.py): the route names what does.
_NO_PATH = (
    "container-no-runtime",
    "vgpu-manager",
    "windows-tcc",
    "cpu-mismatch",
    "gpu-none",
    "gpu-partial",
    "driver-unknown",
    "cuda-unusable",
    "gpu-unread",
    "gpu-unknown",
    "jetson",
)
_HOST_FACTS = (
    "host_kind",
    "cpu",
    "gpu_findings",
    "driver_floor",
    "nvidia_smi",
    "nvidia_smi_form",
    "host_driver",
    "host_branch",
    "host_cuda",
    "platform",
    "gpus",
    "data_center",
    "mig_devices",
    "fault",
    "nvml_library",
)


def _exit_conditions(labels: dict[str, str], keys, expiry: str | None) -> dict:
    if keys.expires not in labels:
        return {
            "bridge": False,
            "owner": labels.get(keys.owner),
            "expires": None,
            "status": "no expiry label: this image is not a bridge build",
        }
    return {
        "bridge": True,
        "owner": labels.get(keys.owner),
        "expires": labels[keys.expires],
        "status": expiry,
        "exit_when": "the hosts run driver r580+ and the official CUDA 13 image passes `build doctor` and "
        "`build compare` against this one; at the expiry date at the latest",
    }


def _rollback(chosen: str | None, d: Diagnosis) -> str:
    if chosen is None:
        return "none: nothing is changed until the host is repaired"
    if chosen == PATHS[0] and not d.compatible:
        return f"reinstall the driver the host runs now ({d.facts['host_driver']}) and reboot"
    if chosen == PATHS[0]:
        return "none needed: the host already runs the image"
    return f"redeploy the previous image ({TO_FILL}: {BLANKS['previous_image']}) and retire this deployment"


def _next_review(expires: str | None, today: dt.date) -> dt.date:
    review = today + dt.timedelta(days=REVIEW_DAYS)
    try:
        return max(today, min(review, dt.date.fromisoformat(expires))) if expires else review
    except ValueError:
        return review


def output_dir(out_dir: Path, option: str) -> Path:
    """Where records and archives go: a directory (made if missing), never a file, a device or /proc;
    one this user can write (else ConfigError, one line, not a traceback)."""
    import os

    from builder.errors import RESOURCE_ERRNOS

    resolved = out_dir.resolve()
    if resolved.parts[:2] in (("/", "proc"), ("/", "sys"), ("/", "dev")):
        raise ConfigError(f"{option} {out_dir}: not a place for an archive or a record")
    if resolved.exists() and not resolved.is_dir():
        raise ConfigError(f"{option} {out_dir}: exists and is not a directory")
    try:
        resolved.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file on the way, no permission; a full or read-only disk is exit 74
        if exc.errno in RESOURCE_ERRNOS:
            raise
        raise ConfigError(f"{option} {out_dir}: cannot make the directory: {exc.strerror}") from None
    if not os.access(resolved, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {out_dir}: not writable by this user")
    return resolved


def write_decision(out_dir: Path, doc: dict) -> tuple[Path, Path]:
    """DIR/k3-decision-<UTC time>-<image>.md and .json; returns both paths."""
    import re

    from builder.fsutil import reserve_stem

    out = output_dir(out_dir, "--record")
    stamp = doc["created"].replace("-", "").replace(":", "")
    stem = f"k3-decision-{stamp}-{re.sub(r'[^A-Za-z0-9._-]+', '_', doc['image'])[-60:]}"
    stem = reserve_stem(out, stem, (".md", ".json"))  # a second run within the second keeps the first
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    _write_pair(js, md, doc)
    return md, js


def amend_decision(path: Path, option: str, key: str, entry: dict) -> tuple[Path, Path]:
    """The decision record at ``path`` (.json) with ``entry`` added under ``key`` (a list: each run
    keeps its own), and its .md re-written through the one writer: what `build vet --decision` and
    `build accept --record` add."""
    doc = load_decision(path, option)
    doc.setdefault(key, []).append(entry)
    md = path.with_suffix(".md")
    _write_pair(path, md, doc)
    return path, md


def load_decision(path: Path, option: str) -> dict:
    """The decision record at ``path``, checked to render (bad input up front, before a run)."""
    import json

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{option} {path}: not a decision record: {exc}") from None
    if not isinstance(doc, dict) or "fault_evidence" not in doc:
        raise ConfigError(f"{option} {path}: not a decision record (`build doctor --record` writes one)")
    try:
        decision_markdown(_one_line(doc))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{option} {path}: not a complete decision record ({type(exc).__name__}: {exc})") from None
    return doc


def _write_pair(js: Path, md: Path, doc: dict) -> None:
    """The one writer of a decision record: the JSON as it is, the Markdown with every field one
    line and every control escaped (a label's newline never starts a Markdown line)."""
    import json

    from builder.fsutil import atomic_write
    from builder.log import printable

    text = printable(decision_markdown(_one_line(doc)))  # rendered first: a failure writes neither
    atomic_write(js, json.dumps(doc, indent=2) + "\n")
    atomic_write(md, text)


def _one_line(value):
    """``value`` (the decision document) with every string escaped as one field (log.printable)."""
    from builder.log import printable

    if isinstance(value, str):
        return printable(value, field=True)
    if isinstance(value, dict):
        return {k: _one_line(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_one_line(v) for v in value]
    return value


def _index_record(path: Path, arch: str | None) -> dict | None:
    """image_record of a target built into an image index: the index, and the record of the host's
    platform ``arch`` (its checks, and the GPU coverage doctor reads from it), else the first one's."""
    from builder.records import index
    from builder.records import store as records

    found = index.read(path)
    if found is None:
        return None
    mine = f"linux/{arch}" if f"linux/{arch}" in found.platforms else next(iter(found.platforms))
    one = records.read(path.parent / found.platforms[mine]["record"])
    return {
        "target": found.target,
        "image": found.image,
        "digest": found.digest,
        "checks": one.checks if one else "missing",
        "record": str(path.parent / found.platforms[mine]["record"]),
        "platform": mine,
    }
