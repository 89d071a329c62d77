"""page_alignment: the probe (builder/checks/probes/pagealign.py) and the check
(builder/checks/checklist_image.py) on real ELF files. The main ones are built here by the C
compiler with ``-z max-page-size=4096`` and ``=65536`` (the rule is about the alignment the linker
gives the segments, written the same way for every machine); beside them the headers of three real
aarch64 wheel files (tests/fixtures/aarch64-elf/), and, where an aarch64 cross compiler and
qemu-aarch64 are installed, glibc itself on a 64 KiB page (``qemu-aarch64 -p 65536``) deciding the
same files the probe judges."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.checks import checklist_image
from builder.checks.probes import pagealign
from builder.engine.seam import ImageConfig
from tests.unit.test_checks_image import _expect, _Host
from tests.unit.test_probes import run

CC = shutil.which("cc") or shutil.which("gcc")
READELF = shutil.which("readelf")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "aarch64-elf"
MACHINE = platform.machine()  # the probe's machine: that of the interpreter running it
K64 = 65536


def link(out: Path, page: int, kind: str = "so", cc: str | None = CC) -> Path:
    """A real ELF file from the C compiler whose linker aligned its segments to ``page``."""
    assert cc, "the unit tests need a C compiler (ci/setup.sh installs gcc)"
    src = out.with_name(out.name + ".c")
    src.write_text("int value(void) { return 42; }\n" + ("int main(void) { return value() - 42; }\n" * (kind != "so")))
    flags = {"so": ["-shared", "-fPIC"], "exe": ["-fPIE", "-pie"], "static": ["-static"], "obj": ["-c"]}[kind]
    pages = [] if kind == "obj" else [f"-Wl,-z,max-page-size={page}", f"-Wl,-z,common-page-size={page}"]
    subprocess.run([cc, *flags, *pages, "-o", str(out), str(src)], check=True, capture_output=True)
    src.unlink()
    return out


def readelf_verdict(path: Path, page: int) -> bool:
    """True when binutils' readelf shows every PT_LOAD with p_align and p_vaddr - p_offset multiples
    of ``page``: the same rule read by another program, so the probe's parsing is checked too."""
    assert READELF, "binutils' readelf comes with the C compiler"
    out = subprocess.run([READELF, "-lW", str(path)], capture_output=True, text=True, check=True).stdout
    loads = [line.split() for line in out.splitlines() if line.split()[:1] == ["LOAD"]]
    assert loads, out
    return all(int(f[-1], 16) % page == 0 and (int(f[2], 16) - int(f[1], 16)) % page == 0 for f in loads)


@pytest.fixture
def tree(tmp_path):
    """An image-like tree: a shared object, a PIE and a static executable at each alignment, plus
    what must not be judged twice or at all (a symlink, a hard link, an object file, a text file)."""
    lib, bin_ = tmp_path / "opt/k3/lib", tmp_path / "opt/k3/bin"
    lib.mkdir(parents=True)
    bin_.mkdir(parents=True)
    files = {
        "lib4k": link(lib / "lib4k.so", 4096),
        "lib64k": link(lib / "lib64k.so", K64),
        "exe4k": link(bin_ / "exe4k", 4096, "exe"),
        "exe64k": link(bin_ / "exe64k", K64, "exe"),
        "static64k": link(bin_ / "static64k", K64, "static"),
    }
    link(lib / "value.o", 4096, "obj")  # ET_REL: never mapped
    (lib / "lib4k.so.1").symlink_to("lib4k.so")
    os.link(lib / "lib4k.so", lib / "lib4k-hardlink.so")
    (bin_ / "script").write_text("#!/bin/sh\n")
    return tmp_path / "opt/k3", files


