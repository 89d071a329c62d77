"""The image's files as the tool reads them on the host (issue 49): the checks' static view.

Everything here is read from the image's root filesystem as the engine exports it (a tar stream
of the checks' container, ``ContainerSeam.export``), by the tool's own code: no program of the
image runs, so nothing the image does at start-up (a ``.pth`` file, a replaced interpreter, a
shell) can change what is read. The stream is untrusted like an upstream tree: nothing is
written to disk, member names are normalised and never followed, and the number of members,
the bytes kept per file and the text files kept are capped.

What it gives the checks (builder/checks/checklist*.py), which cross-check the answers of the
probes the image's interpreter ran against it: each file's type, mode, owner and size, the
ELF header of every shared object under the application prefix (a module whose bytes are not a
loadable ELF shared object can never "load", whatever a probe printed), and /etc/passwd.
"""

from __future__ import annotations

import base64
import binascii
import csv
import hashlib
import io
import itertools
import posixpath
import re
import stat
import struct
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO

from builder.checks import elfdyn, gpuread
from builder.checks.probes import _fatbin

MAX_MEMBERS = 4_000_000  # cu129's image holds about 120,000 files
HEAD = 64  # an ELF64 header
KEPT_TEXTS = ("/etc/passwd", "/etc/group", "/etc/ld.so.preload")
# Start-up hooks (builder/checks/startup.py): every .pth file is kept, wherever it is (a few KiB each).
HOOK_TEXT = re.compile(r"(\.pth|/(?:site|user)customize(?:/__init__)?\.py)$")
# The base's dpkg records, which a start-up hook an OS package installed unchanged is held to.
DPKG_TEXT = re.compile(r"^/var/lib/dpkg/(?:status|info/[^/]+\.md5sums)$")
MAX_HOOK_TEXTS = 10_000
CAPABILITY_XATTR = "SCHILY.xattr.security.capability"  # a file capability, as a PAX record carries it
# tarfile reads a PAX or GNU long-name header whole into memory; a layer can claim gigabytes there
# (compressed to kilobytes). Longer than any name (PATH_MAX 4096) or xattr (64 KiB) a file system holds.
MAX_HEADER = 1 << 20
_EXTENDED = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
MAX_TEXT = 1 << 20
SHARED_OBJECT = re.compile(r"\.so(\.[0-9.]+)?$")  # a ".so" in its name: what the loads probe tries
ET_DYN = 3
_RECORD = re.compile(r"\.dist-info/RECORD(\.native)?$")
RUNTIMES = ("libcudart.so",)  # read wherever they are: cuda_runtime's answer is held to them
MACHINES = {"linux/amd64": 62, "linux/arm64": 183, "linux/ppc64le": 21, "linux/s390x": 22}


class UnreadableImage(ValueError):
    """The exported stream is not a tar this reader accepts (the check using it fails, naming why)."""


@dataclass(frozen=True)
class Entry:
    path: str  # absolute, normalised
    kind: str  # "file", "dir", "link" (symbolic), "hardlink", "other"
    mode: int  # permission bits, set-id and sticky included
    uid: int
    gid: int
    size: int
    head: bytes = b""  # the first HEAD bytes of a shared object under a watched root, or a CUDA runtime
    link: str = ""  # a symbolic link's target
    capability: bytes = b""  # its security.capability extended attribute (a file capability), if any


