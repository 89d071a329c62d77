"""The smoke's second platform, linux/arm64: its bases made from Debian's archive with
`mmdebstrap --architectures=arm64` (the packages' own maintainer scripts run under QEMU: `ci/setup.sh`
registers qemu-aarch64), the stub libcuda.so.1 compiled inside each arm64 root by its own C
compiler, imported as linux/arm64 images and pushed; then one OCI image index per base naming the
amd64 and the arm64 manifest, the shape of nvidia/cuda's tags. Made once per machine (under the
machine-wide lock, smokecache) and reused while the registry serves them; docs/smoke.md has the
first run's time and where it goes.

Only the arm64 bases take this path; the amd64 bases are made natively with debootstrap
(smoke._debootstrap), and each arm64 base must hold the same packages at the same versions as its
amd64 sibling (checked here): one multi-platform tag, one content on both platforms.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from builder import log
from builder.engine.buildx import Engine
from builder.errors import BuildError
from builder.fsutil import cache_dir
from builder.pipeline import smoke, smokecache

ARCH = "arm64"
PLATFORM = "linux/arm64"
# How the arm64 bases are made, in the state's recipe: bases made another way are made again.
MAKER = "mmdebstrap-1"


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


def _mmdebstrap(runtime: Path, devel: Path, runtime_pkgs: list[str], extra: list[str], debs: Path) -> None:
    """Both arm64 roots from one `mmdebstrap` run: minbase plus the runtime packages, copied out
    as the runtime root; then ``extra`` installed on top, the run's own output, the devel root.

    mmdebstrap resolves and downloads with the host's apt (native), extracts the essential
    packages natively, then installs every package with the root's own dpkg, maintainer scripts
    included, under QEMU: a real Debian root whose dpkg database is what ran. The devel packages are
    installed the way mmdebstrap installs its own (the host's apt, the root's dpkg), so the
    runtime packages are installed and configured once for both roots, not twice (nvidia/cuda's
    devel images are layered on their runtime images the same way). The downloads are synced
    with ``debs``, a machine-wide cache, so a second run downloads nothing."""
    install_extra = (
        'APT_CONFIG="$MMDEBSTRAP_APT_CONFIG" apt-get --yes -o Dir::Bin::dpkg=env -o DPkg::Options::=--unset=TMPDIR '
        '-o DPkg::Options::=dpkg -o DPkg::Chroot-Directory="$1" install ' + " ".join(extra)
    )
    cmd = [
        # In a mount namespace of its own: the /proc, /sys and /dev mounts mmdebstrap makes in the
        # root go with it however it ends (a killed run leaves none behind on the host).
        *("unshare", "--mount", "--propagation", "private", "--"),
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        f"--architectures={ARCH}",
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
        smoke.SUITE,
        str(devel),
        smoke.MIRROR,
    ]
    for attempt in (1, 2):
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(devel, ignore_errors=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            break
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
        if attempt == 2:
            raise BuildError(f"mmdebstrap --architectures={ARCH} of the smoke bases failed twice: {tail}")
        log.warn(f"mmdebstrap --architectures={ARCH} of the smoke bases failed; retrying: {tail}")
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


def _installed(root: Path) -> dict[str, str]:
    """package -> version the root's dpkg status file says is installed (read on the host)."""
    out: dict[str, str] = {}
    for para in (root / "var" / "lib" / "dpkg" / "status").read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Status") == "install ok installed":
            out[fields["Package"]] = fields["Version"]
    return out


def _roots(tmp: Path) -> dict[str, Path]:
    """role -> the arm64 root filesystem (a directory under ``tmp``)."""
    (_, runtime_pkgs), (_, devel_pkgs) = smoke.BASES["runtime"], smoke.BASES["devel"]
    extra = [p for p in devel_pkgs if p not in runtime_pkgs]
    if set(runtime_pkgs) - set(devel_pkgs):
        raise BuildError("smoke.BASES: the devel base must hold every runtime package (it is made from it)")
    debs = cache_dir() / "mmdebstrap" / ARCH
    debs.mkdir(parents=True, exist_ok=True)
    roots = {"runtime": tmp / "runtime" / "rootfs", "devel": tmp / "devel" / "rootfs"}
    for root in roots.values():
        root.parent.mkdir(parents=True)
    with log.step(
        f"smoke: arm64 roots (mmdebstrap, maintainer scripts under QEMU; devel = runtime + {' '.join(extra)})"
    ):
        _mmdebstrap(roots["runtime"], roots["devel"], runtime_pkgs, extra, debs)
    return roots


def _amd64_packages(engine: Engine, ref: str) -> dict[str, str]:
    """package -> version installed in the amd64 base ``ref`` (its own dpkg-query, natively)."""
    out = engine.containers.run_capture(ref, "dpkg-query", ["-W", "-f=${Package} ${Version} ${db:Status-Abbrev}\\n"])
    return {f[0]: f[1] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[2] == "ii"}


# Packages one architecture's toolchain has and the other's lacks (the same source packages,
# other binaries): the only difference same_packages accepts, each with why.
ONLY_ON = {
    "amd64": {
        "binutils-x86-64-linux-gnu": "binutils' assembler and linker for the machine's own triplet",
        "libquadmath0": "GCC's __float128 runtime, which GCC builds only for x86 (and ppc64el)",
    },
    ARCH: {
        "binutils-aarch64-linux-gnu": "binutils' assembler and linker for the machine's own triplet",
        "libhwasan0": "GCC's hardware-assisted AddressSanitizer runtime, which needs arm64's top-byte-ignore",
    },
}