def test_the_probe_flags_exactly_what_the_linker_aligned_below_64k(tree):
    root, files = tree
    found = run("pagealign", {"roots": [str(root)], "pages": {MACHINE: K64}})
    assert (found["machine"], found["page"], found["roots"]) == (MACHINE, K64, [str(root)])
    assert found["checked"] == 5 and found["other_machine"] == 0  # the link counted once, the .o never
    flagged = {Path(p).name: why for p, why in found["problems"]}
    hardlinked = {"lib4k.so", "lib4k-hardlink.so"}  # one inode: whichever name the walk met first
    assert len(flagged) == found["count"] == 2 and "exe4k" in flagged and len(set(flagged) & hardlinked) == 1
    for why in flagged.values():
        assert why.startswith("p_align 0x1000 (not a multiple of 0x10000)"), why
        assert "p_vaddr - p_offset not a multiple of 0x10000 (PT_LOAD " in why, why
    for name, path in files.items():  # binutils agrees file by file
        assert readelf_verdict(path, K64) == (name.endswith("64k")), name


def test_every_file_fits_4k_pages_and_no_other_page(tree):
    root, _ = tree
    found = run("pagealign", {"roots": [str(root)], "pages": {MACHINE: 4096}})
    assert found["checked"] == 5 and found["problems"] == [] and found["count"] == 0
    found = run("pagealign", {"roots": [str(root)], "pages": {MACHINE: 16384}})
    assert found["count"] == 2  # 16K kernels (Apple silicon, some Android) refuse the 4K files too


def test_an_image_of_a_machine_with_no_large_page_is_not_walked(tree):
    root, _ = tree
    found = run("pagealign", {"roots": [str(root)], "pages": {"no-such-machine": K64}, "loader": True})
    assert found == {
        "machine": MACHINE,
        "page": None,
        "roots": [],
        "checked": 0,
        "other_machine": 0,
        "count": 0,
        "problems": [],
    }


def test_files_of_another_machine_are_counted_never_judged(tree):
    root, _ = tree
    for head in FIXTURES.glob("*.head"):
        shutil.copy(head, root / "lib" / head.name.removesuffix(".head"))
    found = run("pagealign", {"roots": [str(root)], "pages": {MACHINE: K64}})
    if MACHINE == "aarch64":  # judged here: the numpy 1.19.0 libz is the one that fails
        assert found["checked"] == 8 and found["count"] == 3
    else:
        assert found["checked"] == 5 and found["other_machine"] == 3 and found["count"] == 2


def test_real_aarch64_wheel_files_read_as_readelf_reads_them():
    verdicts = {}
    for head in sorted(FIXTURES.glob("*.head")):
        machine, e_type, loads = pagealign.segments(str(head))
        assert (machine, e_type) == ("aarch64", pagealign.ET_DYN)
        verdicts[head.name.split("_")[0]] = pagealign.judge(loads, K64)
        assert (verdicts[head.name.split("_")[0]] is None) == readelf_verdict(head, K64), head.name
    assert verdicts == {
        # the third PT_LOAD, added by auditwheel's patchelf in 2020: 4K-aligned, 0xf000 off a 64K page
        "numpy-1.19.0": "p_align 0x1000 (not a multiple of 0x10000); "
        "p_vaddr - p_offset not a multiple of 0x10000 (PT_LOAD 2: 0xf000)",
        "nvidia-cuda-runtime-cu12-12.9.79": None,
        "pillow-13.0.0": None,
    }


def test_the_loader_s_directories_are_walked_once_each(tmp_path):
    dirs = pagealign.ld_cache_dirs()
    assert dirs and all(d.startswith("/") for d in dirs)  # this machine's /etc/ld.so.cache
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    roots = [str(tmp_path / "a/b"), str(tmp_path / "link"), str(tmp_path / "a"), str(tmp_path / "gone"), ""]
    assert pagealign.walk_roots(roots) == [str(tmp_path / "a")]


# --- glibc itself on a 64 KiB page --------------------------------------------------------------

CROSS = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")


