"""The build context, assembled on the host: locks, a hash-checked wheelhouse, the interpreter.

Everything the build stage installs is downloaded here, outside the engine: the host verifies
each file against the lock's sha256 (pip --require-hashes) or the matrix's (the CPython tarball),
so RUN steps need no network and no certificates, and the build is hermetic. Every file's mtime
is set to SOURCE_DATE_EPOCH so the context, like the source export, is a pure function of inputs.
"""

from __future__ import annotations

import contextlib
import csv
import email.parser
import fcntl
import fnmatch
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from builder import log
from builder.config import contract
from builder.config.matrix import Target
from builder.config.names import normalize
from builder.deps.hermetic import hermetic_env
from builder.dockerfile import render
from builder.errors import BuildError, LockError, Unreachable, failure_kind
from builder.fsutil import atomic_write, cache_dir, cache_sealed, clamp_mtimes, sha256_file

# Splits the application layer and compiles each layer's bytecode inside the build (its docstring).
LAYER_SCRIPT = Path(__file__).resolve().parents[1] / "dockerfile" / "templates" / "layer_files.py"


@contextlib.contextmanager
def _entry_lock(dest: Path) -> Iterator[None]:
    """One filler per cache entry: checkouts sharing the cache wait for each other here."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(dest.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _sealed(what: str) -> None:
    """A rebuild from the escrow reads only its own cache: what is not there is not downloaded."""
    if cache_sealed():
        raise LockError(f"{what}: not in the escrow's files, and a rebuild from the escrow downloads nothing")


def _download(target: Target, lock: Path, into: Path) -> None:
    _sealed(f"{lock}: the locked wheels")
    py = target.python.version
    index, *extra = target.lock_indexes()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--require-hashes",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        py,
        "--abi",
        "cp" + py.replace(".", ""),
        "--dest",
        str(into),
        "--index-url",
        index,
    ]
    for url in extra:
        cmd += ["--extra-index-url", url]
    for platform in target.python.wheel_platforms():
        cmd += ["--platform", platform]
    cmd += ["-r", str(lock)]
    proc = subprocess.run(cmd, env=hermetic_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        kind = failure_kind(proc.stderr, LockError)
        raise kind(
            f"{lock}: downloading the locked wheels failed: {lines[-1] if lines else proc.returncode} "
            "(a hash mismatch means the index changed a file; re-run `build lock`)"
        )


def _wheelhouse(target: Target, lock: Path) -> Path:
    """The lock's files in a cache entry keyed by the lock's own hash, filled atomically (a unique
    partial directory renamed into place, under the entry's lock); reused when complete."""
    key = sha256_file(lock)
    dest = cache_dir() / "wheelhouse" / key
    with _entry_lock(dest):
        if (dest / ".complete").exists():
            return dest
        if dest.exists():
            shutil.rmtree(dest)
        partial = Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".partial", dir=dest.parent))
        try:
            _download(target, lock, partial)
            (partial / ".complete").write_text(key + "\n")
            partial.rename(dest)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return dest


class _CorruptCache(Exception):
    pass


def _copy_tree(src: Path, dest_for: dict[str, Path]) -> None:
    """Copy a cache entry into the context, hashing as it copies, each file to the directory its
    sha256 belongs to: a file whose sha256 is not in the lock means a damaged cache entry (never a
    hard link: an edit under artifacts/ must not reach the shared cache, and the context's mtimes
    are clamped afterwards)."""
    for item in sorted(src.iterdir()):
        if item.name.startswith("."):
            continue
        digest = hashlib.sha256()
        tmp = item.name + ".copying"
        first = next(iter(dest_for.values()))
        first.mkdir(parents=True, exist_ok=True)
        with item.open("rb") as fin, (first / tmp).open("wb") as fout:
            for chunk in iter(lambda: fin.read(1 << 20), b""):
                digest.update(chunk)
                fout.write(chunk)
        dest = dest_for.get(digest.hexdigest())
        if dest is None:
            (first / tmp).unlink()
            raise _CorruptCache(f"{item}: sha256 {digest.hexdigest()[:16]} is not in the lock")
        dest.mkdir(parents=True, exist_ok=True)
        (first / tmp).rename(dest / item.name)


