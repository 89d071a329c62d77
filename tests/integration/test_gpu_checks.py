"""The GPU-code checks on real images: thin ``FROM <built smoke>`` variants that carry real GPU code
(a fatbin of NVRTC 12.9 cubins and PTX in an extension's .nv_fatbin, as nvcc lays it out) and one
defect each, checked under a copy of the smoke matrix with a ``gpu`` block of its own. Each fails
exactly its check: PTX of ISA 9.0 and a cubin of CUDA 13 (both made by nvcc 13 here), a required
extension lacking B300 (10.3), and Triton's bundled ptxas being CUDA 13's with no override.

Two more are made at the OCI level, not by a Dockerfile (issue 51): files copied into a created
container and the container committed, its labels set by ``docker commit --change``: CUDA 13 code,
ZSTD-compressed, kept as data in a library the extension NEEDs outside the application prefix;
a compressed entry that cannot be decoded; a library whose .nv_fatbin section runs past the end of
the file (the host cannot read its GPU code, and says so); and a package whose import writes a library to /tmp and
loads it (found in what the import maps, in no layer of the image)."""

from __future__ import annotations

import io
import re
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from builder.config import contract
from tests.integration.conftest import check_images, variant_images
from tests.integration.test_checks import SITE, _failed
from tests.unit import gpuassets

FATBINARY = gpuassets.NVCC13.parent / "fatbinary"
PTXAS13 = gpuassets.NVCC13.parent / "ptxas"
# What the variants' matrix claims: B300 (10.3) is served by the family cubin sm_100f.
GPU = {
    "families": {"8.0": "A100", "9.0": "H100, H200", "10.0": "B200", "10.3": "B300"},
    "required": {"k3gpu._C": "all"},
    "driver_floor": "575.51.03",
}
LABELS = (
    f'LABEL "{contract.LABEL_DRIVER_FLOOR}"="{GPU["driver_floor"]}" '
    f'"{contract.LABEL_GPU_FAMILIES}"="{" ".join(GPU["families"])}"'
)
EXT = f"{SITE}/k3gpu/_C.abi3.so"
UNSET = 'ENV TRITON_PTXAS_PATH="" TRITON_PTXAS_BLACKWELL_PATH=""'
# name: (Dockerfile lines after FROM <smoke> and the labels, the check that fails, text in its message)
VARIANTS = {
    "ptx-isa-9": (f"COPY good.so {EXT}\nCOPY k3_isa9.ptx {SITE}/k3gpu/kernels/k3.ptx", "gpu_code", "PTX ISA 9.0"),
    "cubin-cuda-13": (
        f"COPY good.so {EXT}\nCOPY k3_sm_90_cuda13.cubin {SITE}/k3gpu/kernels/k3_sm_90.cubin",
        "gpu_code",
        "built by CUDA 13.0 (tkinfo), not CUDA 12",
    ),
    "no-b300": (f"COPY no_b300.so {EXT}", "gpu_coverage", "k3gpu._C on 10.3 (B300): none (has"),
    "ptxas-13": (
        f"COPY good.so {EXT}\nCOPY ptxas {SITE}/triton/backends/nvidia/bin/ptxas\n{UNSET}",
        "gpu_code",
        "newer than CUDA 12.9",
    ),
}


def with_gpu(text: str) -> str:
    """The smoke matrix with the variants' ``gpu`` block (replacing any the smoke has)."""
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    doc = yaml.safe_load(text)
    doc["targets"]["smoke"]["gpu"] = GPU
    # The variants' files are dropped in by hand (no RECORD lists them) and the stand-in extension is
    # a bare shared object (no PyInit): the whole-image checks are waived for exactly those paths, so
    # each variant fails only the GPU-code check it is about.
    why = "a GPU-code test variant's file, copied in by hand"
    doc["targets"]["smoke"].setdefault("runtime", {})["waivers"] = {
        "installed_files": {f"{SITE}/k3gpu/*": why, f"{SITE}/triton/*": why},
        "everything_loads": {f"{SITE}/k3gpu/*": why},
    }
    return header + yaml.safe_dump(doc, sort_keys=False, width=4096)


