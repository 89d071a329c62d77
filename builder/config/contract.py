"""The image-facing contract: label keys, record files and their formats, paths.

Everything an auditor reads (labels on the image, files under ``locks/``, artifacts) is named
here and nowhere else; docs/auditor.md ("The auditor's contract") documents this module.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Labels every image carries. OCI predefined keys where OCI has one; OCI defines no expiry or
# owner key, so these live under a reverse-DNS prefix the owner controls (like Quay's
# ``quay.expires-after``, but an ISO date rather than a duration so it can be checked offline).
DEFAULT_LABEL_PREFIX = "io.k3-cu129"


@dataclass(frozen=True)
class LabelKeys:
    """The project's own label keys, under a reverse-DNS prefix its owner controls (matrix
    ``label_prefix``; default io.k3-cu129)."""

    prefix: str = DEFAULT_LABEL_PREFIX

    @property
    def expires(self) -> str:  # ISO date (YYYY-MM-DD) after which the image must not run
        return f"{self.prefix}.expires"

    @property
    def owner(self) -> str:  # who answers for this bridge build
        return f"{self.prefix}.owner"

    @property
    def target(self) -> str:  # matrix target name
        return f"{self.prefix}.target"

    @property
    def cuda(self) -> str:  # CUDA version the image was built against
        return f"{self.prefix}.cuda-version"

    @property
    def lock_sha256(self) -> str:  # sha256 of locks/<target>/requirements.txt
        return f"{self.prefix}.lock-sha256"

    @property
    def builder_source(self) -> str:  # this repository (the tool and matrix that build the image)
        return f"{self.prefix}.builder.source"

    @property
    def sbom(self) -> str:  # where per-component licenses are: the attached CycloneDX SBOM
        return f"{self.prefix}.sbom"

    @property
    def driver_floor(self) -> str:  # oldest driver the GPU code needs (gpu.driver_floor, proven by gpu_code)
        return f"{self.prefix}.driver-floor"

    @property
    def gpu_families(self) -> str:  # compute capabilities the image serves, space-separated, oldest first
        return f"{self.prefix}.gpu-families"


def keys_in(labels: Mapping[str, str]) -> LabelKeys:
    """The keys an image's labels use: the prefix whose ``.target`` and ``.expires`` are both set
    (an image built under another matrix's label_prefix), else the default. Readers that see only
    an image (doctor, compare, evidence, test --image) find its prefix this way."""
    for key in sorted(labels):
        prefix = key[: -len(".target")] if key.endswith(".target") else None
        if prefix and f"{prefix}.expires" in labels:
            return LabelKeys(prefix)
    return LabelKeys()


_DEFAULT_KEYS = LabelKeys()
LABEL_PREFIX = DEFAULT_LABEL_PREFIX
LABEL_EXPIRES = _DEFAULT_KEYS.expires
LABEL_OWNER = _DEFAULT_KEYS.owner
LABEL_TARGET = _DEFAULT_KEYS.target
LABEL_CUDA = _DEFAULT_KEYS.cuda
LABEL_LOCK_SHA256 = _DEFAULT_KEYS.lock_sha256
LABEL_BUILDER_SOURCE = _DEFAULT_KEYS.builder_source
LABEL_SBOM = _DEFAULT_KEYS.sbom
LABEL_DRIVER_FLOOR = _DEFAULT_KEYS.driver_floor
LABEL_GPU_FAMILIES = _DEFAULT_KEYS.gpu_families
OCI_CREATED = "org.opencontainers.image.created"
# source and revision are a pair (OCI annotations): both name the packaged software, vLLM's
# repository and the pinned commit. Not this repository's: a label carrying this repository's
# commit would change the image digest with every commit of the tool (no rebuild would be "up to
# date", no reproduce bit for bit) and the committed Dockerfile would have to name the commit it is
# committed in. This repository is the own label ``<prefix>.builder.source``; its commit is in the
# provenance (builderDependencies), where a per-build fact belongs.
OCI_SOURCE = "org.opencontainers.image.source"  # the packaged software's repository (source.url)
OCI_REVISION = "org.opencontainers.image.revision"  # its commit (source.commit), in that repository
OCI_VERSION = "org.opencontainers.image.version"
OCI_TITLE = "org.opencontainers.image.title"
OCI_DESCRIPTION = "org.opencontainers.image.description"
OCI_VENDOR = "org.opencontainers.image.vendor"
OCI_LICENSES = "org.opencontainers.image.licenses"
OCI_BASE_NAME = "org.opencontainers.image.base.name"
OCI_BASE_DIGEST = "org.opencontainers.image.base.digest"

# Committed records, per target.
DOCKERFILES_DIR = Path("dockerfiles")
LOCKS_DIR = Path("locks")
DOCKERFILE_NAME = "Dockerfile"
LOCK_NAME = "requirements.txt"  # runtime environment of the image (installed with --require-hashes)
BUILD_LOCK_NAME = "build-requirements.txt"  # build stage only (compilers' Python side)
OS_LOCK_NAME = "os-packages.txt"  # the final image's OS packages (.debs by sha256; builder/deps/oslock.py)
RECORD_NAME = "image.json"
SBOM_NAME = "sbom.cdx.json"  # CycloneDX 1.6 JSON, same image -> same bytes
PROVENANCE_NAME = "provenance.intoto.json"  # DSSE envelope of an in-toto Statement v1 (SLSA provenance v1)
RECORD_SCHEMA = 2  # 2: the record names its SBOM/provenance by sha256 and whether checks ran

# Per-build artifacts (not committed): artifacts/<target>/<build-id>/build.log
ARTIFACTS_DIR = Path("artifacts")
BUILD_LOG_NAME = "build.log"
METADATA_NAME = "metadata.json"  # buildx's --metadata-file, beside the log

# Containers this tool starts (checks, probes) carry this label with the starting process's pid.
CONTAINER_LABEL = f"{LABEL_PREFIX}.container-of-pid"

# Every layer root is clamped to this fixed time (2000-01-01T00:00:00Z), not to the source
# commit's, so a source bump leaves the dependency layers byte for byte as they were, a
# Python-only bump app-native and a C-only bump app-python (same layer digests).
DEPS_EPOCH = 946684800

# The source's own wheel, in two layers on top, split by ELF magic (builder/dockerfile/templates/layer_files.py):
# app-native holds the ELF files (extensions, shared libraries, executables) and RECORD.native
# (their RECORD lines, hashes intact); app-python everything else, with those hashes left empty in
# its RECORD, and its bytecode.
APP_LAYERS = ("app-native", "app-python")
NATIVE_RECORD_NAME = "RECORD.native"
# The in-build helper (context tools/), and the log line its bytecode step prints per layer root:
# "K3-BYTECODE <root>: N compiled, M not compilable (...), K not deterministic (...)".
LAYER_TOOL = "tools/layer_files.py"
RELOCATE_TOOL = "python/relocate.py"  # standalone CPython targets only
# Scripts the build runs from the default context (context path -> file in builder/dockerfile/templates/).
# They are inputs like the locks: the rendered Dockerfile names each by sha256, so they are in
# the Dockerfile's hash, the input key and the record, and the context must hold exactly those bytes.
CONTEXT_SCRIPTS = {LAYER_TOOL: "layer_files.py", RELOCATE_TOOL: "relocate_python.py"}
BYTECODE_MARKER = "K3-BYTECODE"

# The BuildKit secret that carries the remote compile cache's endpoint and credentials (sccache
# environment lines) into the compile step; `build --compile-cache URL` makes it.
COMPILE_CACHE_SECRET = "k3_compile_cache"
# The build argument that picks the compile stage: the network-off one unless a backend is given.
COMPILE_MODE_ARG = "K3_COMPILE_MODE"
COMPILE_MODE_REMOTE = "remote-cache"
STATS_MARKER = "K3-SCCACHE-STATS "  # the compile step prints sccache's JSON stats after this
# ...and this line when the backend did not answer and it compiled with the local cache alone.
FALLBACK_MARKER = "K3-SCCACHE-BACKEND-UNREACHABLE"

# Times: every timestamp the tool writes (labels, records, provenance) is UTC in this format.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def created_iso(epoch: int) -> str:
    """SOURCE_DATE_EPOCH as the `created` label, the SBOM timestamp and the OCI annotation."""
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime(TIME_FORMAT)


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime(TIME_FORMAT)


# Fields of image.json, in the order they are written. ``build`` holds the volatile part
# (time, duration, id); everything else is a pure function of the inputs and the digest.
RECORD_FIELDS = (
    "schema",
    "target",
    "image",
    "digest",
    "bases",
    "source",
    "lock_sha256",
    "build_lock_sha256",
    "dockerfile_sha256",
    "source_date_epoch",
    "input_key",
    "tool_version",
    "checks",
    "build",
)


# Optional field of image.json, after "checks": what the GPU-code checks proved (targets with a
# matrix ``gpu`` block whose checks ran): the claimed and the derived driver floor, the families
# and the coverage table (builder/records/store.py; docs/auditor.md).
RECORD_GPU = "gpu"
# Optional field of image.json, after "gpu": each locked wheel's RECORD as the build installed it
# (normalized name -> version, entries, sha256 of the canonical entries: builder/deps/buildcontext.py),
# which installed_files holds the installed RECORDs to; the provenance names its sha256
# (resolvedDependencies "wheel-records"), so an edit is found offline.
RECORD_WHEELS = "wheel_records"

THIRD_PARTY_CONTEXT_PREFIX = "tp-"  # build context name of a pinned third-party source: tp-<name>


def layer_names(target_layers) -> list[str]:
    """The runtime lock's layers in image order: the matrix's groups, then the rest ("deps")."""
    return [layer.name for layer in target_layers] + ["deps"]


def third_party_context(name: str) -> str:
    return f"{THIRD_PARTY_CONTEXT_PREFIX}{name}"


def dockerfile_path(root: Path, target: str) -> Path:
    return root / DOCKERFILES_DIR / target / DOCKERFILE_NAME


def lock_path(root: Path, target: str) -> Path:
    return root / LOCKS_DIR / target / LOCK_NAME


def build_lock_path(root: Path, target: str) -> Path:
    return root / LOCKS_DIR / target / BUILD_LOCK_NAME


def os_lock_path(root: Path, target: str) -> Path:
    return root / LOCKS_DIR / target / OS_LOCK_NAME


def record_path(root: Path, target: str) -> Path:
    return root / LOCKS_DIR / target / RECORD_NAME


def platform_slug(platform: str) -> str:
    """linux/arm64 -> linux-arm64: a platform in a file, directory or tag name (the one spelling)."""
    return platform.replace("/", "-")


def platform_record_dir(root: Path, target: str, platform: str) -> Path:
    """locks/<target>/<os>-<arch>/: one platform's record set of a target built into an image index
    (its image.json, SBOM and provenance); locks/<target>/image.json is then the index's record."""
    return root / LOCKS_DIR / target / platform_slug(platform)


INDEX_KIND = "image-index"  # image.json's ``kind`` for the record of an image index (builder/records/index.py)


def platform_tag(tag: str, platform: str) -> str:
    """The tag one platform's manifest is pushed under before the index names it: <tag>-<os>-<arch>."""
    return f"{tag}-{platform_slug(platform)}"


def sbom_path(root: Path, target: str) -> Path:
    return root / LOCKS_DIR / target / SBOM_NAME


def provenance_path(root: Path, target: str) -> Path:
    return root / LOCKS_DIR / target / PROVENANCE_NAME


def artifacts_path(root: Path, target: str, build_id: str) -> Path:
    """artifacts/<target>/<id>/: one directory per build (<UTC time>-<hex>) or test run
    (test-<UTC time>-<hex>), newest last by name. Kept: build.log, metadata.json, checks.xml,
    checks.txt, reproduce-diff.txt; the inputs handed to the engine (context/, source/,
    third_party/, BULKY_INPUTS) are removed after the build unless --keep-context."""
    return root / ARTIFACTS_DIR / target / build_id


BULKY_INPUTS = ("context", "source", "third_party")

# Where the image's application lives: the interpreter, the venv and every layer the tool builds.
# The shared_libraries, image_hygiene and python_trees checks look here.
APP_PREFIX = "/opt/k3"
# Paths that exist only in the build stages (sources, third-party trees, the build venv and
# wheels, the context, the layer roots): nothing installed may point at them (image_hygiene).
# python-build-standalone's CPython is built under /install and manylinux's interpreters live in
# /opt/python: an RPATH or a shebang naming either points at nothing in this image.
BUILD_ONLY_ROOTS = ("/third_party", "/src", "/build", "/ctx", "/layers", "/install", "/opt/python")
# Libraries a GPU host's container runtime (nvidia-container-toolkit) mounts into the container
# from the driver: an image must not carry them, so a NEEDED of one is not a missing library.
DRIVER_LIBRARIES = {
    "libcuda.so.1": "CUDA driver API",
    "libnvidia-ml.so.1": "NVML (nvidia-smi, pynvml)",
    "libnvidia-ptxjitcompiler.so.1": "the driver's PTX JIT",
    "libnvidia-nvvm.so.4": "the driver's NVVM (JIT of LTO-IR)",
    "libcudadebugger.so.1": "the CUDA debugger backend",
    "libnvcuvid.so.1": "NVDEC video decoding (PyNvVideoCodec)",
    "libnvidia-encode.so.1": "NVENC video encoding",
    "libnvidia-opticalflow.so.1": "the optical flow SDK",
}
# CUDA libraries whose soname major is the CUDA major (libcudart.so.12 on 12.x, .13 on 13.x).
# Others number their own (libcufft.so.11 on 12.x, libcudnn.so.9, libnccl.so.2) and are judged
# by their distribution's name instead (no_other_cuda_major).
CUDA_TRACKING_LIBS = (
    "cudart",
    "cublas",
    "cublasLt",
    "nvblas",
    "nvrtc",
    "nvrtc-builtins",
    "nvJitLink",
    "nvjpeg",
    "cupti",
    "nvperf_host",
    "nvperf_target",
    "nppc",
    "nppial",
    "nppicc",
    "nppidei",
    "nppif",
    "nppig",
    "nppim",
    "nppist",
    "nppisu",
    "nppitc",
    "npps",
)


# The image checks `build test` runs (builder/checks/checklist.py and checklist_image.py hold one test
# per entry, same name).
# Expectations come from the matrix (and the record); nothing here is a constant of a test.
CHECKS = {
    "cuda_runtime": "libcudart in the image reports the matrix's CUDA major.minor (cudaRuntimeGetVersion); "
    "/usr/local/cuda/version.json, CUDA_VERSION and torch.version.cuda agree where present",
    "no_other_cuda_major": "no libcudart/libcublas of another CUDA major, no *-cuNN distribution of another "
    "major, no torch +cuNNN build of another CUDA, except distributions the matrix lists "
    "under cuda.other_major with a reason (shown in the output)",
    "compiled_modules": "every compiled module the source's build files declare (plus matrix adds, minus waives) "
    "imports, with the base's compat libcuda.so.1 standing in for a GPU host's driver",
    "ops_registered": "every op/attribute the matrix names resolves after the modules are imported "
    "(vLLM: torch.ops._C.<op>), and every op the matrix expects absent (with its reason) is absent",
    "pinned_versions": "FlashInfer and NCCL distributions in the image equal the matrix pins",
    "expiry": "the expiry label holds the matrix's ISO date, is not past, is within the horizon after the "
    "build date; a warning inside the warning window",
    "labels": "owner label and OCI revision/source/version/created/base.name/base.digest match the matrix",
    "lock_contents": "every distribution in the image's environment is in the lock at the same version, "
    "and every lock entry is installed",
    "pip_check": "pip check passes (conflicts with a matrix override, e.g. NCCL, are reported, not failed)",
    "non_root": "the image runs as a non-root user by default",
    "no_world_writable": "no world-writable file anywhere, and no world-writable directory without the "
    "sticky bit (/tmp-style directories) outside /tmp",
    "runtime_toolchain": "the C compiler Triton picks ($CC, else gcc, else clang) compiles and links a program "
    "and compiles against INCLUDEPY/Python.h; where the target has a run-time CUDA toolkit, "
    "CUDA_HOME is set, its nvcc reports the matrix's CUDA, compiles a trivial kernel, and "
    "compiles against the headers run-time JIT includes (cuda_runtime.h, nvrtc.h, curand.h, "
    "cublas_v2.h); TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH, where set, are executables",
    "python_trees": "every module under the Python trees the matrix names (source.extensions.python_trees: what "
    "CMake install steps and third-party sources put into the wheel) imports, with the compat "
    "libcuda.so.1; skipped modules are listed with their reason",
    "shared_libraries": "every ELF file under the application prefix finds each NEEDED library as ld.so would "
    "(RPATH/RUNPATH with $ORIGIN, LD_LIBRARY_PATH, the ld.so cache, the default directories) "
    "or from a library the image carries that an earlier import loads (torch's pattern); "
    "only the driver libraries the container runtime mounts are exempt; a NEEDED CUDA "
    "library of another major fails unless cuda.other_major names the file's distribution; "
    "every library the matrix says a package dlopens by name (runtime.dlopen) loads",
    "image_hygiene": "no symlink under the application prefix dangles or points into a build-only path, and no "
    ".pth, RECORD, direct_url.json, shebang, *.cmake or *.pc file names a build-only path "
    "(/third_party, /src, /build, /ctx, /layers, /install, /opt/python), and no ELF file's DT_RPATH/DT_RUNPATH "
    "entry is under one, missing from the image or relative ($ORIGIN entries resolve beside the file)",
    "package_files": "every file the source carries under its package directory at the pinned commit (vllm/: "
    "configs, shell wrappers, templates, not only .py) is installed in the image's package with the pinned "
    "commit's content (git blob id), and every data file git records executable is executable (modules are "
    "not: setuptools drops their mode), as a release built from a checkout ships it",
    "recipe_cli": "the matrix's launch command (runtime.recipe) parses with the image's own CLI parser, passes "
    "its validation, every option the matrix names resolves through the CLI's registry, and the "
    "model architecture resolves through the model registry; nothing is started",
}
CHECKS["os_packages"] = (
    "every .deb of locks/<target>/os-packages.txt is in the image at the lock's version and architecture "
    "(/var/lib/dpkg/status.d/<name>) with every file its md5sums list present and unchanged, every package "
    "the matrix lists is there (or in the base), each library under os_packages.loads loads and each "
    "command under os_packages.runs exits 0 (cu129: libibverbs.so.1 and its providers, numactl --show)"
)
CHECKS["gpu_code"] = (
    "(targets with `gpu`) every piece of GPU code under the application prefix (the .nv_fatbin of every ELF "
    "file, standalone .cubin/.fatbin/.ptx files) and every run-time assembler a compiler selects (Triton's "
    "TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH or its bundled ptxas, $CUDA_HOME's nvcc/ptxas): no PTX "
    "of an ISA newer than the matrix's CUDA, no cubin built by a toolkit of another CUDA major, no selected "
    "assembler newer than the matrix's CUDA, unless gpu.exceptions waives the file (shown with its reason); "
    "the driver floor derived from the binaries is at most the claimed gpu.driver_floor and the driver-floor "
    "label (whose value the labels check holds to the matrix)"
)
CHECKS["gpu_coverage"] = (
    "(targets with `gpu`) every extension gpu.required names carries, for every claimed family, SASS that "
    "loads there (sm_XYa on X.Y only; sm_XYf and generic sm_XY on X.Z, Z >= Y) or PTX a gpu.driver_floor "
    "driver JIT-compiles there; other extensions with GPU code are reported, not failed (the gpu-families "
    "label, which lists the claimed families, is the labels check's)"
)
# The whole-image checks (builder/checks/checklist_image.py): each holds over everything under
# APP_PREFIX and the image config; a path gets past one only by a waiver in the matrix
# (runtime.waivers: builder/config/waivers.py), shown in the output.
CHECKS.update(
    {
        "installed_files": "every file every dist-info RECORD under the application prefix lists (RECORD.native "
        "included) exists with that sha256, every file in site-packages is listed by some RECORD (bytecode aside), "
        "every present file of the base's OS packages has its dpkg md5sum (configuration under /etc aside), and each "
        "runtime-lock distribution's RECORD is its locked wheel's (the digest the build recorded: image.json "
        "wheel_records), so a file edited with its RECORD line re-hashed fails too",
        "everything_loads": "every Python extension module under a sys.path directory of the prefix imports in its "
        "own forked child and is the file that import loads; every other shared object loads with RTLD_NOW (every "
        "undefined symbol and version bound); only the driver libraries the container runtime mounts may be missing",
        "loaded_libraries": "after the entrypoint's imports (image Env, compat libcuda) one libcudart is mapped and "
        "libnccl reports the pinned version; every other libcudart/libnvrtc in the image reports the matrix's CUDA; "
        "PYTHONPATH, LD_LIBRARY_PATH and LD_PRELOAD of the config are shown and fail when an entry is missing or "
        "shadows the application's modules or libraries",
        "image_starts": "Entrypoint+Cmd resolve to an executable whose interpreter exists, the entrypoint's --help "
        "exits 0 without a GPU, and every console_scripts/gui_scripts entry of every distribution has its script, "
        "an existing shebang interpreter and a module:attr that resolves",
        "least_privilege": "no setuid/setgid file under the prefix; nothing on sys.path (recursively) or PATH is "
        "writable by, or owned by, the runtime user (checked as that user); each cache directory the image's Env "
        "names (CACHE_ENV) is writable by that user and neither on nor above a sys.path or PATH directory",
        "bytecode_matches": "every .pyc under the prefix with a source is checked hash-based (PEP 552) with the "
        "source's hash, and no sourceless .pyc stands in for a missing module source",
        "page_alignment": "(images whose interpreter is of a machine LARGEST_PAGE names: linux/arm64) every ELF "
        "executable and shared object of that machine under the prefix, the config's PATH and LD_LIBRARY_PATH "
        "directories and the dynamic loader's directories (its defaults, every directory of the ld.so cache) has "
        "each PT_LOAD's p_align a multiple of that page (65536) and p_vaddr - p_offset a multiple of it, as glibc "
        "requires to map the file on a 64K-page kernel (elf/dl-load.c); other images skip it, saying why",
        "cpu_level": "(targets whose `cpu` names the image's platform) every file everything_loads loads under the "
        "prefix loads in one process of the image's interpreter on the oldest CPU the target claims: under the "
        "host's QEMU user-mode binary with that level's -cpu model (builder/config/cpulevel.py), mounted read-only "
        "into the checks' container; a file that fails or kills the process (SIGILL) there and loads as the "
        "container runs it fails, named with the model. A level QEMU cannot emulate, or a host without QEMU: "
        "NOT CHECKED with the reason, never a pass",
    }
)
# The image as its runtime reads it (builder/checks/checklist_runtime.py; issue 51): every answer read
# on the host, from the image config, the exported file system or the saved layers.
CHECKS.update(
    {
        "container_runtime": "the NVIDIA container runtime accepts the image on the target's driver floor "
        "(gpu.driver_floor) and on every newer driver: each NVIDIA_REQUIRE_* (and a legacy image's CUDA_VERSION) "
        "has an alternative whose cuda/driver terms hold there on every GPU (libnvidia-container's DSL: spaces "
        "separate alternatives, commas join terms); NVIDIA_DRIVER_CAPABILITIES grants compute and utility (unset: "
        "the toolkit's default, utility,compute); NVIDIA_VISIBLE_DEVICES, where set, names GPUs; no "
        "LD_LIBRARY_PATH entry is a CUDA compat directory or holds another CUDA major's libcudart",
        "interpreter_options": "no variable of the config's Env changes what the image's Python or loader runs "
        "(PYTHONSTARTUP, PYTHONINSPECT, PYTHONHOME, PYTHONUSERBASE, PYTHONPLATLIBDIR, PYTHONBREAKPOINT, "
        "PYTHONWARNINGS=error, PYTHONOPTIMIZE, PYTHONDEVMODE, PYTHONMALLOC, LD_PRELOAD, LD_AUDIT) and "
        "/etc/ld.so.preload names nothing; every other PYTHON* variable is shown (PYTHONPATH: loaded_libraries)",
        "startup_hooks": "no start-up hook in the image's files: a .pth file in a site directory with a line "
        "starting with 'import' and a space or tab, a sitecustomize or usercustomize module in a site directory, "
        "a standard library directory or on the config's PYTHONPATH; a hook an OS package installed with its "
        "dpkg md5 intact is shown, not failed",
        "runtime_user": "the config's User resolves: a name has an /etc/passwd entry (a group name an /etc/group "
        "one); a numeric uid without one has USER or LOGNAME and HOME in the Env; HOME agrees with the passwd "
        "home where both exist; the home and /tmp are directories the user can write",
        "system_files": "no file carries a file capability (security.capability, in the exported file system or "
        "any layer's PAX records), and /, /etc, /usr, /usr/local, the bin, sbin and lib directories, and what "
        "the bin and sbin directories hold, are owned by root",
        "base_whiteouts": "every path a lower layer has that a later layer's whiteout (.wh.NAME or an opaque "
        ".wh..wh..opq) removes is named; one that a dpkg package's file list (/var/lib/dpkg/info/*.list) names fails",
    }
)
# The largest page a kernel of the image's hosts may run, by the machine of the image's interpreter
# (page_alignment). Grace hosts (GH200, GB200, GB300: aarch64) often run 64K-page kernels (Ubuntu's
# linux-nvidia-64k flavour); x86_64 kernels have 4 KiB pages only, so amd64 images are not walked.
LARGEST_PAGE = {"aarch64": 65536}
# The most a python.standalone download may stream before it is refused (its sha256 is checked
# after): python-build-standalone's install_only tarballs are tens of MB (not measured here: this
# machine reaches no GitHub); 256 MiB leaves room for a debug build and stops an endless stream.
STANDALONE_MAX_BYTES = 256 * 1024 * 1024
# The variables that name a run-time cache directory (least_privilege): CUDA_CACHE_PATH,
# TRITON_CACHE_DIR, XDG_CACHE_HOME, VLLM_CACHE_ROOT; not CUDA_CACHE_MAXSIZE (a size).
CACHE_ENV = r"(?:[A-Z0-9]+_)*CACHE_(?:PATH|DIR|HOME|ROOT)"
# `build vet` on an image this pipeline did not build (issue 37): the checks that read our own
# labels, lock, record or pinned source are rows "n/a", never skipped silently; the advisory ones
# run and are shown but do not decide whether the image is fit for the target's hosts (they are
# this pipeline's hardening and reproducibility rules, not conditions for running on a driver).
VET_NOT_APPLICABLE = {
    "expiry": "reads this pipeline's expiry label",
    "labels": "compares this pipeline's labels with the matrix",
    "lock_contents": "compares the environment with this pipeline's lock",
    "os_packages": "compares with this pipeline's OS lock",
    "package_files": "compares with the source tree at this pipeline's pinned commit",
}
VET_ADVISORY = {
    "non_root": "a hardening rule of this pipeline",
    "least_privilege": "a hardening rule of this pipeline",
    "no_world_writable": "a hardening rule of this pipeline",
    "bytecode_matches": "this pipeline's reproducibility rule (checked hash-based .pyc)",
}
# The base's dpkg database: the md5sums installed_files holds the base's files to.
DPKG_INFO_DIR = "/var/lib/dpkg/info"
# The OS root's own dpkg records, as distroless images keep them (syft and trivy read them); the
# base's /var/lib/dpkg/status is left alone, so no base file is shadowed.
OS_STATUS_DIR = "/var/lib/dpkg/status.d"
CHECK_REPORT_NAME = "checks.xml"  # JUnit, beside build.log
