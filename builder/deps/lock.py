"""Hash-locked dependencies, resolved with uv's ``pip compile``, hermetic, indexes from the matrix only.

Two locks per target, both installed with ``pip install --require-hashes --no-deps``:
``requirements.txt`` (the image's runtime environment) and ``build-requirements.txt`` (the build
stage's tools). Each starts with a header carrying the sha256 of its inputs, so a build can tell
a stale lock from a current one without re-resolving.

Why uv (a PyPI wheel, hash-pinned like every dependency of this tool's own install): it resolves
for the image's Python and glibc (``--python-version``, ``--python-platform``) without that
interpreter on the host, so markers are evaluated for the image, not for the machine running
the tool; it has real overrides (``--override``), which is how vLLM's own image forces NCCL past
torch's pin; and ``unsafe-best-match`` across indexes is how vLLM resolves too: a pin such as
``torch==2.13.0+cu129`` is taken from the one index that has it while PyPI still serves the rest.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.config import contract
from builder.config.matrix import Target
from builder.config.names import normalize
from builder.deps.hermetic import hermetic_env, uv_binary
from builder.errors import ConfigError, LockError, failure_kind
from builder.fsutil import atomic_write, sha256_bytes
from builder.source.requirements import SourceTree, requirement_lines, resolve_includes

_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[A-Za-z0-9._,-]+\])?)")
INPUT_HEADER = "# k3-lock-inputs-sha256: "
BODY_HEADER = "# k3-lock-body-sha256: "  # a truncated or hand-edited lock fails this, whatever still parses
PINS_FILE = "matrix.in"  # the matrix's own pins, one requirement per line
OVERRIDES_FILE = "overrides.txt"  # forced versions (uv --override): NCCL over torch's own pin


@dataclass(frozen=True)
class LockInputs:
    """Everything one lock is computed from, as files relative to a scratch directory."""

    kind: str  # "runtime" or "build"
    files: dict[str, bytes]  # relative path -> content; PINS_FILE and OVERRIDES_FILE from the matrix
    top: tuple[str, ...]  # the files the resolver is given (others are reached by -r)
    indexes: tuple[str, ...]
    python: str
    platform: str  # uv --python-platform, e.g. x86_64-manylinux_2_35

    @property
    def sha256(self) -> str:
        doc = {
            "kind": self.kind,
            "files": {k: sha256_bytes(v) for k, v in sorted(self.files.items())},
            "top": list(self.top),
            "indexes": list(self.indexes),
            "python": self.python,
            "platform": self.platform,
        }
        return sha256_bytes(json.dumps(doc, sort_keys=True).encode())


def _transform(data: bytes, rewrites: dict[str, str], path: str = "requirements", drop: Collection[str] = ()) -> bytes:
    """A source requirements file as the resolver gets it: index options dropped (indexes come
    from the matrix alone), requirements the matrix drops commented out (``source.drop``, by
    normalized name), rewrites applied. ``requirement_lines`` has already refused anything that
    reaches outside the tree; it also says which physical lines an index option or a requirement
    spans."""
    lines = requirement_lines(path, data)
    dropped = {n for ln in lines if ln.kind == "index" for n in range(ln.lineno, ln.last + 1)}
    drop = {normalize(n) for n in drop}
    removed = {
        n for ln in lines if ln.kind == "requirement" and _name(ln.value) in drop for n in range(ln.lineno, ln.last + 1)
    }
    out = []
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if lineno in dropped:
            out.append(f"# dropped by build lock (indexes come from the matrix): {line.strip()}")
            continue
        if lineno in removed:
            out.append(f"{_DROP_MARK}{line.strip()}")
            continue
        m = _REQ_NAME.match(line)
        if m and m.group(1) in rewrites:
            line = line[: m.start(1)] + rewrites[m.group(1)] + line[m.end(1) :]
        out.append(line)
    return ("\n".join(out) + "\n").encode()


def _name(requirement: str) -> str:
    """The normalized distribution name a requirement line starts with ("" for none)."""
    m = _REQ_NAME.match(requirement)
    return normalize(m.group(1).split("[")[0]) if m else ""


_DROP_MARK = "# dropped by the matrix (source.drop): "


def dropped_names(files: dict[str, bytes]) -> set[str]:
    """The normalized names ``_transform`` commented out of these transformed files."""
    names = {
        _name(line[len(_DROP_MARK) :])
        for data in files.values()
        for line in data.decode("utf-8").splitlines()
        if line.startswith(_DROP_MARK)
    }
    return names - {""}  # a dropped requirement's continuation lines name nothing


def nccl_pin(target: Target) -> str | None:
    if not target.nccl:
        return None
    return f"nvidia-nccl-cu{target.cuda.major}=={target.nccl.version}"


def inputs(target: Target, pinned: SourceTree, kind: str) -> LockInputs:
    paths = target.source.requirements if kind == "runtime" else target.source.build_requirements
    drop = target.source.drop if kind == "runtime" else {}
    files = {
        f"source/{path}": _transform(data, target.source.rewrites, path, drop)
        for path, data in resolve_includes(pinned, paths).items()
    }
    stale = sorted({normalize(n) for n in drop} - dropped_names(files))
    if stale:
        raise ConfigError(
            f"{target.name}: source.drop.{stale[0]}: no requirement of that name in {', '.join(paths)} at the pin"
        )
    pins = list(target.pinned_requirements() if kind == "runtime" else target.build_requirements)
    if kind == "build" and target.torch:
        # The build stage compiles against torch: it must be the same CUDA build as the runtime's.
        pins.append(f"torch=={target.torch.version}")
    overrides = list(target.overrides)
    nccl = nccl_pin(target) if kind == "runtime" else None  # None: the target pins no NCCL
    if nccl:
        overrides.append(nccl)  # wins over torch's own nvidia-nccl pin, as in vLLM's image
    files[PINS_FILE] = ("".join(f"{p}\n" for p in sorted(set(pins)))).encode()
    files[OVERRIDES_FILE] = ("".join(f"{p}\n" for p in sorted(set(overrides)))).encode()
    top = (PINS_FILE,) + tuple(f"source/{p}" for p in paths)
    return LockInputs(
        kind=kind,
        files=files,
        top=top,
        indexes=target.lock_indexes(),
        python=target.python.version,
        platform=target.python.uv_platform(),
    )


def resolve(lock_inputs: LockInputs, where: str) -> str:
    """Run ``uv pip compile`` on the inputs; return the lock body (no header, no index lines)."""
    with tempfile.TemporaryDirectory(prefix="k3-lock-") as tmp:
        work = Path(tmp)
        for rel, data in lock_inputs.files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(data)
        index, *extra = lock_inputs.indexes
        cmd = [
            uv_binary(),
            "pip",
            "compile",
            "--quiet",
            "--no-config",
            "--no-header",
            "--generate-hashes",
            "--annotation-style",
            "line",
            "--emit-index-annotation",
            "--no-build",
            "--python-version",
            lock_inputs.python,
            "--python-platform",
            lock_inputs.platform,
            "--index-url",
            index,
            "--index-strategy",
            "unsafe-best-match",
        ]
        for url in extra:
            cmd += ["--extra-index-url", url]
        if lock_inputs.files.get(OVERRIDES_FILE, b"").strip():
            cmd += ["--override", OVERRIDES_FILE]
        cmd += ["--output-file", "lock.txt", *lock_inputs.top]
        proc = subprocess.run(cmd, cwd=work, env=hermetic_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            reason = resolver_reason(proc.stderr or proc.stdout, work) or f"uv exited {proc.returncode}"
            kind = failure_kind(proc.stderr or "", LockError)
            raise kind(
                f"{where}: resolving the {lock_inputs.kind} lock failed: {reason} "
                f"(indexes: {', '.join(lock_inputs.indexes)}; are they reachable from here?)"
            )
        return (work / "lock.txt").read_text()


# uv's own lines (error:, its ×/╰─▶ causes, hints); anything else on its stderr may be a quote
# of an input file (uv echoes the offending line of a requirements file), so it never reaches
# the message, and what does is redacted before it is cut.
_UV_LINE = re.compile(r"^\s*(?:error:|cause:|warning:|hint:|help:|Caused by:|×|╰─▶|├─▶)")


def resolver_reason(stderr: str, work: Path) -> str:
    """The resolver's failure in one redacted line: its own lines only, no quoted input."""
    from builder.log import redact

    lines = [ln.strip() for ln in stderr.splitlines() if _UV_LINE.match(ln)]
    text = " ".join(lines[-4:]).replace(str(work) + "/", "").replace(str(work), ".")
    text = redact(text)
    return text if len(text) <= 600 else text[:597] + "..."


