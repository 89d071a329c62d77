"""Hash-locked dependencies: pip-tools' pip-compile, hermetic, indexes from the matrix only.

Two locks per target, both installed with ``pip install --require-hashes --no-deps``:
``requirements.txt`` (the image's runtime environment) and ``build-requirements.txt`` (the build
stage's tools). Each starts with a header carrying the sha256 of its inputs, so a build can tell
a stale lock from a current one without re-resolving.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from builder import contract
from builder.errors import LockError
from builder.fsutil import atomic_write, sha256_bytes
from builder.matrix import Target
from builder.source import PinnedSource, resolve_includes

# Options inside a source's requirement files that would bring in an index or a local path:
# dropped, because indexes come from the matrix alone.
_OPTION_LINE = re.compile(r"^\s*(-i|--index-url|--extra-index-url|-f|--find-links|--trusted-host|--no-index)\b")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[A-Za-z0-9._,-]+\])?)")
INPUT_HEADER = "# k3-lock-inputs-sha256: "
BODY_HEADER = "# k3-lock-body-sha256: "  # a truncated or hand-edited lock fails this, whatever still parses


@dataclass(frozen=True)
class LockInputs:
    """Everything one lock is computed from, as files relative to a scratch directory."""

    kind: str  # "runtime" or "build"
    files: dict[str, bytes]  # relative path -> content; "matrix.in" holds the matrix's pins
    top: tuple[str, ...]  # the files pip-compile is given (others are reached by -r)
    indexes: tuple[str, ...]
    python: str

    @property
    def sha256(self) -> str:
        doc = {
            "kind": self.kind,
            "files": {k: sha256_bytes(v) for k, v in sorted(self.files.items())},
            "top": list(self.top),
            "indexes": list(self.indexes),
            "python": self.python,
        }
        return sha256_bytes(json.dumps(doc, sort_keys=True).encode())


def _transform(data: bytes, rewrites: dict[str, str]) -> bytes:
    out = []
    for line in data.decode("utf-8").splitlines():
        if _OPTION_LINE.match(line):
            out.append(f"# dropped by build lock (indexes come from the matrix): {line.strip()}")
            continue
        m = _REQ_NAME.match(line)
        if m and m.group(1) in rewrites:
            line = line[: m.start(1)] + rewrites[m.group(1)] + line[m.end(1):]
        out.append(line)
    return ("\n".join(out) + "\n").encode()


def inputs(target: Target, pinned: PinnedSource, kind: str) -> LockInputs:
    paths = target.source.requirements if kind == "runtime" else target.source.build_requirements
    files = {
        f"source/{path}": _transform(data, target.source.rewrites)
        for path, data in resolve_includes(pinned, paths).items()
    }
    pins = list(target.pinned_requirements() if kind == "runtime" else target.build_requirements)
    if kind == "build" and target.torch:
        # The build stage compiles against torch: it must be the same CUDA build as the runtime's.
        pins.append(f"torch=={target.torch.version}")
    if target.nccl and kind == "runtime":
        pins = [p for p in pins if not p.startswith("nvidia-nccl-")]  # applied after resolving
    files["matrix.in"] = ("".join(f"{p}\n" for p in sorted(pins))).encode()
    top = ("matrix.in",) + tuple(f"source/{p}" for p in paths)
    return LockInputs(kind=kind, files=files, top=top, indexes=target.lock_indexes(), python=target.python.version)


def hermetic_env() -> dict[str, str]:
    """The environment pip runs in: the machine's pip config and PIP_* index settings ignored."""
    keep = {"PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in keep}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_NO_INPUT"] = "1"
    return env


def _interpreter(python: str) -> list[str]:
    if f"{sys.version_info.major}.{sys.version_info.minor}" == python:
        return [sys.executable]
    other = shutil.which(f"python{python}")
    if other and subprocess.run([other, "-c", "import piptools"], capture_output=True).returncode == 0:
        return [other]
    raise LockError(
        f"the lock must be resolved by Python {python} (markers differ by version) but this is "
        f"{sys.version_info.major}.{sys.version_info.minor}; install pip-tools for python{python} or run the tool with it"
    )


