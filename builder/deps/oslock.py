"""OS packages locked like wheels: ``locks/<target>/os-packages.txt``.

`build lock` resolves the matrix's ``os_packages`` against the runtime base's own dpkg database:
a throwaway container of the pinned runtime base gets one apt source per suite (the matrix's archive, suites
and components, checked with the base's own archive keyring), runs ``apt-get update`` and
``apt-get install --print-uris --no-install-recommends``, and prints what apt would download.
Packages the base already has are not downloaded, so they are not in the lock; a closure that
would upgrade or replace a package of the base is a version conflict (exit 2), because the base's
dpkg database would then describe files the OS layer shadows.

Each lock line is ``name version arch url size sha256``; the sha256 is the one apt read from the
archive's signed index. The header carries the same input and body hashes as the Python locks
(builder/deps/lock.py), so a changed package list, version pin, archive or base makes the lock stale,
and an edited line fails its body hash.
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from builder.config.matrix import OsPackages, Target
from builder.deps.lock import BODY_HEADER, INPUT_HEADER, _split_header
from builder.errors import LockError, Unreachable, is_network_failure
from builder.fsutil import sha256_bytes

_LINE = re.compile(
    r"(?P<name>[a-z0-9][a-z0-9.+-]+) (?P<version>(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*) "
    r"(?P<arch>[a-z0-9-]+) (?P<url>https?://\S+\.deb) (?P<size>[0-9]+) sha256:(?P<sha256>[0-9a-f]{64})"
)
# One line of `apt-get install --print-uris`: 'URL' FILE SIZE [HASHTYPE:HEX] (an -updates index
# may give no MD5Sum, and then apt prints no hash at all: the SHA256 comes from apt-cache show).
_URI = re.compile(r"'(?P<url>[^' ]+)' (?P<file>\S+\.deb) (?P<size>[0-9]+)(?: (?P<hash>\S+))?")


@dataclass(frozen=True)
class DebEntry:
    name: str
    version: str
    arch: str
    url: str
    size: int
    sha256: str

    @property
    def filename(self) -> str:  # what the build context calls it (no epoch colon in a file name)
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.arch}.deb"

    def line(self) -> str:
        return f"{self.name} {self.version} {self.arch} {self.url} {self.size} sha256:{self.sha256}"


def inputs_sha256(target: Target) -> str:
    """What the OS lock is a function of: the package list with pins, where versions come from,
    and the runtime base (its dpkg database decides what is already there)."""
    osp = target.os_packages
    assert osp is not None
    doc = {
        "archive": osp.archive,
        "suites": list(osp.suites),
        "components": list(osp.components),
        "packages": [[p.name, p.version] for p in osp.packages],
        "base": target.bases.runtime.digest,
    }
    return sha256_bytes(json.dumps(doc, sort_keys=True).encode())


def _requests(osp: OsPackages) -> list[str]:
    return [f"{p.name}={p.version}" if p.version else p.name for p in osp.packages]


def resolve_script(osp: OsPackages) -> str:
    """The shell the throwaway container runs. It always exits 0 and says what happened in
    K3-* lines, so apt's own message reaches the caller whatever failed."""
    source = "\n".join(f"deb {osp.archive} {suite} {' '.join(osp.components)}" for suite in osp.suites)
    want = " ".join(shlex.quote(r) for r in _requests(osp))
    return rf"""
export DEBIAN_FRONTEND=noninteractive
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
printf '%s\n' {shlex.quote(source)} > /etc/apt/sources.list.d/k3-os-packages.list
apt-get -o Acquire::Retries=2 -o Acquire::http::Timeout=30 -qq update > /tmp/update.log 2>&1
echo "K3-UPDATE $?"; sed 's/^/K3-LOG /' /tmp/update.log
echo "K3-ARCH $(dpkg --print-architecture)"
dpkg-query -W -f='K3-HAVE ${{Package}}\n' 2>/dev/null
apt-get -qq install -s --no-install-recommends -y {want} > /tmp/sim 2>&1
echo "K3-INSTALL $?"; sed 's/^/K3-SIM /' /tmp/sim
apt-get -qq install --print-uris --no-install-recommends -y {want} 2>/dev/null | sed 's/^/K3-URI /'
for spec in $(sed -n 's/^Inst \([^ ]*\) \(\[[^]]*\] \)\{{0,1\}}(\([^ ]*\) .*/\1=\3/p' /tmp/sim); do
  apt-cache show --no-all-versions "$spec" 2>&1 \
    | grep -E '^(Package|Version|Architecture|Filename|Size|SHA256):' | sed 's/^/K3-PKG /'
  echo "K3-PKG --"
done
"""


def _lines(out: str, tag: str) -> list[str]:
    return [ln[len(tag) + 1 :] for ln in out.splitlines() if ln.startswith(tag + " ")]


def _status(out: str, tag: str) -> int:
    found = _lines(out, tag)
    return int(found[0]) if found and found[0].isdigit() else -1


