"""The smoke target takes every path the cu129 build takes: CMake + ninja from the build lock, a
pinned third-party source (with a submodule) compiled with the network off, an extension linked
against libcuda.so.1, a +cu129 local version, a run-time toolchain; and the cu129 lock rehearses
against PyPI. Each path is shown working and, where it can break, breaking loudly."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from builder.records import provsign
from tests.conftest import REPO
from tests.integration.conftest import cli, variant_images
from tests.integration.test_checks import _failed

SITE = "/opt/k3/venv/lib/python3.11/site-packages"


def _run(ref: str, script: str) -> str:
    return subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", ref, "-c", script], capture_output=True, text=True, check=True
    ).stdout


def test_the_demo_image_is_built_like_cu129(built):
    smoke, ref = built
    record = json.loads(smoke.record.read_text())
    log = (smoke.root / "artifacts" / "smoke" / record["build"]["id"] / "build.log").read_text()
    # The compile step: network off, the third-party tree mounted (its output may be a cache hit).
    assert re.search(r"RUN --network=none .*--mount=type=bind,from=tp-k3kernels,target=/third_party/k3kernels", log)
    assert "MAX_JOBS=2 NVCC_THREADS=1: 2 compile job(s)" in log
    # The extension links the driver library, and the wheel carries the local version.
    out = _run(ref, f"readelf -d {SITE}/k3smoke/_C.*.so; ls -d {SITE}/k3smoke-*.dist-info")
    assert "NEEDED" in out and "[libcuda.so.1]" in out
    assert f"{SITE}/k3smoke-0.1.0+cu129.dist-info" in out
    # Importing it needs a driver library: the base's compat copy stands in, as on a GPU host.
    no_driver = subprocess.run(["docker", "run", "--rm", ref], capture_output=True, text=True)
    assert no_driver.returncode != 0 and "libcuda.so.1" in no_driver.stderr
    with_driver = subprocess.run(
        ["docker", "run", "--rm", "-e", "LD_LIBRARY_PATH=/usr/local/cuda/compat", ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "k3smoke 0.1.0+cu129" in with_driver and "driver 12090" in with_driver
    # The third party and its submodule are named in the record, the SBOM and the provenance.
    tp = record["source"]["third_party"]["k3kernels"]
    assert [s["path"] for s in tp["submodules"]] == ["third-party/k3math"]
    sbom = json.loads((smoke.root / "locks" / "smoke" / "sbom.cdx.json").read_text())
    refs = {c["bom-ref"]: c for c in sbom["components"]}
    assert refs["third_party:k3kernels"]["version"] == tp["commit"]
    assert refs["third_party:k3kernels/third-party/k3math"]["version"] == tp["submodules"][0]["commit"]
    prov = provsign.statement_of(smoke.root / "locks" / "smoke" / "provenance.intoto.json")  # the DSSE payload
    deps = {d["name"]: d for d in prov["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["third_party:k3kernels"]["digest"] == {"gitCommit": tp["commit"]}


def test_the_compile_runs_cmake_and_ninja_from_the_build_lock(built, tmp_path):
    smoke, _ = built
    work = smoke.variant(tmp_path / "uncached", "uncached")
    r = cli("--matrix", str(work.matrix), "--target", "smoke", "--no-cache", "--no-checks")
    assert r.code == 0, r.err[-2000:]
    log = next((work.root / "artifacts" / "smoke").glob("*/build.log")).read_text()
    assert re.search(r"\[\d+/\d+\] Building C object", log)  # ninja's progress lines
    assert "k3smoke: CMAKE_BUILD_TYPE=Release, 2 compile job(s), NVCC_THREADS=1" in log  # MAX_JOBS 2 / 1
    assert "k3kernels is available at /third_party/k3kernels" in log  # mounted, not downloaded
    assert "Successfully installed k3smoke-0.1.0+cu129" in log


def test_a_forgotten_third_party_source_fails_the_compile_not_the_image(built, tmp_path):
    smoke, _ = built

    def forget_third_party(text: str) -> str:
        cut = re.sub(r"\n      third_party:\n(        .*\n|          .*\n)+", "\n", text)
        assert "third_party" not in cut
        return cut

    # First line of defense: the fetch inventory refuses the unpinned FetchContent in seconds,
    # naming the file and line, before anything is fetched or built (exit 2: bad input).
    refused = smoke.variant(tmp_path / "refused", "refused", forget_third_party)
    r = cli("--matrix", str(refused.matrix), "--target", "smoke")
    assert r.code == 2, r.err[-2000:]
    assert "unpinned fetch in the build files: CMakeLists.txt:" in r.err and "k3kernels" in r.err
    logs = "".join(p.read_text() for p in (refused.root / "artifacts" / "smoke").glob("*/build.log"))
    assert "RUN --network=none" not in logs  # refused before the engine built anything

    # Second line: with the fetch waived (as a wrong waiver would), the compile still cannot
    # download it: CMake, disconnected, stops while configuring.
    def forget_and_waive(text: str) -> str:
        waiver = "      fetch_waivers:\n        CMakeLists.txt:k3kernels: a wrong waiver, for the test\n"
        text = forget_third_party(text)
        if "\n    kernels:\n" in text:  # the smoke's kernel block (kernels.required): the waiver joins it
            return text.replace("\n    kernels:\n", "\n    kernels:\n" + waiver, 1)
        return text.rstrip("\n") + "\n    kernels:\n" + waiver

    work = smoke.variant(tmp_path / "forgotten", "forgotten", forget_and_waive)
    record_before = work.record.read_bytes()
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 1, r.err[-2000:]
    log = next((work.root / "artifacts" / "smoke").glob("*/build.log")).read_text()
    assert "RUN --network=none" in log and "k3kernels" in log
    # CMake runs FETCHCONTENT_FULLY_DISCONNECTED with policy CMP0170 NEW: it names the source it
    # was not given and stops while configuring; it downloads nothing and compiles nothing.
    cmake = "\n".join(ln for ln in log.splitlines() if "CMake" in ln or "FETCHCONTENT" in ln or "populated" in ln)
    # An error (policy NEW), not the warning an unset CMP0170 gives; buildx prefixes every log line.
    assert re.search(r"CMake Error at \S*FetchContent\.cmake:\d+ \(message\):", log), cmake
    assert "FETCHCONTENT_FULLY_DISCONNECTED is set to true, which requires the source" in log, cmake
    assert "directory for dependency k3kernels to already be populated" in log, cmake
    assert "Configuring incomplete, errors occurred!" in log
    assert "k3kernels is available at" not in log  # it stopped there: nothing after FetchContent ran
    assert work.record.read_bytes() == record_before


def test_the_third_party_tree_on_its_developer_path_fails_python_trees(built, tmp_path):
    """cu129's FA4 defect, reproduced: the third-party tree handed over through the source's own
    *_SRC_DIR variable takes CMake's developer path (a symlink, imports not rewritten). The wheel
    then carries plain copies whose imports name a package the image lacks; the build fails its
    checks on exactly that, and the model that imports the tree does not resolve either."""
    smoke, _ = built
    work = smoke.variant(
        tmp_path / "developer-path",
        "developer-path",
        lambda text: text.replace("fetchcontent: k3kernels", "env: K3SMOKE_KERNELS_SRC_DIR"),
    )
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 1, r.err[-2000:]
    failed = _failed(r.err)
    assert set(failed) == {"python_trees", "recipe_cli"}, r.err[-3000:]
    assert "No module named 'k3kernels_py'" in failed["python_trees"]
    assert "architecture K3SmokeForConditionalGeneration" in failed["recipe_cli"]


def test_an_op_the_matrix_expects_absent_fails_when_it_appears(built, tmp_path):
    smoke, _ = built
    work = smoke.variant(
        tmp_path / "cuda13-op",
        "cuda13-op",
        lambda text: text.replace("K3SMOKE_CUDA_VERSION: 12.9.1", "K3SMOKE_CUDA_VERSION: 13.0.1"),
    )
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 1, r.err[-2000:]
    failed = _failed(r.err)
    assert set(failed) == {"ops_registered"}, r.err[-2000:]
    assert "found them registered: k3smoke._C.fused_decode" in failed["ops_registered"]


@pytest.fixture(scope="module")
def toolchain_variants(built):
    smoke, ref = built
    suffix = smoke.repository.rsplit("-", 1)[-1]
    lines = {
        "no-compiler": "USER 0\nRUN rm -f /usr/bin/gcc* /usr/bin/cc /usr/bin/x86_64-linux-gnu-gcc*\nUSER 2000:2000",
        "no-driver": "USER 0\nRUN rm -f /usr/local/cuda/compat/libcuda.so.1\nUSER 2000:2000",
        "nvcc-13": (
            "USER 0\nRUN mkdir -p /usr/local/cuda/bin && printf '#!/bin/sh\\necho \"Cuda compilation tools, "
            "release 13.0, V13.0.48\"\\n' > /usr/local/cuda/bin/nvcc && chmod 755 /usr/local/cuda/bin/nvcc\n"
            "ENV CUDA_HOME=/usr/local/cuda\nUSER 2000:2000"
        ),
    }
    tags = variant_images(ref, lines, suffix)
    yield smoke, tags
    subprocess.run(["docker", "image", "rm", "-f", *tags.values()], capture_output=True)


def test_no_c_compiler_fails_runtime_toolchain_and_names_the_removed_base_files(toolchain_variants):
    smoke, tags = toolchain_variants
    r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke", "--image", tags["no-compiler"])
    assert r.code == 1
    failed = _failed(r.err)
    # The variant's `rm` of the base's gcc is a whiteout of files an OS package owns: base_whiteouts
    # names them (issue 51), beside the toolchain check that finds no compiler.
    assert set(failed) == {"runtime_toolchain", "base_whiteouts"}, r.err[-2000:]
    assert "no C compiler" in failed["runtime_toolchain"]


def test_no_driver_library_fails_the_imports_and_says_why(toolchain_variants):
    smoke, tags = toolchain_variants
    r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke", "--image", tags["no-driver"])
    assert r.code == 1
    failed = _failed(r.err)
    # Every k3smoke module imports _C first, so without the driver library its Python tree and its
    # CLI do not import either; each check says so, the compiled module's says where it looked. The
    # entrypoint's imports fail too, so the image cannot start (the whole-image rules say so).
    assert set(failed) == {
        "compiled_modules",
        "ops_registered",
        "python_trees",
        "recipe_cli",
        "loaded_libraries",
        "image_starts",
    }, r.err[-2000:]
    assert "libcuda.so.1" in failed["compiled_modules"]


def test_an_nvcc_of_another_cuda_fails_runtime_toolchain_and_gpu_code(toolchain_variants, tmp_path):
    smoke, tags = toolchain_variants
    work = smoke.copy(tmp_path / "nvcc")
    text = work.matrix.read_text()
    assert text.count("\n    runtime:\n") == 1
    text = text.replace("\n    runtime:\n", "\n    runtime:\n      cuda_home: /usr/local/cuda\n")
    work.matrix.write_text(text)
    r = cli("--matrix", str(work.matrix), "test", "--target", "smoke", "--image", tags["nvcc-13"])
    assert r.code == 1
    failed = _failed(r.err)
    # FlashInfer and DeepGEMM JIT with $CUDA_HOME's nvcc: a CUDA 13 one is also a run-time compiler
    # newer than the 12.9 driver floor (gpu_code), not only the wrong toolkit (runtime_toolchain).
    assert set(failed) == {"runtime_toolchain", "gpu_code"}, r.err[-2000:]
    assert "nvcc: expected release 12.9, found 13.0" in failed["runtime_toolchain"]
    assert "13.0" in failed["gpu_code"]


def test_the_cu129_lock_rehearses_against_pypi(tmp_path):
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    r = cli("--matrix", str(tmp_path / "matrix.yaml"), "--json", "lock", "--target", "cu129", "--rehearse")
    assert r.code == 0, r.err[-3000:]
    doc = json.loads(r.out)
    rehearsal = doc["rehearsal"]
    assert rehearsal["rehearsal"] is True and rehearsal["ok"] is True
    assert "REHEARSAL" in r.err and "the real lock still needs the real indexes" in r.err
    subs = {(s["kind"], s["name"]): s for s in rehearsal["substitutions"]}
    assert subs[("runtime", "torch")]["used"] == "2.13.0"  # PyPI's build stands in for +cu129
    assert subs[("runtime", "flashinfer-jit-cache")]["used"] is None  # FlashInfer-index only: left out
    verdicts = {(f["name"], f["verdict"]) for f in rehearsal["other_cuda_major"]}
    assert ("nvidia-cutlass-dsl-libs-cu13", "allowed") in verdicts
    assert ("nvidia-nccl-cu13", "substitute") in verdicts  # only PyPI's CUDA 13 torch brings it
    assert not any(v == "FAIL" for _, v in verdicts)
    assert not (tmp_path / "locks").exists()  # a rehearsal writes no lock
    assert (tmp_path / "artifacts" / "cu129" / "rehearsal" / "report.json").exists()
    # Without the matrix's reasons the same CUDA 13 distributions fail the rehearsal, by name.
    text = (tmp_path / "matrix.yaml").read_text()
    bare = re.sub(r"\n      other_major:\n(        .*\n)+", "\n", text)
    assert "other_major" not in bare
    (tmp_path / "matrix.yaml").write_text(bare)
    r = cli("--matrix", str(tmp_path / "matrix.yaml"), "lock", "--target", "cu129", "--rehearse")
    assert r.code == 1, r.err[-3000:]
    assert re.search(r"FAIL\s+runtime: nvidia-cutlass-dsl-libs-cu13 4\.7\.1 \(CUDA 13\): no reason", r.err)