def _extension(out: Path, images: list[tuple[str, str, bytes]], work: Path, *link: str) -> None:
    """A shared object whose .nv_fatbin holds ``images`` (kind, sm, bytes) packed by fatbinary
    (``link``: more arguments to its link, with ``STUB`` for its source when given)."""
    args = []
    for i, (kind, sm, data) in enumerate(images):
        path = work / f"image{i}.{kind}"
        path.write_bytes(data)
        args.append(f"--image3=kind={kind},sm={sm},file={path}")
    fatbin = work / "k3.fatbin"
    subprocess.run([str(FATBINARY), f"--create={fatbin}", "-64", *args], check=True, capture_output=True)
    (work / "stub.c").write_text(STUB if link else "int k3gpu_fn(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(work / "stub.so"), str(work / "stub.c"), *link], check=True)
    subprocess.run(
        ["objcopy", "--add-section", f".nv_fatbin={fatbin}", str(work / "stub.so"), str(out)],
        check=True,
        capture_output=True,
    )


def _context(context: Path) -> None:
    if not FATBINARY.exists() or not shutil.which("objcopy"):
        pytest.skip(f"needs the CUDA 13 toolkit at {FATBINARY.parent.parent} and objcopy")
    work = context / "work"
    work.mkdir()
    sass = {arch: gpuassets.nvrtc(f"sm_{arch}") for arch in ("80", "90a", "100f", "100a")}
    ptx = gpuassets.nvrtc("compute_90a", ptx=True)  # ISA 8.8: the floor 575.51.03, exact
    good = [("elf", "80", sass["80"]), ("elf", "90a", sass["90a"]), ("elf", "100f", sass["100f"]), ("ptx", "90a", ptx)]
    _extension(context / "good.so", good, work)
    _extension(context / "no_b300.so", [*good[:2], ("elf", "100a", sass["100a"]), good[3]], work)
    gpuassets.nvcc13(work / "isa9.ptx", "-ptx", "-arch=compute_90")
    shutil.copy(work / "isa9.ptx", context / "k3_isa9.ptx")
    gpuassets.nvcc13(work / "k3.cubin", "-cubin", "-arch=sm_90")
    shutil.copy(work / "k3.cubin", context / "k3_sm_90_cuda13.cubin")
    shutil.copy(PTXAS13, context / "ptxas")
    shutil.rmtree(work)


# The OCI-level variants: name -> (the check that fails, text in its message)
OCI_VARIANTS = {
    "needed-lib-cuda13-as-data": ("gpu_code", "SASS sm_100a built by CUDA 13.0 (tkinfo), not CUDA 12"),
    "unread-entry": ("gpu_code", "SASS sm_100a unread: "),
    # a library's .nv_fatbin section stated past the end of the file: the host cannot read it
    "unreadable-fatbin-section": ("gpu_code", f"{SITE}/k3gpu/libk3more.so: GPU code unread on the host: "),
    # not GPU code: a package whose import writes a library to /tmp and loads it (issue 51, dlopen)
    "loads-code-made-at-import": ("everything_loads", "/tmp/k3made/libk3made.so: mapped at import but not a file"),
}
MAKES = (
    "import ctypes, os, shutil\n"
    "os.makedirs('/tmp/k3made', exist_ok=True)\n"
    "shutil.copy(os.path.join(os.path.dirname(__file__), '_C.abi3.so'), '/tmp/k3made/libk3made.so')\n"
    "ctypes.CDLL('/tmp/k3made/libk3made.so')\n"
)
MODULE = (
    "#define Py_LIMITED_API 0x030B0000\n#include <Python.h>\n"
    'static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "_m", 0, -1, 0};\n'
    "PyMODINIT_FUNC PyInit__m(void) { return PyModule_Create(&d); }\n"
)
KERNELS_DIR = "/usr/local/lib/k3kernels"  # outside the application prefix
STUB = "extern const unsigned char k3_fatbin[];\nint k3gpu_fn(void) { return k3_fatbin[0]; }\n"


def _zstd_fatbin(work: Path) -> bytes:
    """nvcc 13's fatbin of one sm_100a cubin, ZSTD-compressed (its default): only decoding it tells
    its toolkit (ELF ABI 8 at sm_100 is CUDA 12.9's too)."""
    gencode = ["-gencode", "arch=compute_100a,code=sm_100a"]  # SASS only: no PTX finding beside it
    fat = gpuassets.nvcc13(work / "k3_100a.fatbin", "-fatbin", *gencode, "--compress-mode=size")
    return fat.read_bytes()


def _garbled(blob: bytes) -> bytes:
    """``blob`` with its first compressed entry's payload overwritten mid-way and its decoded size
    stated one byte longer: libzstd decodes the garbled frame (it carries no checksum) to its old
    size, which no longer matches; the pure-Python decoder refuses the garbled bytes themselves."""
    out = bytearray(blob)
    hsize, _ = struct.unpack_from("<IQ", out, 16 + 4)
    csize = struct.unpack_from("<I", out, 16 + 16)[0]
    mid = 16 + hsize + csize // 2
    out[mid : mid + 16] = b"\xa5" * 16
    usize = struct.unpack_from("<Q", out, 16 + 56)[0]
    struct.pack_into("<Q", out, 16 + 56, usize + 1)
    return bytes(out)


def _section_past_end(elf: bytes, name: bytes = b".nv_fatbin") -> bytes:
    """``elf`` (ELF64 little-endian) with section ``name``'s size stated 4 KiB past the end of the
    file: its fatbin is truncated as the section table reads it (ld.so reads no section table)."""
    out = bytearray(elf)
    shoff = struct.unpack_from("<Q", out, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", out, 0x3A)
    names = struct.unpack_from("<Q", out, shoff + shstrndx * shentsize + 24)[0]
    for i in range(shnum):
        at = shoff + i * shentsize
        if out[names + struct.unpack_from("<I", out, at)[0] :].startswith(name + b"\0"):
            offset = struct.unpack_from("<Q", out, at + 24)[0]
            struct.pack_into("<Q", out, at + 32, len(out) - offset + 4096)
            return bytes(out)
    raise AssertionError(f"no {name!r} section")


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar of ``files`` (absolute path -> (bytes, mode)), owned by root, with their directories."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({str(Path(p).parent) for p in files})
        for d in dirs:
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _committed(ref: str, tag: str, files: dict[str, tuple[bytes, int]]) -> str:
    """``ref`` with ``files`` written into a created container, committed as ``tag`` with the labels."""
    cid = subprocess.run(["docker", "create", ref], capture_output=True, text=True, check=True).stdout.strip()
    try:
        subprocess.run(["docker", "cp", "-", f"{cid}:/"], input=_tar(files), capture_output=True, check=True)
        change = ["--change", f"LABEL {LABELS.removeprefix('LABEL ')}"]
        subprocess.run(["docker", "commit", *change, cid, tag], capture_output=True, check=True)
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return tag


def _oci_files(work: Path) -> dict[str, dict[str, tuple[bytes, int]]]:
    if not FATBINARY.exists() or not shutil.which("objcopy"):
        pytest.skip(f"needs the CUDA 13 toolkit at {FATBINARY.parent.parent} and objcopy")
    blob = _zstd_fatbin(work)
    body = ",".join(str(b) for b in blob)
    (work / "k3kernels.c").write_text(f"__attribute__((aligned(8))) const unsigned char k3_fatbin[] = {{{body}}};\n")
    lib = work / "libk3kernels.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(work / "k3kernels.c")], check=True)
    sass = {arch: gpuassets.nvrtc(f"sm_{arch}") for arch in ("80", "90a", "100f")}
    ptx = gpuassets.nvrtc("compute_90a", ptx=True)
    good = [("elf", a, sass[a]) for a in ("80", "90a", "100f")] + [("ptx", "90a", ptx)]
    _extension(work / "needs.so", good, work, f"-L{work}", "-lk3kernels", f"-Wl,-rpath,{KERNELS_DIR}")
    _extension(work / "good.so", good, work)
    return {
        "needed-lib-cuda13-as-data": {
            EXT: ((work / "needs.so").read_bytes(), 0o755),
            f"{KERNELS_DIR}/libk3kernels.so": (lib.read_bytes(), 0o755),
        },
        "unread-entry": {
            EXT: ((work / "good.so").read_bytes(), 0o755),
            f"{SITE}/k3gpu/kernels/k3.fatbin": (_garbled(blob), 0o644),
        },
        "unreadable-fatbin-section": {
            EXT: ((work / "good.so").read_bytes(), 0o755),
            f"{SITE}/k3gpu/libk3more.so": (_section_past_end((work / "good.so").read_bytes()), 0o755),
        },
        "loads-code-made-at-import": {
            EXT: ((work / "good.so").read_bytes(), 0o755),
            f"{SITE}/k3gpu/__init__.py": (MAKES.encode(), 0o644),
            f"{SITE}/k3gpu/_m.abi3.so": (_abi3_module(work), 0o755),
        },
    }


def _abi3_module(work: Path) -> bytes:
    """A real extension module (limited API 3.11: the smoke's interpreter imports it)."""
    import sysconfig

    (work / "m.c").write_text(MODULE)
    include = sysconfig.get_paths()["include"]
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{include}", "-o", str(work / "m.so"), str(work / "m.c")], check=True)
    return (work / "m.so").read_bytes()


@pytest.fixture(scope="module")
def oci_variants(built, tmp_path_factory):
    """The OCI-level variants, committed (no build) and checked once, side by side."""
    smoke, ref = built
    work = smoke.variant(tmp_path_factory.mktemp("gpu-oci") / "work", "gpu", with_gpu)
    files = _oci_files(tmp_path_factory.mktemp("gpu-oci-files"))
    suffix = smoke.repository.rsplit("-", 1)[-1]
    tags = {name: _committed(ref, f"k3-check-variant:{name}-{suffix}", f) for name, f in files.items()}
    yield check_images(work.matrix, tags)
    subprocess.run(["docker", "image", "rm", "-f", *tags.values()], capture_output=True)


@pytest.mark.parametrize("name", sorted(OCI_VARIANTS))
def test_each_oci_level_gpu_variant_fails_exactly_its_check(oci_variants, name):
    check, text = OCI_VARIANTS[name]
    r = oci_variants[name]
    assert r.code == 1, r.err[-3000:]
    failed = _failed(r.err)
    assert set(failed) == {check}, r.err[-3000:]
    assert text in failed[check], failed
    if name == "needed-lib-cuda13-as-data":  # found through the extension's NEEDED, outside the prefix
        assert f"{KERNELS_DIR}/libk3kernels.so" in failed[check], failed


@pytest.fixture(scope="module")
def gpu_variants(built, tmp_path_factory):
    """Every GPU variant built and checked once, side by side: the `build test` runs by name."""
    smoke, ref = built
    work = smoke.variant(tmp_path_factory.mktemp("gpu") / "work", "gpu", with_gpu)
    context = tmp_path_factory.mktemp("gpu-context")
    _context(context)
    bodies = {name: f"{LABELS}\n{lines}" for name, (lines, _, _) in VARIANTS.items()}
    tags = variant_images(ref, bodies, smoke.repository.rsplit("-", 1)[-1], context)
    yield check_images(work.matrix, tags)
    subprocess.run(["docker", "image", "rm", "-f", *tags.values()], capture_output=True)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_gpu_variant_fails_exactly_its_check(gpu_variants, name):
    _, check, text = VARIANTS[name]
    r = gpu_variants[name]
    assert r.code == 1, r.err[-3000:]
    failed = _failed(r.err)
    assert set(failed) == {check}, r.err[-3000:]
    assert text in failed[check] and failed[check].startswith("expected"), failed
    assert re.search(r"^\s+pass\s+gpu_(code|coverage)", r.err, re.M), r.err[-3000:]  # the other one ran and held
