"""The image checks catch what they claim to: broken variants of the smoke image, each failing
exactly the check that owns the problem, with a message that says expected and found. Every check
is shown failing on a real image, here or in test_miniature.py (runtime_toolchain,
compiled_modules without the driver library, ops_registered with an op that appears, python_trees
with the third-party tree on its developer path)."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from builder.config import contract, matrix
from builder.deps import lock
from builder.deps.hermetic import hermetic_env
from tests.integration import test_hostile_image
from tests.integration.conftest import check_images, cli, variant_images

SITE = "/opt/k3/venv/lib/python3.11/site-packages"
CUDART = f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12"
# A real CUDA runtime of another 12.x release from PyPI (its libcudart reports 12080), copied over
# the image's 12.9 one: the file name still says CUDA 12, only the version differs.
CUDART_12_8 = (
    "nvidia-cuda-runtime-cu12==12.8.90 --hash=sha256:adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90"
)
NCCL, OTHER_NCCL = "2.16.2", "2.16.5"  # a real NCCL wheel from PyPI (nvidia-nccl-cu12), and a pin the image lacks

# name: (Dockerfile lines after FROM <smoke>, the checks that fail, text in one failure message)
VARIANTS = {
    "no-expiry": ('LABEL "io.k3-cu129.expires"=""', {"expiry"}, "found it missing"),
    "expired": ('LABEL "io.k3-cu129.expires"="2020-01-01"', {"expiry"}, "the image has expired"),
    # Every k3smoke module imports _C first (as vLLM's model code needs its ops), so its Python tree
    # and its CLI fail with it, each saying so.
    "no-kernel": (
        f"USER 0\nRUN rm -f {SITE}/k3smoke/_C.*.so\nUSER 2000:2000",
        # and the image no longer starts, and a file its RECORD lists is gone (the whole-image rules),
        # and the required extension's GPU code went with it (gpu_coverage)
        {"compiled_modules", "ops_registered", "python_trees", "recipe_cli"}
        | {"installed_files", "image_starts", "loaded_libraries", "gpu_coverage"},
        "k3smoke._C: ImportError",
    ),
    "cuda13": (
        f"USER 0\nRUN cp {CUDART} /usr/lib/x86_64-linux-gnu/libcudart.so.13\nUSER 2000:2000",
        {"no_other_cuda_major"},
        "libcudart.so.13",
    ),
    "cuda12.8": (
        f"COPY libcudart.so.12 {CUDART}",
        {"cuda_runtime", "installed_files"},  # the file is also not what its wheel installed
        f"from the loaded libcudart, found 12080 at {CUDART}",
    ),
    "world-writable": (
        f"USER 0\nRUN chmod 0666 {SITE}/k3smoke/__init__.py\nUSER 2000:2000",
        {"no_world_writable", "least_privilege"},  # on sys.path: the runtime user can write it
        "k3smoke/__init__.py",
    ),
    # root can write everything on sys.path: least_privilege says so too
    "root": ("USER 0:0", {"non_root", "least_privilege"}, "expected a non-root default user, found 0:0"),
    "unlocked": (
        f"USER 0\nRUN mkdir {SITE}/extra_pkg-1.0.dist-info && printf 'Metadata-Version: 2.1\\nName: extra-pkg"
        f"\\nVersion: 1.0\\n' > {SITE}/extra_pkg-1.0.dist-info/METADATA\nUSER 2000:2000",
        {"lock_contents"},
        "extra-pkg 1.0: not in the lock",
    ),
    "wrong-label": (
        'LABEL "io.k3-cu129.owner"="someone-else@example.org"',
        {"labels"},
        "io.k3-cu129.owner: expected 'gpu-platform@example.org', found 'someone-else@example.org'",
    ),
    # The source's package now declares a requirement its environment does not meet: a dependency
    # conflict only `pip check` sees (every name and version still equals the lock).
    "pip-conflict": (
        f"USER 0\nRUN sed -i '/^Version:/a Requires-Dist: packaging>=999' "
        f"{SITE}/k3smoke-0.1.0+cu129.dist-info/METADATA\nUSER 2000:2000",
        {"pip_check", "installed_files"},  # METADATA no longer has its RECORD hash
        "has requirement packaging>=999, but you have packaging",
    ),
    # A Python file in the tree the CMake install step put into the wheel, importing a package the
    # image lacks: what FA4's cute files do when their imports are not rewritten.
    "stray-import": (
        f"USER 0\nRUN printf 'from k3kernels_py.norms import rms_norm\\n' > "
        f"{SITE}/k3smoke/kernels_py/stray.py\nUSER 2000:2000",
        {"python_trees", "installed_files"},  # a file no RECORD lists
        "k3smoke.kernels_py.stray: ModuleNotFoundError: No module named 'k3kernels_py'",
    ),
    # An extension that needs the CUDA 13 runtime (PyPI's torchcodec does): linked against a stub
    # with that soname, the stub then removed, so only the NEEDED entry is left.
    "needs-cudart13": (
        "USER 0\nRUN printf 'int k3_v13(void) { return 13; }\\n' > /tmp/s.c "
        "&& gcc -shared -fPIC -Wl,-soname,libcudart.so.13 -o /tmp/libcudart.so.13 /tmp/s.c "
        "&& printf 'int k3_use(void) { return 0; }\\n' > /tmp/u.c "
        f"&& gcc -shared -fPIC -o {SITE}/k3smoke/_uses13.so /tmp/u.c -Wl,--no-as-needed /tmp/libcudart.so.13 "
        "&& rm -f /tmp/s.c /tmp/u.c /tmp/libcudart.so.13\nUSER 2000:2000",
        {"shared_libraries", "everything_loads", "installed_files"},  # does not load; no RECORD lists it
        f"{SITE}/k3smoke/_uses13.so needs libcudart.so.13, a CUDA 13 library",
    ),
    # FA4's developer-mode symlink: the third-party tree as it was mounted during the compile.
    "dangling-link": (
        f"USER 0\nRUN ln -s /third_party/k3kernels/python/k3kernels_py {SITE}/k3smoke/kernels_dev\nUSER 2000:2000",
        {"image_hygiene", "installed_files"},  # a link no RECORD lists
        f"symlink {SITE}/k3smoke/kernels_dev -> /third_party/k3kernels/python/k3kernels_py dangles",
    ),
    # Package data a wheel built without VCS metadata drops (vLLM: its tuning configs), and a shell
    # wrapper that lost its execute bit (vLLM: numa_wrapper.sh, which --numa-bind execs).
    "dropped-package-data": (
        f"USER 0\nRUN rm -f {SITE}/k3smoke/configs/*.json\nUSER 2000:2000",
        {"package_files", "installed_files"},  # files its RECORD lists are gone
        "k3smoke/configs/E=8,N=128,device_name=K3-Smoke.json missing",
    ),
    "wrapper-not-executable": (
        f"USER 0\nRUN chmod a-x {SITE}/k3smoke/utils/numa_wrapper.sh\nUSER 2000:2000",
        {"package_files"},
        "k3smoke/utils/numa_wrapper.sh not executable",
    ),
    # A later layer that replaces a file of the OS layer: numactl is no longer the package's.
    "os-layer": (
        "USER 0\nRUN printf '#!/bin/sh\\nexit 3\\n' > /usr/bin/numactl\nUSER 2000:2000",
        {"os_packages"},
        "numactl: /usr/bin/numactl differs from the package",
    ),
    # --- issue 34: the whole-image rules (builder/checks/checklist_image.py), one variant each ---
    # A second copy of an installed distribution (same name and version, its own dist-info).
    "second-copy": (
        f"USER 0\nRUN cp -r {SITE}/packaging-26.4.dist-info {SITE}/packaging-26.4.post0.dist-info\nUSER 2000:2000",
        {"lock_contents"},
        "packaging: 2 copies installed",
    ),
    # A data file of a dependency changed after it was installed: only its RECORD hash says so.
    "tampered": (
        f"USER 0\nRUN echo tampered >> {SITE}/packaging/py.typed\nUSER 2000:2000",
        {"installed_files"},
        f"{SITE}/packaging/py.typed: sha256 differs from packaging-26.4.dist-info/RECORD",
    ),
    # A shared object no module names, outside every declared tree, with a symbol nothing defines.
    "unbound-symbol": (
        "USER 0\nRUN printf 'extern int k3_nowhere(void);\\nint k3_use(void) { return k3_nowhere(); }\\n' > /tmp/u.c "
        "&& gcc -shared -fPIC -o /opt/k3/venv/lib/libk3open.so /tmp/u.c && rm /tmp/u.c\nUSER 2000:2000",
        {"everything_loads"},
        "undefined symbol: k3_nowhere",
    ),
    # Another CUDA runtime of another 12.x release beside the one the app loads.
    "stray-cudart": (
        "COPY libcudart.so.12 /opt/k3/lib/libcudart.so.12",
        {"loaded_libraries"},
        "/opt/k3/lib/libcudart.so.12: reports 12080, expected 12090",
    ),
    "no-entrypoint": ('ENTRYPOINT ["k3smoke-serve"]', {"image_starts"}, "k3smoke-serve is not on PATH"),
    "setuid": (
        "USER 0\nRUN cp /bin/true /opt/k3/venv/bin/k3-helper && chmod 4755 /opt/k3/venv/bin/k3-helper\nUSER 2000:2000",
        {"least_privilege"},
        "/opt/k3/venv/bin/k3-helper: set-id mode 0o4755",
    ),
    # What pip's own compileall writes by default outside SOURCE_DATE_EPOCH: bytecode no source check guards.
    "unchecked-pyc": (
        "USER 0\nRUN python -c \"import importlib.util as u, py_compile as c; s='"
        f"{SITE}/k3smoke/cli.py'; c.compile(s, cfile=u.cache_from_source(s), "
        'invalidation_mode=c.PycInvalidationMode.UNCHECKED_HASH)"\nUSER 2000:2000',
        {"bytecode_matches"},
        "unchecked hash-based, not checked hash-based",
    ),
    # python-build-standalone's build prefix left in a library's RUNPATH.
    "build-runpath": (
        "USER 0\nRUN printf 'int k3_r(void) { return 0; }\\n' > /tmp/r.c && gcc -shared -fPIC "
        "-o /opt/k3/venv/lib/libk3rp.so /tmp/r.c -Wl,--enable-new-dtags,-rpath,/install/lib && rm /tmp/r.c\nUSER 2000:2000",
        {"image_hygiene"},
        "DT_RUNPATH /install/lib is under a build-only root",
    ),
    # --- issue 34, the rest of rule 1: forgeries no RECORD in the image can show ---------------------
    # A dependency's file edited and its RECORD line re-hashed: only the locked wheel's RECORD, whose
    # digest the build recorded (image.json wheel_records), differs.
    "forged-record": (
        f"COPY forge.py /tmp/forge.py\nUSER 0\nRUN python /tmp/forge.py {SITE} packaging-26.4.dist-info/RECORD "
        "packaging/py.typed forged && rm /tmp/forge.py\nUSER 2000:2000",
        {"installed_files"},
        "not the locked wheel's RECORD (packaging 26.4)",
    ),
    # A module of the source's own package edited in a later layer, its RECORD line re-hashed and its
    # checked bytecode written again: only the pinned commit's tree says it is not the source.
    "edited-package": (
        f"COPY forge.py /tmp/forge.py\nUSER 0\nRUN python /tmp/forge.py {SITE} k3smoke-0.1.0+cu129.dist-info/RECORD "
        "k3smoke/argparse_utils.py '# edited in a later layer' && rm /tmp/forge.py\nUSER 2000:2000",
        {"package_files"},
        "k3smoke/argparse_utils.py: differs from the pinned commit's",
    ),
}

# Appends a line to SITE/REL, re-hashes REL's line in SITE/RECORD and, for a module, writes its
# checked hash-based bytecode again (as the build's layer step does): every rule that reads the
# image alone still holds.
FORGE = """import base64, hashlib, importlib.util, py_compile, sys
site, record, rel, text = sys.argv[1:5]
path = site + "/" + rel
with open(path, "a") as fh:
    fh.write(text + "\\n")