@dataclass
class ImageFiles:
    entries: dict[str, Entry] = field(default_factory=dict)
    texts: dict[str, bytes] = field(default_factory=dict)  # /etc/passwd, the RECORDs under the prefix
    hashes: dict[str, str] = field(default_factory=dict)  # sha256 (hex) of every file under the prefix
    # each shared object's under the prefix NEEDED, SONAME, RPATH, RUNPATH (elfdyn.py), or why unread
    dynamic: dict[str, elfdyn.Dynamic | str] = field(default_factory=dict)
    # with a GPU reader (``read``'s ``judge``): what each file that can hold GPU code holds (files
    # under the prefix, shared objects anywhere: gpuread.py), None-valued ones left out, or why
    # unread; and the dynamic section of each such ELF file, for the NEEDED closure (gpufound.py)
    gpu: dict[str, dict | str] = field(default_factory=dict)
    linked: dict[str, elfdyn.Dynamic | str] = field(default_factory=dict)

    def record_problems(self, root: str) -> list[tuple[str, str]]:
        """(path, why) of every file a RECORD (or RECORD.native) under ``root`` hashes that is
        missing from the image or holds other bytes, all read on the host: what installed_files'
        probe answers is held to this."""
        found = []
        for record, text in sorted(self.texts.items()):
            if not record.startswith(root.rstrip("/") + "/") or not _RECORD.search(record):
                continue
            site, name = posixpath.dirname(posixpath.dirname(record)), posixpath.basename(posixpath.dirname(record))
            for row in csv.reader(io.StringIO(text.decode("utf-8", "replace"))):
                if len(row) < 2 or not row[1].startswith("sha256="):
                    continue
                path = posixpath.normpath(posixpath.join(site, row[0]))
                if not path.startswith(root.rstrip("/") + "/"):
                    continue  # outside the prefix: not hashed here
                want = _hex(row[1].removeprefix("sha256="))
                if path not in self.hashes:
                    found.append((path, f"missing (listed in {record}; read on the host)"))
                elif self.hashes[path] != want:
                    found.append((path, f"sha256 differs from {name}/{posixpath.basename(record)} (read on the host)"))
        return found

    def under(self, root: str) -> Iterable[Entry]:
        top = root.rstrip("/") + "/"
        return (e for p, e in sorted(self.entries.items()) if p.startswith(top))

    def world_writable(self, allowed: tuple[str, ...] = ("/tmp",)) -> list[str]:
        """Files writable by all, and directories writable by all without the sticky bit (no_world_writable)."""
        found = []
        for path, e in sorted(self.entries.items()):
            if e.kind == "link" or not e.mode & stat.S_IWOTH or path in allowed or _virtual(path):
                continue
            if e.kind != "dir" or not e.mode & stat.S_ISVTX:
                found.append(path)
        return found

    def setid(self, root: str) -> list[tuple[str, str]]:
        """(path, mode) of every set-user-ID or set-group-ID file under ``root``."""
        return [
            (e.path, oct(e.mode & 0o7777))
            for e in self.under(root)
            if e.kind in ("file", "hardlink") and e.mode & (stat.S_ISUID | stat.S_ISGID)
        ]

    def uid_of(self, user: str) -> int | None:
        """The uid the config's ``user`` (name or number, ``:group`` ignored) runs as, by the image's
        /etc/passwd; None when it names nobody there."""
        name = user.split(":")[0] or "root"
        if name.isdigit():
            return int(name)
        for line in self.texts.get("/etc/passwd", b"").decode("utf-8", "replace").splitlines():
            parts = line.split(":")
            if len(parts) >= 3 and parts[0] == name and parts[2].isdigit():
                return int(parts[2])
        return None

    def not_loadable(self, root: str, platform: str | None) -> list[tuple[str, str]]:
        """(path, why) of every shared object under ``root`` whose bytes are not an ELF shared object
        of ``platform``'s machine (None: any machine): such a file can never load or import."""
        machine = MACHINES.get(platform or "")
        found = []
        for e in self.under(root):
            if e.kind != "file" or not SHARED_OBJECT.search(e.path):
                continue
            why = elf_problem(e.head, machine)
            if why:
                found.append((e.path, f"{why} (read on the host, not by the image)"))
        return found

    def resolve(self, path: str) -> Entry | None:
        """The entry ``path`` leads to, its links followed on the listing as the kernel would
        (at most 40); None when it leads nowhere in the image."""
        parts, done, hops = [p for p in path.split("/") if p], "", 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            here = done.rsplit("/", 1)[0] if part == ".." else f"{done}/{part}"
            entry = self.entries.get(here or "/")
            if entry is not None and entry.kind == "link":
                hops += 1
                if hops > 40:
                    return None
                base = "" if entry.link.startswith("/") else done
                parts = [p for p in f"{base}/{entry.link}".split("/") if p] + parts
                done = ""
                continue
            done = here
        return self.entries.get(done or "/")

    def runtime_problem(self, path: str, platform: str | None) -> str | None:
        """Why the CUDA runtime a probe reports at ``path`` is not a loadable ELF shared object in
        the image as the host reads it (None: it is)."""
        entry = self.resolve(path)
        if entry is None or entry.kind != "file":
            return "no such file in the image (read on the host)"
        why = elf_problem(entry.head, MACHINES.get(platform or ""))
        return f"{why} (read on the host)" if why else None