def parse_resolution(out: str, osp: OsPackages, where: str) -> list[DebEntry]:
    """The resolved closure from the container's output; Unreachable when the archive did not
    answer, LockError for a package it lacks or a closure that conflicts with the base."""
    log = " ".join(_lines(out, "K3-LOG"))
    if _status(out, "K3-UPDATE") != 0 or re.search(r"(^| )W: (Failed to fetch|Some index files failed)", log):
        if re.search(r"\b404\s+Not Found", log):  # the archive answered: that suite or component is not there
            raise LockError(
                f"{where}.suites: {osp.archive} has no {' '.join(osp.suites)} ({' '.join(osp.components)}): "
                f"{log[-200:]}"
            )
        if is_network_failure(log) or "Could not resolve" in log or "Failed to fetch" in log or not log:
            raise Unreachable(
                f"{where}.archive: {osp.archive} is not reachable from a container of the runtime base "
                f"({log[-200:] or 'no answer'}); run `build lock` where it is"
            )
        raise LockError(
            f"{where}.archive: apt-get update failed for {osp.archive} {' '.join(osp.suites)}: {log[-300:]}"
        )
    sim = _lines(out, "K3-SIM")
    if _status(out, "K3-INSTALL") != 0:
        errors = [ln for ln in sim if ln.startswith("E:")] or sim[-2:]
        raise LockError(
            f"{where}.packages: apt cannot install {' '.join(_requests(osp))} on the runtime base from "
            f"{osp.archive} {' '.join(osp.suites)}: {' '.join(errors)[:400]}"
        )
    # "Inst name [installed] (new ...)": a package of the base the closure would replace; "Remv name
    # [installed]": one it would remove.
    conflicts = [f"{m[1]} {m[3]} (the base has {m[2]})" for m in (_INST.match(ln) for ln in sim) if m and m[2]]
    conflicts += [f"{ln.split()[1]} (removed from the base)" for ln in sim if ln.startswith("Remv ")]
    if conflicts:
        raise LockError(
            f"{where}.packages: version conflict with the runtime base: the closure would replace "
            f"{', '.join(conflicts)}; pin versions the base's release serves"
        )
    _exact_names(osp, {m[1] for m in (_INST.match(ln) for ln in sim) if m} | set(_lines(out, "K3-HAVE")), where)
    arch = (_lines(out, "K3-ARCH") or ["?"])[0]
    uris = {m["url"] for m in (_URI.fullmatch(u.strip()) for u in _lines(out, "K3-URI")) if m}
    entries = [_entry(block, osp.archive, where) for block in _blocks(_lines(out, "K3-PKG"))]
    wanted = {m[1] for m in (_INST.match(ln) for ln in sim) if m}
    if {e.name for e in entries} != wanted:
        raise LockError(
            f"{where}: apt-cache describes {sorted(e.name for e in entries)}, apt installs {sorted(wanted)}"
        )
    for e in entries:
        if e.arch not in (arch, "all"):
            raise LockError(f"{where}: {e.filename}: architecture {e.arch} is not the base's {arch}")
        if e.url not in uris and urllib.parse.unquote(e.url) not in {urllib.parse.unquote(u) for u in uris}:
            raise LockError(f"{where}: {e.url} is not what apt would download ({len(uris)} URIs)")
    return sorted(entries, key=lambda e: e.name)


_INST = re.compile(r"Inst (\S+) (?:\[(\S+)\] )?\((\S+) ")


def _exact_names(osp: OsPackages, known: set[str], where: str) -> None:
    """Each requested name is a package apt installs or the base has, by that exact name: apt
    reads a name no package has as a regex or a glob and installs whatever matches (issue 32)."""
    loose = [p.name for p in osp.packages if p.name not in known and p.name.split(":")[0] not in known]
    if loose:
        raise LockError(
            f"{where}.packages: {', '.join(loose)}: no package has that exact name (apt read it as a "
            "pattern and matched others); name each package exactly"
        )