def _wheels_into(target: Target, lock: Path, dest_for: dict[str, Path]) -> None:
    """The lock's wheels, verified, each in the directory of its hash; a damaged cache entry is
    dropped and fetched again."""
    for attempt in (1, 2):
        entry = _wheelhouse(target, lock)
        try:
            _copy_tree(entry, dest_for)
            return
        except _CorruptCache as exc:
            for dest in set(dest_for.values()):
                shutil.rmtree(dest, ignore_errors=True)
            with _entry_lock(entry):
                shutil.rmtree(entry, ignore_errors=True)
            if attempt == 2:
                raise LockError(f"the wheel cache {entry} was damaged twice ({exc}); check the disk") from None
            log.warn(f"the wheel cache entry {entry} was damaged ({exc}); dropped, fetching it again")


def _standalone_python(target: Target) -> Path:
    """The pinned CPython tarball from the machine-wide cache (keyed by its sha256), downloaded once,
    no further than contract.STANDALONE_MAX_BYTES, and hash-checked."""
    spec = target.python.standalone
    assert spec is not None
    where = f"{target.name}: python.standalone.url"
    limit = (contract.STANDALONE_MAX_BYTES, f"the {contract.STANDALONE_MAX_BYTES} bytes a CPython tarball may have")
    dest = _python_path(spec.sha256)
    return _fetch_pinned(spec.url, spec.sha256, dest, where, "the CPython tarball", limit, "the matrix")


def copy_capped(src, out, limit: int, chunk: int = 1 << 16) -> int:
    """Copy at most ``limit`` + 1 bytes: the byte past the lock's size is enough to refuse the file,
    so a hostile or broken archive streaming gigabytes for a 36 KB package costs one chunk more."""
    copied = 0
    while copied <= limit:
        data = src.read(min(chunk, limit + 1 - copied))
        if not data:
            break
        out.write(data)
        copied += len(data)
    return copied


def _fetch_deb(entry) -> Path:
    """One locked .deb from the machine-wide cache (keyed by its sha256), downloaded once, no
    further than its locked size, and hash-checked."""
    dest = _deb_path(entry.sha256)
    limit = (entry.size, f"the locked {entry.size} bytes")
    return _fetch_pinned(entry.url, entry.sha256, dest, contract.OS_LOCK_NAME, entry.filename, limit, "the lock")


def _fetch_pinned(url: str, sha256: str, dest: Path, where: str, what: str, limit: tuple[int, str], pin: str) -> Path:
    """``dest``, the file at ``url`` whose sha256 ``pin`` (the lock, the matrix) states, downloaded
    under the entry's lock no further than ``limit`` (bytes, how the message says it) and refused
    unless it has that hash: a download that does not match is deleted and refused (exit 2), one
    that does not arrive is Unreachable (exit 3), so no file of another hash is ever cached or put
    in a context."""
    with _entry_lock(dest):
        if dest.exists() and sha256_file(dest) == sha256:
            return dest
        dest.unlink(missing_ok=True)  # damaged or swapped: fetched again below
        _sealed(f"{where}: {what} (sha256 {sha256[:16]}...)")
        tmp = dest.with_name(dest.name + f".{os.getpid()}.partial")
        try:
            with urllib.request.urlopen(url, timeout=120) as resp, tmp.open("wb") as out:  # noqa: S310
                copied = copy_capped(resp, out, limit[0])
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise Unreachable(
                f"{url}: cannot download {what} ({getattr(exc, 'reason', exc)}); is the archive reachable from here?"
            ) from None
        if copied > limit[0]:
            tmp.unlink()
            raise LockError(
                f"{where}: {what} from {url} is longer than {limit[1]}; the archive changed the file, refused "
                "(the download was stopped there)"
            )
        got = sha256_file(tmp)
        if got != sha256:
            tmp.unlink()
            raise LockError(
                f"{where}: {what} from {url} has sha256 {got[:16]}..., {pin} says {sha256[:16]}...; "
                "the archive changed the file, refused"
            )
        tmp.rename(dest)
    return dest


def _debs(entries, dest: Path) -> None:
    """debs/<name>_<version>_<arch>.deb for each OS lock entry, each copied and hashed again."""
    (dest / "debs").mkdir()
    for entry in entries:
        target = dest / "debs" / entry.filename
        shutil.copyfile(_fetch_deb(entry), target)
        if sha256_file(target) != entry.sha256:  # the cache changed under us: never build it
            raise LockError(
                f"{target}: sha256 differs from {contract.OS_LOCK_NAME}; the deb cache is being written "
                "to by something else, try again"
            )