data = open(path, "rb").read()
digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
lines = open(site + "/" + record).read().splitlines(keepends=True)
with open(site + "/" + record, "w") as fh:
    fh.writelines(f"{rel},sha256={digest},{len(data)}\\n" if ln.startswith(rel + ",") else ln for ln in lines)
if rel.endswith(".py"):
    mode = py_compile.PycInvalidationMode.CHECKED_HASH
    py_compile.compile(path, cfile=importlib.util.cache_from_source(path), dfile=path, invalidation_mode=mode)
"""


def _cudart_12_8(into: Path) -> None:
    """libcudart.so.12 out of the hash-checked 12.8.90 wheel from PyPI."""
    req = into / "req.txt"
    req.write_text(CUDART_12_8 + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            "--only-binary",
            ":all:",
            "--platform",
            "manylinux_2_17_x86_64",
            "--python-version",
            "3.11",
            "-r",
            str(req),
            "-d",
            str(into),
        ],
        check=True,
        env=hermetic_env(),
        capture_output=True,
    )
    wheel = next(into.glob("nvidia_cuda_runtime_cu12-12.8.90-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        (into / "libcudart.so.12").write_bytes(z.read("nvidia/cuda_runtime/lib/libcudart.so.12"))


@pytest.fixture(scope="module")
def variants(built, tmp_path_factory):
    """Every variant built and checked once, side by side: (smoke, tags, the `build test` runs)."""
    smoke, ref = built
    context = tmp_path_factory.mktemp("variant-context")
    _cudart_12_8(context)
    (context / "forge.py").write_text(FORGE)
    bodies = {name: lines for name, (lines, _, _) in VARIANTS.items()}
    tags = variant_images(ref, bodies, smoke.repository.rsplit("-", 1)[-1], context)
    yield smoke, tags, check_images(smoke.matrix, tags)
    subprocess.run(["docker", "image", "rm", "-f", *tags.values()], capture_output=True)


def _failed(stderr: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s+FAIL\s+(\S+)\s+(.*)$", stderr, re.M)}


def test_the_built_image_passes_and_leaves_a_junit_report(built):
    smoke, ref = built
    r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke")
    assert r.code == 0, r.err[-3000:]
    assert r.out.strip().splitlines()[-1] == ref  # tests the recorded digest by default
    assert not _failed(r.err)
    assert re.search(r"^\s+pass\s+cuda_runtime", r.err, re.M)
    # The smoke pins neither FlashInfer nor NCCL: that check is reported skipped, not passed.
    assert re.search(r"^\s+skip\s+pinned_versions\s+the target pins no FlashInfer or NCCL", r.err, re.M)
    # The smoke is amd64: page_alignment (arm64 images only) says why it skipped.
    assert re.search(r"^\s+skip\s+page_alignment\s+the image's interpreter is x86_64", r.err, re.M), r.err[-3000:]
    # A smoke whose matrix has no `gpu` block skips the two GPU-code checks too.
    skips = 2 if matrix.load(smoke.matrix).target("smoke").gpu else 4
    assert f"checks: {len(contract.CHECKS) - skips} pass, {skips} skip, 0 FAIL" in r.err
    reports = list((smoke.root / "artifacts" / "smoke").glob("*/checks.xml"))
    assert any((p.parent / "build.log").exists() for p in reports), "the build's own checks sit beside its log"
    suite = ET.parse(reports[0]).getroot().find("testsuite")
    assert int(suite.get("tests")) == len(contract.CHECKS)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_broken_variant_fails_the_right_check(variants, name):
    _, _, runs = variants
    _, expected_failures, expected_text = VARIANTS[name]
    r = runs[name]
    assert r.code == 1, r.err[-3000:]
    failed = _failed(r.err)
    assert set(failed) == expected_failures, r.err[-3000:]
    assert any(expected_text in message for message in failed.values()), failed
    assert all("expected" in message for message in failed.values()), failed
    assert "image checks failed" in r.err and "the image is kept" in r.err


def test_a_recipe_naming_an_unknown_parser_fails_recipe_cli_only(built, tmp_path):
    """The image is right, the launch command is not: the CLI's own registry refuses the parser."""
    smoke, ref = built
    work = smoke.variant(
        tmp_path / "recipe",
        "recipe",
        lambda text: text.replace("--tool-call-parser k3smoke", "--tool-call-parser k3smoke_k9"),
    )
    r = cli("--matrix", str(work.matrix), "test", "--target", "smoke", "--image", ref)
    assert r.code == 1, r.err[-3000:]
    failed = _failed(r.err)
    assert set(failed) == {"recipe_cli"}, r.err[-3000:]
    assert "--tool-call-parser 'k3smoke_k9': KeyError" in failed["recipe_cli"], failed