def compile_lock(target: Target, lock_inputs: LockInputs) -> str:
    """Run pip-compile on the inputs; return the lock text (with our header, no index lines)."""
    with tempfile.TemporaryDirectory(prefix="k3-lock-") as tmp:
        work = Path(tmp)
        for rel, data in lock_inputs.files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(data)
        index, *extra = lock_inputs.indexes
        cmd = [
            *_interpreter(lock_inputs.python), "-m", "piptools", "compile",
            "--quiet", "--no-config", "--no-header", "--generate-hashes", "--allow-unsafe",
            "--strip-extras", "--newline=LF", "--annotation-style=line",
            "--no-emit-index-url", "--no-emit-find-links", "--no-emit-trusted-host",
        ]
        cmd += ["--index-url", index]
        for url in extra:
            cmd += ["--extra-index-url", url]
        cmd += ["--output-file", "lock.txt", *lock_inputs.top]
        proc = subprocess.run(cmd, cwd=work, env=hermetic_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            tail = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
            reason = tail[-1] if tail else f"pip-compile exited {proc.returncode}"
            raise LockError(
                f"{target.name}: pip-compile failed for the {lock_inputs.kind} lock: {reason} "
                f"(indexes: {', '.join(lock_inputs.indexes)}; are they reachable from here?)"
            )
        body = (work / "lock.txt").read_text()
    if lock_inputs.kind == "runtime" and target.nccl:
        body = apply_override(body, f"nvidia-nccl-cu{target.cuda.version.split('.')[0]}", target.nccl.version,
                              _pypi_hashes, f"matrix targets.{target.name}.nccl")
    header = (
        f"# Lock for target {target.name} ({lock_inputs.kind}), made by `build lock`; do not edit.\n"
        f"# Install with: pip install --require-hashes --no-deps -r <this file>\n"
        f"{INPUT_HEADER}{lock_inputs.sha256}\n"
        f"{BODY_HEADER}{sha256_bytes(body.encode())}\n"
    )
    return header + body


_ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")


def apply_override(body: str, name: str, version: str, hashes_for, why: str) -> str:
    """Replace (or add) one entry with a forced version and its hashes, as an override file does.

    pip-tools has no overrides; the image installs with --no-deps, so the entry in the lock is what
    lands, whatever the resolver's other packages declare (vLLM does the same with uv overrides).
    """
    hashes = sorted(hashes_for(name, version))
    if not hashes:
        raise LockError(f"override {name}=={version}: no files with hashes found on the index")
    entry = [f"{name}=={version} \\"] + [f"    --hash=sha256:{h} \\" for h in hashes]
    entry[-1] = entry[-1].removesuffix(" \\")
    entry.append(f"    # via override ({why})")
    lines = body.splitlines()
    out: list[str] = []
    i = 0
    replaced = False
    norm = normalize(name)
    while i < len(lines):
        m = _ENTRY.match(lines[i])
        if m and normalize(m.group("name")) == norm:
            i += 1
            while i < len(lines) and lines[i].startswith("    "):
                i += 1
            out.extend(entry)
            replaced = True
            continue
        out.append(lines[i])
        i += 1
    if not replaced:
        out.extend(entry)
    return "\n".join(out) + "\n"


def normalize(name: str) -> str:
    """PEP 503 name normalization: how every comparison of distribution names in the tool is made."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pypi_hashes(name: str, version: str) -> list[str]:
    url = f"https://pypi.org/pypi/{name}/{version}/json"
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - fixed https URL
            doc = json.load(resp)
    except OSError as exc:
        raise LockError(f"override {name}=={version}: cannot read {url}: {exc}") from None
    return [f["digests"]["sha256"] for f in doc.get("urls", [])]


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
                headers[key] = lines[i][len(key):].strip()
        i += 1
    return headers, "".join(lines[i:])


def parse_lock(text: str, path: Path) -> tuple[str | None, list[LockEntry]]:
    """(inputs sha256 from the header, entries). Raises LockError on a malformed lock."""
    headers, body = _split_header(text)
    input_sha = headers.get(INPUT_HEADER)
    if BODY_HEADER in headers and headers[BODY_HEADER] != sha256_bytes(body.encode()):
        raise LockError(f"{path}: the lock's body does not match its {BODY_HEADER.strip()} header (truncated or "
                        "edited by hand); restore it from git or re-run `build lock`")
    entries: list[LockEntry] = []
    current: list | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith(INPUT_HEADER) or line.startswith(BODY_HEADER):
            continue
        stripped = line.strip()
        if stripped.startswith("# via override") and current is not None:
            current[3] = True
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
        current = [m.group("name"), m.group("version").rstrip(" \\"), [], False]
        entries.append(current)  # type: ignore[arg-type]
    result = [LockEntry(n, v, tuple(h), o) for n, v, h, o in entries]  # type: ignore[misc]
    for e in result:
        if not e.hashes:
            raise LockError(f"{path}: {e.name}=={e.version} has no --hash; re-run `build lock`")
    return input_sha, result


def write(root: Path, target: Target, pinned: PinnedSource) -> dict[str, Path]:
    """Compute both locks, then write them atomically (both computed before either is written)."""
    texts = {
        contract.LOCK_NAME: compile_lock(target, inputs(target, pinned, "runtime")),
        contract.BUILD_LOCK_NAME: compile_lock(target, inputs(target, pinned, "build")),
    }
    written = {}
    for name, text in texts.items():
        path = root / contract.LOCKS_DIR / target.name / name
        atomic_write(path, text)
        written[name] = path
    return written


def check_torch_build(target: Target, entries: list[LockEntry], path: Path) -> None:
    """A target that pins torch must have that CUDA's local build in its lock (e.g. +cu129)."""
    if not target.torch:
        return
    torch = next((e for e in entries if e.name.lower() == "torch"), None)
    want = target.cuda.short
    if torch is None or not torch.version.endswith(f"+{want}"):
        found = torch.version if torch else "no torch"
        raise LockError(
            f"{path}: torch must be a +{want} build for this target, the lock has {found}; "
            f"a bare PyPI torch is a CUDA 13 build that fails on r575 drivers. Re-lock with the {want} index."
        )


def read_entries(path: Path) -> list[LockEntry]:
    """A committed lock's entries; LockError when missing, unreadable, unhashed or empty."""
    return _read(path)[1]


def _read(path: Path) -> tuple[str | None, list[LockEntry]]:
    if not path.exists():
        raise LockError(
            f"{path}: no lock for this target; run `build lock --target {path.parent.name}` first "
            "(where the target's indexes are reachable) and commit it"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: unreadable lock ({exc}); restore it from git or re-run `build lock`") from None
    input_sha, entries = parse_lock(text, path)
    if BODY_HEADER.strip() not in text:
        raise LockError(f"{path}: no '{BODY_HEADER.strip()}' header; re-run `build lock`")
    if not entries:
        raise LockError(f"{path}: the lock has no entries; restore it from git or re-run `build lock`")
    return input_sha, entries


def check_current(path: Path, lock_inputs: LockInputs) -> list[LockEntry]:
    """Read a committed lock and make sure it was made from these inputs."""
    input_sha, entries = _read(path)
    if input_sha is None:
        raise LockError(f"{path}: no '{INPUT_HEADER.strip()}' header; was it edited by hand? re-run `build lock`")
    if input_sha != lock_inputs.sha256:
        raise LockError(
            f"{path}: stale: made from other inputs than the matrix and source now give; "
            f"run `build lock --target {path.parent.name}`"
        )
    return entries