def layer_of(target: Target, name: str) -> str:
    """The layer a runtime lock entry goes to: the first matrix group matching its name, else deps."""
    norm = normalize(name)
    return next(
        (layer.name for layer in target.layers if any(fnmatch.fnmatchcase(norm, p) for p in layer.match)), "deps"
    )


def _entry_text(entry) -> str:
    lines = [f"{entry.name}=={entry.version} \\"] + [f"    --hash=sha256:{h} \\" for h in entry.hashes]
    return "\n".join(lines).rstrip(" \\") + "\n"


def _layers(target: Target, entries, dest: Path) -> dict[str, Path]:
    """layers/<layer>.txt (that layer's lock entries) for each layer; sha256 -> wheel directory."""
    (dest / "layers").mkdir()
    texts: dict[str, str] = {name: "" for name in contract.layer_names(target.layers)}
    dest_for: dict[str, Path] = {}
    for entry in entries:
        layer = layer_of(target, entry.name)
        texts[layer] += _entry_text(entry)
        dest_for.update({h: dest / "wheelhouse" / "layers" / layer for h in entry.hashes})
    for layer, text in texts.items():
        (dest / "layers" / f"{layer}.txt").write_text(text)
        (dest / "wheelhouse" / "layers" / layer).mkdir(parents=True, exist_ok=True)
    return dest_for


def _scripts_into(dockerfile_text: str, dest: Path) -> None:
    """The scripts the Dockerfile names by sha256 (so the input key and the record do), copied from
    bytes read once and refused if they are not those any more."""
    for path, want in render.scripts_named(dockerfile_text).items():
        data = (render.TEMPLATES / contract.CONTEXT_SCRIPTS[path]).read_bytes()
        if hashlib.sha256(data).hexdigest() != want:
            raise BuildError(
                f"builder/dockerfile/templates/{contract.CONTEXT_SCRIPTS[path]} changed during the build "
                f"(the Dockerfile names sha256:{want[:12]}...); run the build again"
            )
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(data)