def test_a_build_whose_checks_fail_keeps_the_image_but_not_the_record(built, tmp_path):
    smoke, _ = built
    work = smoke.variant(
        tmp_path / "expired",
        "expired",
        lambda text: re.sub(r"expires: '?\d{4}-\d{2}-\d{2}'?", "expires: '2021-01-31'", text),
    )
    record_before = work.record.read_bytes()
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 1, r.err[-3000:]
    assert set(_failed(r.err)) == {"expiry"}
    pushed = re.search(r"(\S+@sha256:[0-9a-f]{64}): image checks failed", r.err).group(1)
    assert subprocess.run(["docker", "buildx", "imagetools", "inspect", pushed], capture_output=True).returncode == 0
    assert work.record.read_bytes() == record_before  # image.json names only checked images
    reports = list((work.root / "artifacts" / "smoke").glob("*/checks.xml"))
    assert len(reports) == 1 and (reports[0].parent / "build.log").exists()


def test_every_check_is_shown_failing_on_a_real_image():
    shown = set().union(*(checks for _, checks, _ in VARIANTS.values()))
    shown |= {"runtime_toolchain", "ops_registered", "compiled_modules"}  # test_miniature.py
    shown |= {"pinned_versions"}  # test_a_pin_the_image_does_not_carry_fails_pinned_versions_only
    shown |= {"gpu_code", "gpu_coverage"}  # test_gpu_checks.py
    shown |= set(test_hostile_image.RUNTIME_ROWS)  # issue 51: an OCI-level variant
    shown |= {"cpu_level"}  # test_hostile_image.py: an OCI-level variant, and NumPy from PyPI
    # Not yet on a real image, and why (each is shown failing in the unit test named):
    not_yet = {
        "page_alignment": "arm64 images only; the smoke's arm64 leg builds none yet (tests/unit/test_pagealign.py)"
    }
    assert shown == set(contract.CHECKS) - set(not_yet)