def compile_lock(target: Target, lock_inputs: LockInputs) -> str:
    """The lock text for one kind: our header, then the resolved body."""
    body = resolve(lock_inputs, target.name)
    header = (
        f"# Lock for target {target.name} ({lock_inputs.kind}), made by `build lock`; do not edit.\n"
        f"# Install with: pip install --require-hashes --no-deps -r <this file>\n"
        f"{INPUT_HEADER}{lock_inputs.sha256}\n"
        f"{BODY_HEADER}{sha256_bytes(body.encode())}\n"
    )
    return header + body


_ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")


@dataclass(frozen=True)
class LockEntry:
    name: str
    version: str
    hashes: tuple[str, ...]
    override: bool = False  # forced by the matrix over what the resolver's packages declare


def _split_header(text: str) -> tuple[dict[str, str], str]:
    headers = {}
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("# "):
        for key in (INPUT_HEADER, BODY_HEADER):
            if lines[i].startswith(key):
                headers[key] = lines[i][len(key) :].strip()
        i += 1
    return headers, "".join(lines[i:])


def parse_lock(text: str, path: Path) -> tuple[str | None, list[LockEntry]]:
    """(inputs sha256 from the header, entries). Raises LockError on a malformed lock."""
    headers, body = _split_header(text)
    input_sha = headers.get(INPUT_HEADER)
    if BODY_HEADER in headers and headers[BODY_HEADER] != sha256_bytes(body.encode()):
        raise LockError(
            f"{path}: the lock's body does not match its {BODY_HEADER.strip()} header (truncated or "
            "edited by hand); restore it from git or re-run `build lock`"
        )
    # [name, version, hashes, override] while its lines are read; LockEntry once the lock is read.
    entries: list[list[Any]] = []
    current: list[Any] | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith(INPUT_HEADER) or line.startswith(BODY_HEADER):
            continue
        stripped = line.strip()
        if stripped.startswith("# via") and "--override" in stripped and current is not None:
            current[3] = True  # forced by the matrix (uv --override) over what other packages declare
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if line.startswith("    --hash=sha256:"):
            if current is None:
                raise LockError(f"{path}:{lineno}: hash line without a requirement")
            digest = stripped.split(":", 1)[1].rstrip(" \\")
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise LockError(f"{path}:{lineno}: not a sha256 (64 hex characters): {digest[:70]!r}")
            current[2].append(digest)
            continue
        m = _ENTRY.match(line)
        if not m:
            raise LockError(f"{path}:{lineno}: not a pinned requirement line: {stripped[:60]!r}")
        # A marker (`; python_version > "3.11"`) may follow the version; the lock was resolved for
        # one Python and platform, so every entry applies.
        current = [m.group("name"), m.group("version").rstrip(" \\;"), [], False]
        entries.append(current)
    result = [LockEntry(n, v, tuple(h), o) for n, v, h, o in entries]
    for e in result:
        if not e.hashes:
            raise LockError(f"{path}: {e.name}=={e.version} has no --hash; re-run `build lock`")
    return input_sha, result