def elf_problem(head: bytes, machine: int | None) -> str | None:
    """Why ``head`` (a file's first bytes) is not an ELF shared object a process of ``machine`` loads."""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return "not an ELF file: its bytes start " + (head[:8].hex() or "(empty)")
    if head[4] not in (1, 2) or head[5] not in (1, 2):
        return f"not a valid ELF file (class {head[4]}, data {head[5]})"
    end = "<" if head[5] == 1 else ">"
    e_type, e_machine = struct.unpack(end + "HH", head[16:20])
    if e_type != ET_DYN:
        return f"not an ELF shared object (e_type {e_type})"
    if machine is not None and e_machine != machine:
        return f"an ELF file of machine {e_machine}, not the image's ({machine})"
    return None


class BoundedInfo(tarfile.TarInfo):
    """A member as tarfile reads it, but an extended header past MAX_HEADER is refused (a TarError)
    before it is read: tarfile has no bound of its own (``_proc_member`` is where it reads one)."""

    def _proc_member(self, tarfile_):
        if self.type in _EXTENDED and self.size > MAX_HEADER:
            raise tarfile.HeaderError(f"an extended header of {self.size} bytes (more than {MAX_HEADER})")
        return super()._proc_member(tarfile_)  # type: ignore[misc]  # private to tarfile, in every 3.x


def capability(pax: Mapping[str, str]) -> bytes:
    """A member's file capability: SCHILY.xattr.security.capability (what Docker and containerd
    apply), or another writer's form of the same attribute (libarchive's LIBARCHIVE.xattr.*)."""
    for key, value in pax.items():
        if key == CAPABILITY_XATTR or key.endswith("xattr.security.capability"):
            return value.encode("utf-8", "surrogateescape") or b"(empty)"
    return b""


def _hex(urlsafe: str) -> str:
    """RECORD's urlsafe-base64 sha256 (no padding) as hex; "" when it is not one."""
    try:
        return base64.urlsafe_b64decode(urlsafe + "=" * (-len(urlsafe) % 4)).hex()
    except (binascii.Error, ValueError):
        return ""


def _virtual(path: str) -> bool:
    return path.split("/")[1:2] in (["proc"], ["sys"], ["dev"])