def _blocks(lines: list[str]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    for ln in lines:
        if ln == "--":
            if cur:
                out.append(cur)
            cur = {}
            continue
        key, _, value = ln.partition(": ")
        cur.setdefault(key, value.strip())
    return out


def _entry(block: dict[str, str], archive: str, where: str) -> DebEntry:
    name = block.get("Package", "?")
    if not re.fullmatch(r"[0-9a-f]{64}", block.get("SHA256", "")):
        raise LockError(f"{where}: the archive's index gives no SHA256 for {name}; a lock needs one")
    if not re.fullmatch(r"pool/[A-Za-z0-9._+~%/-]+\.deb", block.get("Filename", "")):
        raise LockError(f"{where}: {name}: unexpected Filename {block.get('Filename', '')[:60]!r} in the index")
    url = f"{archive}/{urllib.parse.quote(block['Filename'])}"
    return DebEntry(name, block["Version"], block["Architecture"], url, int(block["Size"]), block["SHA256"])


def lock_text(target: Target, entries: list[DebEntry]) -> str:
    osp = target.os_packages
    assert osp is not None
    body = "".join(e.line() + "\n" for e in entries)
    return (
        f"# OS packages of target {target.name}, made by `build lock`; do not edit.\n"
        f"# Resolved against {target.bases.runtime.ref} from {osp.archive} "
        f"{' '.join(osp.suites)} ({' '.join(osp.components)})\n"
        "# name version arch url size sha256 (packages the base already has are not listed)\n"
        f"{INPUT_HEADER}{inputs_sha256(target)}\n"
        f"{BODY_HEADER}{sha256_bytes(body.encode())}\n"
    ) + body


def parse(text: str, path: Path) -> tuple[str | None, list[DebEntry]]:
    """(inputs sha256, entries); LockError when edited (body hash), malformed or unheaded."""
    headers, body = _split_header(text)
    if BODY_HEADER not in headers:
        raise LockError(f"{path}: no '{BODY_HEADER.strip()}' header; re-run `build lock`")
    if headers[BODY_HEADER] != sha256_bytes(body.encode()):
        raise LockError(
            f"{path}: the lock's body does not match its {BODY_HEADER.strip()} header (truncated or "
            "edited by hand); restore it from git or re-run `build lock`"
        )
    entries = []
    for lineno, line in enumerate(body.splitlines(), len(text.splitlines()) - len(body.splitlines()) + 1):
        m = _LINE.fullmatch(line)
        if not m:
            raise LockError(f"{path}:{lineno}: not 'name version arch url size sha256:<hex>': {line[:60]!r}")
        entries.append(DebEntry(m["name"], m["version"], m["arch"], m["url"], int(m["size"]), m["sha256"]))
    return headers.get(INPUT_HEADER), entries


def read_text(path: Path) -> str:
    """The committed OS lock's text; LockError (exit 2) when missing, unreadable or not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LockError(
            f"{path}: no OS package lock for this target; run `build lock --target {path.parent.name}` "
            "where the archive is reachable, and commit it"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: unreadable OS lock ({exc}); restore it from git or re-run `build lock`") from None


def read(path: Path) -> list[DebEntry]:
    return parse(read_text(path), path)[1]


def check_current(path: Path, target: Target) -> None:
    check_inputs(parse(read_text(path), path)[0], path, target)


def check_inputs(input_sha: str | None, path: Path, target: Target) -> None:
    """LockError when the lock was made from other inputs than the matrix gives now."""
    if input_sha != inputs_sha256(target):
        raise LockError(
            f"{path}: stale: made from another os_packages list, archive or runtime base than the "
            f"matrix gives now; run `build lock --target {target.name}`"
        )


def resolve(engine, target: Target, file: str = "") -> str:
    """The OS lock's text, resolved in a throwaway container of the runtime base (see the module
    docstring). Nothing is written here: the caller writes every lock of a target together.
    ``file`` prefixes every message (the matrix's path), so the line names the file and the key."""
    where = f"{file}targets.{target.name}.os_packages"
    assert target.os_packages is not None, "only a target with os_packages has an OS lock"
    # A target naming platforms: its view's own (builder/config/platforms.py), so a base pinned
    # through its index resolves that platform's packages, not the engine's machine's.
    platform = target.platform_names()[0] if target.platforms else None
    entries = _resolve(engine, target.bases.runtime.ref, target.os_packages, where, platform)
    if not entries:
        raise LockError(
            f"{where}.packages: the runtime base already has every package listed; remove os_packages (nothing to lock)"
        )
    return lock_text(target, entries)


def closure(engine, base_ref: str, osp: OsPackages, where: str) -> dict[str, str]:
    """name -> version of what resolving ``osp`` on ``base_ref`` would download (smoke-init pins these)."""
    return {e.name: e.version for e in _resolve(engine, base_ref, osp, where)}


def _resolve(engine, base_ref: str, osp: OsPackages, where: str, platform: str | None = None) -> list[DebEntry]:
    probe = f"{osp.archive}/dists/{osp.suites[0]}/InRelease"
    try:  # from the host first: an archive out of reach is exit 3 before any base is pulled
        urllib.request.urlopen(urllib.request.Request(probe, method="HEAD"), timeout=15).close()  # noqa: S310
    except urllib.error.HTTPError as exc:
        raise LockError(
            f"{where}.suites: {probe} answers HTTP {exc.code}; is {osp.suites[0]} in that archive?"
        ) from None
    except OSError as exc:
        raise Unreachable(
            f"{where}.archive: {osp.archive} is not reachable from here "
            f"({getattr(exc, 'reason', exc)}); the OS lock cannot be made on this machine: run "
            "`build lock` where it is, and commit the lock"
        ) from None
    return parse_resolution(engine.containers.run_online(base_ref, resolve_script(osp), platform), osp, where)