@pytest.mark.skipif(
    not (CROSS and QEMU and (SYSROOT / "lib/ld-linux-aarch64.so.1").exists()),
    reason="needs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user-static (Debian packages)",
)
def test_glibc_on_a_64k_page_refuses_exactly_what_the_probe_flags(tmp_path):
    opener = tmp_path / "dlopen"
    opener.with_suffix(".c").write_text(
        "#include <dlfcn.h>\n#include <stdio.h>\n"
        "int main(int c, char **v) { if (!dlopen(v[1], RTLD_NOW)) { puts(dlerror()); return 1; } return 0; }\n"
    )
    subprocess.run([CROSS, f"-Wl,-z,max-page-size={K64}", "-o", str(opener), str(opener.with_suffix(".c"))], check=True)
    libs = {page: link(tmp_path / f"lib{page}.so", page, cc=CROSS) for page in (4096, 16384, K64)}
    for kernel_page in (4096, 16384, K64):  # qemu's -p is the page size the guest's glibc is told (AT_PAGESZ)
        for page, lib in libs.items():
            glibc = subprocess.run(
                [QEMU, "-p", str(kernel_page), "-L", str(SYSROOT), str(opener), str(lib)],
                capture_output=True,
                text=True,
            )
            machine, _, loads = pagealign.segments(str(lib))
            probe = pagealign.judge(loads, kernel_page)
            assert machine == "aarch64"
            assert (glibc.returncode == 0) == (probe is None), (kernel_page, page, glibc.stdout, probe)
            if probe:
                assert "ELF load command address/offset not page-aligned" in glibc.stdout


# --- the check --------------------------------------------------------------------------------------

CONFIG = ImageConfig("r", "i", {}, {"PATH": "/opt/k3/venv/bin:/usr/local/cuda/bin", "LD_LIBRARY_PATH": "x"}, "2000", ())
ARM = {"machine": "aarch64", "page": K64, "roots": ["/opt/k3", "/usr/lib"], "checked": 3, "other_machine": 0}
BAD = "p_align 0x1000 (not a multiple of 0x10000); p_vaddr - p_offset not a multiple of 0x10000 (PT_LOAD 2: 0xf000)"
LIBZ = "/opt/k3/venv/lib/python3.12/site-packages/numpy.libs/libz-558a5e64.so.1.2.7"


class _Asked(_Host):
    """The stand-in container, keeping each request the check sent."""

    requests: list[dict] = []

    def run(self, command, *args):
        self.requests.append(json.loads(args[1]))
        return super().run(command, *args)


def test_the_check_fails_each_file_with_its_p_align_unless_waived():
    host = _Asked({"pagealign": {**ARM, "count": 1, "problems": [[LIBZ, BAD]]}})
    with pytest.raises(AssertionError) as info:
        checklist_image.test_page_alignment(host, CONFIG, _expect(), lambda m: None)
    assert str(info.value).startswith(
        "expected every aarch64 ELF file under /opt/k3, /usr/lib (3 checked) to map on a 64K-page kernel: each "
        f"PT_LOAD's p_align and p_vaddr - p_offset a multiple of 0x10000, found 1: {LIBZ}: {BAD}"
    )
    # the roots: the prefix, then the config's absolute PATH and LD_LIBRARY_PATH entries ("x" is not
    # one); the probe adds the loader's own directories
    assert host.requests[-1] == {
        "roots": ["/opt/k3", "/opt/k3/venv/bin", "/usr/local/cuda/bin"],
        "pages": {"aarch64": 65536},
        "loader": True,
    }
    shown: list[str] = []
    waivers = {"page_alignment": {"*/numpy.libs/libz-*": "loaded only by numpy.lib.format's zlib fallback"}}
    checklist_image.test_page_alignment(host, CONFIG, _expect(waivers=waivers), shown.append)
    assert shown == [
        f"page_alignment: {LIBZ}: {BAD}; waived (*/numpy.libs/libz-*): loaded only by numpy.lib.format's zlib fallback"
    ]


def test_the_check_skips_an_amd64_image_and_fails_an_empty_arm64_one():
    host = _Host({"pagealign": {**ARM, "machine": "x86_64", "page": None, "roots": [], "checked": 0}})
    with pytest.raises(pytest.skip.Exception, match="interpreter is x86_64: no kernel page above 4 KiB"):
        checklist_image.test_page_alignment(host, CONFIG, _expect(), lambda m: None)
    host = _Host({"pagealign": {**ARM, "checked": 0, "other_machine": 2, "count": 0, "problems": []}})
    shown: list[str] = []
    with pytest.raises(AssertionError, match="expected aarch64 ELF files under /opt/k3, /usr/lib, found none"):
        checklist_image.test_page_alignment(host, CONFIG, _expect(), shown.append)
    assert shown == [
        "page_alignment: 2 ELF file(s) of another machine than aarch64 not judged (a process of "
        "this image cannot load them)"
    ]