def _normal(name: str) -> str | None:
    """The absolute path a member names, or None for a name no file system has (``..``, NUL)."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if "\0" in name or ".." in parts:
        return None
    return "/" + "/".join(parts)


def _kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "link"
    return "hardlink" if member.islnk() else "other"


def read(stream: IO[bytes], watch: tuple[str, ...], judge: gpuread.Judge | None = None) -> ImageFiles:
    """The static view of an exported root filesystem: ``stream`` read once, forward only; under
    the ``watch`` roots every file hashed, the first bytes of each shared object and each RECORD kept;
    with ``judge``, the GPU code of every file under them and of every shared object (``gpu``)."""
    tops = tuple(w.rstrip("/") + "/" for w in watch)
    view = ImageFiles()
    try:
        with tarfile.open(fileobj=stream, mode="r|", tarinfo=BoundedInfo) as tar:
            for count, member in enumerate(tar):
                if count >= MAX_MEMBERS:
                    raise UnreadableImage(f"more than {MAX_MEMBERS} files")
                path = _normal(member.name)
                if path is None:
                    raise UnreadableImage(f"a member named {member.name[:200]!r}")
                head, kind = b"", _kind(member)
                if kind == "file":
                    head = _read_file(tar, member, path, path.startswith(tops), view, judge)
                elif kind == "hardlink":
                    _same_bytes(view, path, _normal(member.linkname), tops if judge is not None else None)
                link = member.linkname if kind == "link" else ""
                cap = capability(member.pax_headers)
                view.entries[path] = Entry(
                    path, kind, member.mode, member.uid, member.gid, member.size, head, link, cap
                )
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UnreadableImage(f"the exported file system is not a readable tar: {exc}") from None
    return view


def _same_bytes(view: ImageFiles, path: str, target: str | None, tops: tuple[str, ...] | None) -> None:
    """A hard link holds its target's bytes: what the GPU reader found there is found here too. A
    link under a watched root (``tops``, with a GPU reader) to a file outside them that was not read
    as a shared object is unread: its bytes passed before anyone knew they were under the prefix."""
    if target in view.gpu:
        view.gpu[path] = view.gpu[target]
    elif tops and path.startswith(tops) and not (target or "").startswith(tops) and target not in view.linked:
        view.gpu[path] = f"a hard link to {str(target)[:200]!r} outside the prefix, whose bytes were not read"
    if target in view.linked:
        view.linked[path] = view.linked[target]


def _gpu_shape(path: str, first: bytes, watched: bool) -> str | None:
    """Which GPU reading a file gets (``_fatbin.gpu_shape``): every shape under a watched root; an
    ELF shared object (ET_DYN) elsewhere, which a NEEDED closure can reach."""
    shape = _fatbin.gpu_shape(path, first[:HEAD])
    if watched or shape is None:
        return shape
    return shape if shape == "elf" and struct.unpack_from("<H", first, 16)[0] == ET_DYN else None


def _read_file(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    path: str,
    watched: bool,
    view: ImageFiles,
    judge: gpuread.Judge | None = None,
) -> bytes:
    """What the view keeps of one regular file: its head (shared objects, CUDA runtimes), its sha256
    (under a watched root, or read for GPU code), its text (KEPT_TEXTS, RECORDs under a watched
    root, every .pth file), its GPU code (with ``judge``); returns the head."""
    runtime = path.rsplit("/", 1)[-1].startswith(RUNTIMES)
    record = watched and _RECORD.search(path) is not None
    hook = HOOK_TEXT.search(path) is not None or DPKG_TEXT.match(path) is not None
    record = record or (hook and len(view.texts) < MAX_HOOK_TEXTS)
    text = path in KEPT_TEXTS or elfdyn.CONF.match(path) is not None
    if not (watched or runtime or record or text or (judge is not None and member.size >= HEAD)):
        return b""
    data = tar.extractfile(member)
    assert data is not None, "a regular member always has data"
    first = data.read(1 << 20)
    shape = _gpu_shape(path, first, watched) if judge is not None and len(first) >= HEAD else None
    if not (watched or runtime or record or text or shape):
        return b""
    spool = gpuread.Spool(shape) if shape else None
    digest, head, kept = hashlib.sha256(), b"", bytearray()
    dyn = elfdyn.Capture() if (watched and SHARED_OBJECT.search(path)) or shape == "elf" else None
    for chunk in itertools.chain((first,), iter(lambda: data.read(1 << 20), b"")):
        if len(head) < HEAD:
            head += chunk[: HEAD - len(head)]
        if (record or text) and len(kept) < MAX_TEXT * 8:
            kept += chunk[: MAX_TEXT * 8 - len(kept)]
        if dyn is not None:
            dyn.feed(chunk)
        if spool is not None:
            spool.feed(chunk)
        digest.update(chunk)
    if watched:
        view.hashes[path] = digest.hexdigest()
    if record or text:
        view.texts[path] = bytes(kept)
    found = dyn.result() if dyn is not None else None
    if found is not None and watched and SHARED_OBJECT.search(path):
        view.dynamic[path] = found
    if found is not None and shape == "elf":
        view.linked[path] = found
    if spool is not None and judge is not None and (gpu := spool.result(digest.hexdigest(), judge)) is not None:
        view.gpu[path] = gpu
    return head if (watched and SHARED_OBJECT.search(path)) or runtime else b""