def assemble(target: Target, locks, dest: Path, epoch: int, dockerfile_text: str) -> Path:
    """Build the default context at ``dest``: the two locks (a ``plan.LockSet``), the runtime lock
    split by layer (layers/<layer>.txt, wheelhouse/layers/<layer>/), wheelhouse/build, python/, and
    debs/ (the OS lock's packages, hash-checked) for a target with os_packages, and the scripts the
    Dockerfile (``dockerfile_text``, as checked and hashed) names by sha256."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    # The bytes hashed when the locks were read, never the files again: pip downloads from these copies.
    runtime, build = dest / contract.LOCK_NAME, dest / contract.BUILD_LOCK_NAME
    runtime.write_text(locks.runtime_text, encoding="utf-8")
    build.write_text(locks.build_text, encoding="utf-8")
    _wheels_into(target, runtime, _layers(target, locks.runtime_entries, dest))
    _wheels_into(target, build, {h: dest / "wheelhouse" / "build" for e in locks.build_entries for h in e.hashes})
    _scripts_into(dockerfile_text, dest)
    if locks.os_entries:
        _debs(locks.os_entries, dest)
    if target.python.provider == "standalone":
        shutil.copyfile(_standalone_python(target), dest / "python" / "cpython.tar.gz")
    atomic_write(dest / ".dockerignore", "")  # the context is already exactly what the build reads
    clamp_mtimes(dest, epoch)
    return dest


# --- each locked wheel's RECORD, recorded at build time (image.json ``wheel_records``) ---------------
# pip rewrites RECORD as it installs: it adds INSTALLER, REQUESTED and direct_url.json, moves
# ``<name>.data/purelib|platlib/`` into site-packages and scripts and headers out of it (rewriting
# scripts' shebangs, so their hashes change), and adds the console scripts it generates; every
# other line (path, hash, size) it copies verbatim. The canonical entries are the lines both RECORDs
# share, so one digest of them, made here from the wheel pip installed, must equal the one the
# installed_files probe (builder/checks/probes/installed.py, which repeats this rule in its own
# standard-library text) makes from the RECORD in the image: a file edited after the install and
# its RECORD line re-hashed to match changes the digest.
PIP_WRITES = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "RECORD.jws", "RECORD.p7s")


def canonical_entries(rows: Iterable[list[str]]) -> list[str]:
    """The "path,hash,size" lines of RECORD ``rows`` that pip installs into site-packages as they
    are, sorted (bytecode under __pycache__ aside: the bytecode_matches check owns it)."""
    kept = set()
    for row in rows:
        if not row or not row[0]:
            continue
        parts = row[0].split("/")
        if parts[0].endswith(".data"):
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue  # scripts, headers, data: installed outside site-packages
            parts = parts[2:]
        if parts[0] == ".." or (len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] in PIP_WRITES):
            continue
        if "__pycache__" in parts and parts[-1].endswith(".pyc"):
            continue
        kept.add(",".join(["/".join(parts), *(row[1:3] + ["", ""])[:2]]))
    return sorted(kept)


def record_digest(rows: Iterable[list[str]]) -> dict[str, object]:
    entries = canonical_entries(rows)
    return {"entries": len(entries), "sha256": hashlib.sha256("".join(e + "\n" for e in entries).encode()).hexdigest()}


def _wheel_record(path: Path) -> tuple[str, dict[str, object]]:
    name, version = path.name.split("-")[:2]
    try:
        with zipfile.ZipFile(path) as whl:
            infos = [n for n in whl.namelist() if n.count("/") == 1 and n.split("/")[0].endswith(".dist-info")]
            meta = next(n for n in infos if n.endswith("/METADATA"))
            head = email.parser.Parser().parsestr(whl.read(meta).decode("utf-8"), headersonly=True)
            name, version = head["Name"] or name, head["Version"] or version
            rows = list(csv.reader(io.StringIO(whl.read(meta[: -len("METADATA")] + "RECORD").decode("utf-8"))))
    except (OSError, StopIteration, KeyError, UnicodeDecodeError, zipfile.BadZipFile, csv.Error) as exc:
        return normalize(name), {"version": version, "error": f"{path.name}: no readable RECORD ({exc})"[:200]}
    return normalize(name), {"version": version, **record_digest(rows)}


def wheel_records(wheelhouse: Path) -> dict[str, dict[str, object]]:
    """Normalized name -> {version, entries, sha256} of the canonical RECORD entries of every wheel
    under ``wheelhouse`` (the context's wheelhouse/layers: what the image installs, each wheel
    hash-checked against the lock); {version, error} for a wheel whose RECORD cannot be read."""
    return dict(sorted((_wheel_record(p) for p in wheelhouse.rglob("*.whl")), key=lambda kv: kv[0]))


# What `build escrow` reads: the same hash-checked cache entries the context is copied from,
# downloaded again (and checked again) when the cache lost them.
def wheelhouse(target: Target, lock: Path) -> Path:
    """The directory holding every wheel of ``lock`` (a ``.complete`` cache entry)."""
    return _wheelhouse(target, lock)


def fetch_deb(entry) -> Path:
    """The cached .deb of an OS lock entry, its sha256 checked."""
    return _fetch_deb(entry)


def standalone_python(target: Target) -> Path:
    """The cached CPython tarball a standalone-Python target names, its sha256 checked."""
    return _standalone_python(target)


def _deb_path(sha256: str) -> Path:
    return cache_dir() / "debs" / f"{sha256}.deb"


def _python_path(sha256: str) -> Path:
    return cache_dir() / "python" / f"{sha256}.tar.gz"


# What a rebuild from the escrow fills its own cache with (builder/escrow/offline.py): the entries a
# download would have filled, so the context is copied from them and hash-checked as always.
def seed_wheelhouse(lock: Path, wheels: Iterable[Path]) -> None:
    """A complete cache entry for ``lock`` holding ``wheels`` (checked against the lock when the
    context is copied from it, as a downloaded entry is)."""
    key = sha256_file(lock)
    dest = cache_dir() / "wheelhouse" / key
    with _entry_lock(dest):
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        for wheel in wheels:
            _link(wheel, dest / wheel.name)
        (dest / ".complete").write_text(key + "\n")


def seed_deb(sha256: str, path: Path) -> None:
    _link(path, _deb_path(sha256))


def seed_python(sha256: str, path: Path) -> None:
    _link(path, _python_path(sha256))


def _link(src: Path, dest: Path) -> None:
    """A hard link where it can (an escrow's wheels are large), else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