@pytest.fixture(scope="module")
def pinned(built, tmp_path_factory):
    """The smoke with an NCCL pin, locked and built for real: the lock gets nvidia-nccl-cu12 as a uv
    override plus a top-level pin, and the image carries that wheel from PyPI."""
    smoke, _ = built

    def pin_nccl(text: str) -> str:
        assert "\n    compile:\n" in text and "nccl:" not in text
        return text.replace("\n    compile:\n", f"\n    nccl:\n      version: {NCCL}\n    compile:\n", 1)

    work = smoke.variant(tmp_path_factory.mktemp("pinned") / "work", "pinned", pin_nccl)
    r = cli("--matrix", str(work.matrix), "lock", "--target", "smoke")
    assert r.code == 0, r.err[-3000:]
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 0, r.err[-3000:]
    yield work, r.out.strip().splitlines()[-1], r.err


def test_a_pinned_nccl_is_locked_as_an_override_and_checked_in_the_image(pinned):
    work, ref, err = pinned
    _, entries = lock.parse_lock((work.root / "locks" / "smoke" / "requirements.txt").read_text(), Path("x"))
    nccl = [e for e in entries if e.name == "nvidia-nccl-cu12"]
    assert [(e.version, e.override) for e in nccl] == [(NCCL, True)]
    assert re.search(r"^\s+pass\s+pinned_versions", err, re.M), err[-3000:]
    assert f"checks: {len(contract.CHECKS) - 1} pass, 1 skip, 0 FAIL" in err  # page_alignment: amd64


def test_a_pin_the_image_does_not_carry_fails_pinned_versions_only(pinned, tmp_path):
    work, ref, _ = pinned
    work = work.copy(tmp_path / "moved-pin")
    # The matrix moved its pin; the image (and its lock) did not.
    work.matrix.write_text(work.matrix.read_text().replace(f"version: {NCCL}\n", f"version: {OTHER_NCCL}\n", 1))
    r = cli("--matrix", str(work.matrix), "test", "--target", "smoke", "--image", ref)
    assert r.code == 1, r.err[-3000:]
    failed = _failed(r.err)
    assert set(failed) == {"pinned_versions"}, r.err[-3000:]
    assert failed["pinned_versions"] == f"nvidia-nccl-cu12: expected {OTHER_NCCL}, found {NCCL}"