def same_packages(role: str, arm64: dict[str, str], amd64: dict[str, str]) -> None:
    """The arm64 base holds the packages its amd64 sibling holds, at the same versions: one index
    tag, one content on both platforms. Accepted: the packages of ONLY_ON, and a version differing
    only in a binNMU suffix (+bN: the same source rebuilt on one architecture)."""

    def source_version(version: str) -> str:
        return re.sub(r"\+b\d+$", "", version)

    only_arm = sorted(set(arm64) - set(amd64) - set(ONLY_ON[ARCH]))
    only_amd = sorted(set(amd64) - set(arm64) - set(ONLY_ON["amd64"]))
    differ = sorted(
        f"{n} {amd64[n]} (amd64) / {arm64[n]} (arm64)"
        for n in set(arm64) & set(amd64)
        if source_version(arm64[n]) != source_version(amd64[n])
    )
    problems = [
        *([f"only on arm64: {', '.join(only_arm)}"] if only_arm else []),
        *([f"only on amd64: {', '.join(only_amd)}"] if only_amd else []),
        *([f"versions differ: {'; '.join(differ)}"] if differ else []),
    ]
    if problems:
        raise BuildError(f"the arm64 {role} base does not hold what the amd64 one holds: {' | '.join(problems)}")


def _stub_inside(rootfs: Path) -> Path:
    """The stub libcuda.so.1 compiled by the root's own C compiler (another machine's: under QEMU)."""
    shutil.copy2(smoke.ASSETS / "driver" / "libcuda_stub.c", rootfs / "tmp" / "libcuda_stub.c")
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


def arm64_bases(registry: str, engine: Engine, amd64: Callable[[], dict[str, str]]) -> dict[str, str]:
    """role -> the pinned linux/arm64 base (name:tag@digest), made or reused; made bases hold
    the packages of their amd64 siblings (same_packages), which ``amd64()`` returns once made."""
    recipe = smoke._recipe()

    def make() -> dict[str, str]:
        with tempfile.TemporaryDirectory(prefix="k3-smoke-arm64-") as tmp:
            refs = {}
            roots = _roots(Path(tmp))
            siblings = amd64()  # waits for the amd64 bases, made meanwhile (smoke._all_bases)
            for role, root in roots.items():
                same_packages(role, _installed(root), _amd64_packages(engine, siblings[role]))
                smoke._install_stub(root, _stub_inside(root), devel=role == "devel")
                repo = smoke.BASES[role][0]
                tagged = f"{registry}/{repo}:{smoke.SUITE}-{recipe}-{ARCH}"
                tar = smoke.tarball(root, root.parent / "rootfs.tar")
                refs[role] = f"{tagged}@{engine.import_and_push(tar, tagged, PLATFORM)}"
            return refs

    def usable(refs: dict[str, str]) -> bool:
        return set(refs) == set(smoke.BASES) and all(smoke._served(engine, ref) for ref in refs.values())

    return smokecache.made_once("smoke-bases-arm64.yaml", registry, f"{recipe}-{MAKER}", usable, make)


def index_bases(registry: str, engine: Engine, amd64: dict[str, str], arm64: dict[str, str]) -> dict[str, dict]:
    """One index per base role naming both platforms' manifests, tagged <suite>-<recipe>-multi.

    Returns {"linux/amd64": {role: ref}, "linux/arm64": {role: ref}, "index": {role: digest}}, each
    ref the index's tag with that platform's manifest digest (one tag, one manifest per platform)."""
    out: dict[str, dict] = {"linux/amd64": {}, PLATFORM: {}, "index": {}}
    for role, (repo, _) in smoke.BASES.items():
        name = f"{registry}/{repo}"
        tag = f"{smoke.SUITE}-{smoke._recipe()}-multi"
        digests = {"linux/amd64": amd64[role].split("@")[1], PLATFORM: arm64[role].split("@")[1]}
        out["index"][role] = engine.registry.push_index(name, tag, digests)
        for platform, digest in digests.items():
            out[platform][role] = f"{name}:{tag}@{digest}"
    return out


def with_platforms(matrix_text: str, bases: dict[str, dict]) -> str:
    """The smoke matrix naming linux/amd64 (its own bases) and linux/arm64 (the arm64 manifests of
    the same tags), each with the index digests; the header comment kept."""
    header, _, body = matrix_text.partition("\n")
    doc = yaml.safe_load(body)
    index = {"build": bases["index"]["devel"], "runtime": bases["index"]["runtime"]}
    arm = bases[PLATFORM]
    # Two copies of the index: one object twice would be written as a YAML anchor and alias.
    doc["targets"]["smoke"]["platforms"] = {
        "linux/amd64": {"index": dict(index)},
        PLATFORM: {"bases": {"build": arm["devel"], "runtime": arm["runtime"]}, "index": dict(index)},
    }
    return header + "\n" + yaml.safe_dump(doc, sort_keys=False, width=4096)


def second_platform(
    registry: str, engine: Engine, amd64: Callable[[], dict[str, str]]
) -> tuple[dict[str, str], Callable[[str], str]]:
    """smoke.init's hook (smoke.Second): the arm64 bases made while ``amd64()``'s are, both joined
    per role into an index; returns the amd64 bases as the index tags pin them and what extends the
    matrix with ``platforms``."""
    arm64 = arm64_bases(registry, engine, amd64)
    bases = index_bases(registry, engine, amd64(), arm64)
    return bases["linux/amd64"], lambda text: with_platforms(text, bases)
