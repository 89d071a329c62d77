"""The smoke bases' root filesystems: both roles of one architecture from one `mmdebstrap` run.

Every smoke base, linux/amd64 and linux/arm64 alike, is made this way, so the two platforms'
bases differ only in their architecture (smokearm64.same_packages holds them to that). On the
machine's own architecture everything runs natively; on another one the packages' maintainer
scripts and the root's dpkg run under QEMU (`ci/setup.sh` registers qemu-aarch64), while apt's
resolution, download and the essential packages' extraction stay native.

Until 2026-12-03 the machine's own bases came from two `debootstrap --variant=minbase` runs (one
per role, side by side): on a fresh 2-core machine every pytest worker waited about four minutes
for them; the same two roots from one mmdebstrap run took 31 s from an empty download cache
(docs/smoke.md, "Measured").
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from builder import log
from builder.errors import BuildError
from builder.fsutil import cache_dir
from builder.smoke.smokeos import MIRROR, SUITE

# How the roots are made, part of the bases' recipe (smoke._recipe, with recipe() below): bases
# made another way are made again.
MAKER = "mmdebstrap-2"

# Where mmdebstrap writes its --dpkgopt options, to stay ("permanently", its manual says): removed
# from both roots, so no option of the making is left in a base.
_DPKG_OPTIONS = "etc/dpkg/dpkg.cfg.d/99mmdebstrap"

# What mmdebstrap's own cleanup removes from its output (cleanup/mmdebstrap, cleanup/reproducible),
# done to the runtime root, which is copied out before that cleanup runs.
_MMDEBSTRAP_LEFTOVERS = (
    _DPKG_OPTIONS,
    "etc/apt/apt.conf.d/00mmdebstrap",
    "var/log/dpkg.log",
    "var/log/apt/history.log",
    "var/log/apt/term.log",
    "var/log/alternatives.log",
    "var/cache/ldconfig/aux-cache",
    "var/log/apt/eipp.log.xz",
    "var/lib/dbus/machine-id",
)


def native_arch() -> str:
    """The machine's own Debian architecture (dpkg's name: amd64, arm64)."""
    proc = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BuildError(f"dpkg --print-architecture failed: {proc.stderr.strip()[-200:]}")
    return proc.stdout.strip()


def _command(arch: str, runtime: Path, devel: Path, runtime_pkgs: list[str], extra: list[str], debs: Path) -> list:
    install_extra = (
        'APT_CONFIG="$MMDEBSTRAP_APT_CONFIG" apt-get --yes -o Dir::Bin::dpkg=env -o DPkg::Options::=--unset=TMPDIR '
        '-o DPkg::Options::=dpkg -o DPkg::Chroot-Directory="$1" install ' + " ".join(extra)
    )
    return [
        # In a mount namespace of its own: the /proc, /sys and /dev mounts mmdebstrap makes in the
        # root go with it however it ends (a killed run leaves none behind on the host).
        *("unshare", "--mount", "--propagation", "private", "--"),
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        f"--architectures={arch}",
        f"--include={','.join(runtime_pkgs)}",
        # No fsync per unpacked file: the root is tarred once made, and a run that dies is made
        # again from nothing, so dpkg's crash safety buys nothing here, while under a loaded CI
        # machine's disk each fsync waits. The files are the same; the option's file goes (below).
        "--dpkgopt=force-unsafe-io",
        # /usr merged the way debootstrap merges it (its own function), usr-is-merged installed:
        # without it apt satisfies init-system-helpers with usrmerge, which pulls in perl.
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        # The machine-wide download cache in (apt checks each file's hash) and, last, out again.
        f'--setup-hook=mkdir -p "$1/var/cache/apt/archives" && cp -a {debs}/. "$1/var/cache/apt/archives/"',
        # -x: /proc, /sys and /dev/pts are mounted in the root while hooks run.
        f'--customize-hook=cp -ax "$1" {runtime}',
        f"--customize-hook={install_extra}",
        f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
        f'--customize-hook=rm "$1/{_DPKG_OPTIONS}"',
        SUITE,
        str(devel),
        MIRROR,
    ]


def recipe() -> str:
    """What identifies how a root is made: MAKER and the mmdebstrap command's shape (paths, the
    architecture and the package lists stood in for), so an edit to the command makes the bases
    again without anyone remembering to change MAKER."""
    shape = _command("ARCH", Path("RUNTIME"), Path("DEVEL"), ["PACKAGES"], ["EXTRA"], Path("DEBS"))
    return MAKER + "\n" + "\n".join(shape)


def _mmdebstrap(arch: str, runtime: Path, devel: Path, runtime_pkgs: list[str], extra: list[str]) -> None:
    """Both roots from one `mmdebstrap` run: minbase plus the runtime packages, copied out as the
    runtime root; then ``extra`` installed on top, the run's own output, the devel root.

    mmdebstrap resolves and downloads with the host's apt, extracts the essential packages, then
    installs every package with the root's own dpkg, maintainer scripts included: a real Debian
    root whose dpkg database is what ran. The devel packages are installed the way mmdebstrap
    installs its own (the host's apt, the root's dpkg), so the runtime packages are installed and
    configured once for both roots (nvidia/cuda's devel images are layered on their runtime images
    the same way). The downloads are synced with a machine-wide cache per architecture, so a second
    run downloads nothing. A failed run (a mirror hiccup) is made once more from nothing."""
    debs = cache_dir() / "mmdebstrap" / arch
    debs.mkdir(parents=True, exist_ok=True)
    cmd = _command(arch, runtime, devel, runtime_pkgs, extra, debs)
    for attempt in (1, 2):
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(devel, ignore_errors=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            break
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
        if attempt == 2:
            raise BuildError(f"mmdebstrap --architectures={arch} of the smoke bases failed twice: {tail}")
        log.warn(f"mmdebstrap --architectures={arch} of the smoke bases failed; retrying: {tail}")
    _finish_runtime(runtime, devel)


def _finish_runtime(runtime: Path, devel: Path) -> None:
    """The runtime root as mmdebstrap's cleanup would have left it (it was copied out before)."""
    # While it runs, mmdebstrap keeps services from starting (a policy-rc.d that says no, a fake
    # start-stop-daemon beside the real one) and undoes that in its cleanup, after the hooks: the
    # runtime copy gets what the finished devel root has at those paths.
    for rel in ("usr/sbin/policy-rc.d", "usr/sbin/start-stop-daemon", "usr/sbin/start-stop-daemon.REAL"):
        if (devel / rel).is_file():
            shutil.copy2(devel / rel, runtime / rel)
        else:
            (runtime / rel).unlink(missing_ok=True)
    for leftover in _MMDEBSTRAP_LEFTOVERS:
        (runtime / leftover).unlink(missing_ok=True)
    for cache in (runtime / "var" / "cache" / "apt").glob("*.bin"):
        cache.unlink()
    if (runtime / "etc" / "machine-id").exists():
        (runtime / "etc" / "machine-id").write_text("")
    # cleanup/run and cleanup/tmp: /run emptied but for lock (/var/lock points there), /tmp emptied.
    for directory, kept in (("run", {"lock"}), ("tmp", set())):
        if not (runtime / directory).is_dir():
            continue
        for entry in (e for e in (runtime / directory).iterdir() if e.name not in kept):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def roots(tmp: Path, arch: str, bases: dict[str, tuple[str, list[str]]]) -> dict[str, Path]:
    """role -> the root filesystem of ``arch`` (a directory under ``tmp``) for the smoke's
    ``bases`` (role -> (repository, packages)): the devel base must hold every runtime package."""
    (_, runtime_pkgs), (_, devel_pkgs) = bases["runtime"], bases["devel"]
    extra = [p for p in devel_pkgs if p not in runtime_pkgs]
    if set(runtime_pkgs) - set(devel_pkgs):
        raise BuildError("smoke.BASES: the devel base must hold every runtime package (it is made from it)")
    made = {"runtime": tmp / "runtime" / "rootfs", "devel": tmp / "devel" / "rootfs"}
    for root in made.values():
        root.parent.mkdir(parents=True)
    how = "natively" if arch == native_arch() else "maintainer scripts under QEMU"
    with log.step(f"smoke: {arch} roots (mmdebstrap, {how}; devel = runtime + {' '.join(extra)})"):
        _mmdebstrap(arch, made["runtime"], made["devel"], runtime_pkgs, extra)
    return made


def installed(root: Path) -> dict[str, str]:
    """package -> version the root's dpkg status file says is installed (read on the host)."""
    out: dict[str, str] = {}
    for para in (root / "var" / "lib" / "dpkg" / "status").read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Status") == "install ok installed":
            out[fields["Package"]] = fields["Version"]
    return out


def stub_inside(rootfs: Path, source: Path) -> Path:
    """The stub libcuda.so.1 compiled by the root's own C compiler (another architecture's: under
    QEMU), beside the root; the root is left as it was."""
    shutil.copy2(source, rootfs / "tmp" / "libcuda_stub.c")
    cmd = [
        "cc",
        "-shared",
        "-fPIC",
        "-O2",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        "/tmp/libcuda.so.1",
        "/tmp/libcuda_stub.c",
    ]
    proc = subprocess.run(["chroot", str(rootfs), *cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"compiling the stub libcuda.so.1 in {rootfs} failed: {proc.stderr.strip()[-300:]}")
    out = rootfs.parent / "libcuda.so.1"
    shutil.move(rootfs / "tmp" / "libcuda.so.1", out)
    (rootfs / "tmp" / "libcuda_stub.c").unlink()
    return out