def compute(target: Target, pinned: SourceTree) -> dict[str, str]:
    """Both locks' texts (file name -> text), resolved for the target's platform (python.arch)."""
    return {
        contract.LOCK_NAME: compile_lock(target, inputs(target, pinned, "runtime")),
        contract.BUILD_LOCK_NAME: compile_lock(target, inputs(target, pinned, "build")),
    }


def write(root: Path, target: Target, pinned: SourceTree, lock_dir: Path | None = None) -> dict[str, Path]:
    """Compute both locks, then write them atomically (both computed before either is written)
    into ``lock_dir`` (default locks/<target>/; a further platform's is its own directory)."""
    texts = compute(target, pinned)
    written = {}
    for name, text in texts.items():
        path = (lock_dir or root / contract.LOCKS_DIR / target.name) / name
        atomic_write(path, text)
        written[name] = path
    return written


# The torch family: built per CUDA, released together on the PyTorch index; PyPI's builds are
# CUDA 13 with no +cu marker (torchvision refuses to load beside a torch of another CUDA;
# torchcodec 0.17.0 from PyPI needs libcudart.so.13 and libnvrtc.so.13).
TORCH_FAMILY = ("torch", "torchvision", "torchaudio", "torchcodec")


def check_torch_build(target: Target, entries: list[LockEntry], path: Path) -> None:
    """A target that pins torch must have that CUDA's local builds in its lock (e.g. +cu129):
    torch itself, and the rest of the family wherever the lock has it, except a member that
    cuda.other_major lets in with a reason."""
    if not target.torch:
        return
    want = target.cuda.short
    # torch itself is never exempt; the rest of the family is, when cuda.other_major gives a reason.
    checked = set(TORCH_FAMILY) - ({normalize(n) for n in target.cuda.other_major} - {"torch"})
    family = {name: e for e in entries if (name := normalize(e.name)) in checked}
    if "torch" not in family:
        raise LockError(
            f"{path}: no torch in the lock, but the target pins torch {target.torch.version}; "
            f"re-lock with the {want} index"
        )
    wrong = [f"{name} {e.version}" for name, e in sorted(family.items()) if not e.version.endswith(f"+{want}")]
    if wrong:
        raise LockError(
            f"{path}: the torch family must be +{want} builds for this target, the lock has {', '.join(wrong)}; "
            f"PyPI's bare builds are CUDA 13 and fail on r575 drivers. Re-lock with the {want} index."
        )


def read_text(path: Path) -> str:
    """A committed lock's text; LockError when missing or unreadable."""
    if not path.exists():
        raise LockError(
            f"{path}: no lock for this target; run `build lock --target {path.parent.name}` first "
            "(where the target's indexes are reachable) and commit it"
        )
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: unreadable lock ({exc}); restore it from git or re-run `build lock`") from None


def entries_of(text: str, path: Path) -> list[LockEntry]:
    """A lock's entries; LockError when unhashed, edited (body hash), headerless or empty."""
    if BODY_HEADER.strip() not in text:
        raise LockError(f"{path}: no '{BODY_HEADER.strip()}' header; re-run `build lock`")
    _, entries = parse_lock(text, path)
    if not entries:
        raise LockError(f"{path}: the lock has no entries; restore it from git or re-run `build lock`")
    return entries


def read_entries(path: Path) -> list[LockEntry]:
    """A committed lock's entries; LockError when missing, unreadable, unhashed or empty."""
    return entries_of(read_text(path), path)


def check_current(path: Path, lock_inputs: LockInputs, text: str | None = None) -> None:
    """Make sure a committed lock (``text``, when already read and hashed) was made from these inputs."""
    text = read_text(path) if text is None else text
    input_sha, _ = parse_lock(text, path)
    if input_sha is None:
        raise LockError(f"{path}: no '{INPUT_HEADER.strip()}' header; was it edited by hand? re-run `build lock`")
    if input_sha != lock_inputs.sha256:
        raise LockError(
            f"{path}: stale: made from other inputs than the matrix and source now give; "
            f"run `build lock --target {path.parent.name}`"
        )
