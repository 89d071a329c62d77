"""matrix.yaml's typed schema: frozen pydantic models of a target and the file (``RawMatrix``, the
shape ``build schema`` publishes), built from the strict value types in ``patterns``.

The defaults written in these models are the built-in layer of the options cascade (``cascade``);
``matrix`` reads the file into them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, PrivateAttr, StrictBool, StrictInt

from builder.config import contract
from builder.config.cpulevel import LevelName
from builder.config.cudamajor import major_minor
from builder.config.gpu import GpuCode
from builder.config.kernels import Kernels
from builder.config.ospackages import OsPackages
from builder.config.patterns import (
    AbsPath,
    AptPackage,
    Arg,
    Branch,
    CacheUrl,
    Commit,
    CudaArch,
    CudaVersion,
    DistName,
    EnvLikeDest,
    EnvName,
    EnvValue,
    ExtensionName,
    FetchContentName,
    Frozen,
    GitUrl,
    Glibc,
    HttpsUrl,
    Identity,
    IsoDate,
    KeyPath,
    KeyRef,
    LabelPrefix,
    LayerName,
    LocalVersion,
    ModuleName,
    ModulePattern,
    NamePattern,
    Owner,
    PathPattern,
    PyRef,
    PySetup,
    PythonVersion,
    Reason,
    Registry,
    RelPath,
    Repository,
    ReqName,
    Requirement,
    SecretId,
    Soname,
    SpdxExpression,
    Tag,
    TargetName,
    Text,
    ThirdPartyName,
    ToolName,
    UpstreamRef,
    Version,
    Words,
    did_you_mean,
)
from builder.config.platforms import DEFAULT_PLATFORM, PLATFORM_ARCH, PinnedImage, Platform, PlatformName
from builder.config.platforms import BaseImage as BaseImage
from builder.config.platforms import Bases as Bases
from builder.config.platforms import Standalone as Standalone
from builder.config.waivers import Waivers
from builder.errors import ConfigError


class Reference(Frozen):
    """Upstream's own image for this target's hosts, pinned by digest: what `build vet` holds to the
    same checks by default and `build compare --vet` sets beside ours (issue 37). It changes
    nothing that is built (``Target.as_input`` leaves it out)."""

    image: PinnedImage
    platform: Literal["linux/amd64", "linux/arm64"] = "linux/amd64"  # the manifest ``image``'s digest names
    note: Text  # where the digest comes from, and whether it was confirmed


class ImageTarget(Frozen):
    registry: Registry
    repository: Repository
    tag: Tag

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def tagged(self) -> str:
        return f"{self.name}:{self.tag}"


class Extensions(Frozen):
    """Compiled modules the image must import, beyond those derived from the source."""

    # Files in the source that declare extensions (Extension/CMakeExtension/RustExtension calls).
    declared_in: tuple[RelPath, ...] = ("setup.py",)
    add: tuple[ModuleName, ...] = ()
    waive: dict[ExtensionName, Reason] = Field(default_factory=dict)  # module -> reason
    ops: tuple[ModuleName, ...] = ()  # torch.ops namespaces/ops (and entry points) that must resolve
    # Ops this build leaves out on purpose (e.g. kernels compiled only for CUDA >= 13), with the
    # reason: the check confirms each is absent, so a stale entry or a silent change is seen.
    absent: dict[ModuleName, Reason] = Field(default_factory=dict)
    # Python packages the build installs from third-party sources and CMake install steps (vLLM:
    # vllm.vllm_flash_attn with its FA4 cute files, vllm.third_party, the K3 model package): every
    # module under them must import in the image (check python_trees). A waived compiled module
    # no longer hides the Python files its component installs.
    python_trees: tuple[ModuleName, ...] = ()
    # Modules of those trees left out of the import, each with why (shown in the check's output).
    python_skip: dict[ModulePattern, Reason] = Field(default_factory=dict)
    # Run once before the trees are imported (each of their modules then in a process of its own,
    # forked from that one): modules to import first (the heavy common ones, e.g. torch) and
    # callables for set-up the package does at run time (vLLM: has_triton_kernels() makes the
    # triton_kernels alias). A skip pattern "pkg.*" covers pkg itself too.
    python_setup: tuple[PySetup, ...] = ()


class ThirdParty(Frozen):
    """A source the build system would otherwise download while compiling (CMake FetchContent).

    Fetched on the host like the main source (mirror, verified commit, export with submodules),
    handed to the compile step as a build context, and pointed at either through ``env`` (the
    source's own ``*_SRC_DIR`` variable) or through ``fetchcontent`` (CMake's
    ``FETCHCONTENT_SOURCE_DIR_<NAME>``, the release path: use it where the source's variable
    switches its build to a developer mode, as VLLM_FLASH_ATTN_SRC_DIR does). Exactly one of them.
    """

    url: GitUrl
    commit: Commit  # what is built; a tag in the source (``ref``) is only what the source names
    ref: UpstreamRef  # the tag or commit the source's build files name (checked at build time)
    declared_in: RelPath  # the build file in the source that names ``ref``
    env: EnvName | None = None  # the variable the source's build reads for a local checkout, e.g. VLLM_CUTLASS_SRC_DIR
    fetchcontent: FetchContentName | None = None  # FetchContent_Declare's name, e.g. vllm-flash-attn
    subdir: RelPath | None = None  # point ``env``/``fetchcontent`` at this directory inside the checkout
    # Submodules exported with it: "all" (FetchContent's default, recursive), "none", or paths.
    submodules: Literal["all", "none"] | tuple[RelPath, ...] = "all"
    license: SpdxExpression | None = None

    @property
    def cmake_var(self) -> str | None:
        """The CMake cache variable that hands FetchContent this tree (FetchContent upper-cases the name)."""
        return f"FETCHCONTENT_SOURCE_DIR_{self.fetchcontent.upper()}" if self.fetchcontent else None

    @property
    def handoff(self) -> str:
        """How the compile is told where the tree is: an environment variable, or a -D for CMake."""
        return self.env or f"-D{self.cmake_var}"


class Export(Frozen):
    """Caps on one exported tree (the source; each third-party tree with its submodules): a tree
    over either is bad upstream input (exit 2), refused before anything is written. The defaults
    are far above vLLM's own tree and a CUTLASS checkout (estimates: neither is measured here,
    GitHub is not reachable from this machine); a hostile commit of a few MB can otherwise expand
    to gigabytes on the build host."""

    max_bytes: Annotated[StrictInt, Field(ge=1, le=1 << 40)] = 1 << 29  # 512 MiB of file and link contents
    max_files: Annotated[StrictInt, Field(ge=1, le=10_000_000)] = 100_000  # files and symlinks


class Source(Frozen):
    url: GitUrl
    branch: Branch
    commit: Commit
    package: DistName  # the distribution the source builds (vllm, or the smoke stand-in)
    version: Version  # its version at the pinned commit, for labels and the wheel
    # Requirement files inside the source at the pinned commit that feed the locks.
    requirements: tuple[RelPath, ...] = ()
    build_requirements: tuple[RelPath, ...] = ()
    # Respellings applied to those files' requirement names, e.g. a CUDA 13 extra -> CUDA 12.
    rewrites: dict[ReqName, ReqName] = Field(default_factory=dict)
    # Requirements of those files the image must not carry, each with why (commented out before
    # resolving; pip check then reports the source package's unmet requirement, not a failure).
    drop: dict[ReqName, Reason] = Field(default_factory=dict)
    extensions: Extensions = Extensions()
    # The wheel's local version label, chosen here rather than left to the build (vLLM appends
    # +cuNNN when the build's CUDA differs from its main CUDA version), and the variable through
    # which the source's build is told the whole version (vLLM: VLLM_VERSION_OVERRIDE).
    local_version: LocalVersion | None = None
    version_env: EnvName | None = None
    third_party: dict[ThirdPartyName, ThirdParty] = Field(default_factory=dict)
    export: Export = Export()

    @property
    def wheel_version(self) -> str:
        """The version the built wheel carries, e.g. 0.30.0+cu129."""
        return f"{self.version}+{self.local_version}" if self.local_version else self.version


class Pin(Frozen):
    version: Version
    index: HttpsUrl | None = None  # an extra index this package is taken from


class Cuda(Frozen):
    version: CudaVersion
    arch_list: tuple[CudaArch, ...] = Field(min_length=1)
    # Distributions of another CUDA major that are expected in the image, each with its reason
    # (e.g. a package that ships both and picks the cu12 path at run time). Shown by the checks.
    other_major: dict[DistName, Reason] = Field(default_factory=dict)
    # Where the base images keep the CUDA forward-compatibility driver library (libcuda.so.1).
    # Every vLLM extension links libcuda.so.1; the GPU-less image checks import them with it.
    compat_dir: AbsPath = "/usr/local/cuda/compat"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def major_minor(self) -> str:
        return major_minor(self.version)

    @property
    def short(self) -> str:  # 12.9.1 -> cu129
        return "cu" + "".join(self.version.split(".")[:2])


class Python(Frozen):
    version: PythonVersion
    # system: the bases' own /usr/bin/python3 (must be this version in both bases);
    # standalone: a pinned relocatable CPython unpacked under /opt/k3/python.
    provider: Literal["system", "standalone"] = "system"
    standalone: Standalone | None = None
    # glibc of the bases, for choosing manylinux wheels on the host (Ubuntu 22.04: 2.35).
    glibc: Glibc = "2.35"
    arch: Literal["x86_64", "aarch64"] = "x86_64"

    def uv_platform(self) -> str:
        """uv's --python-platform for the bases: resolve for their glibc, not this machine's."""
        return f"{self.arch}-manylinux_{self.glibc.replace('.', '_')}"

    def wheel_platforms(self) -> tuple[str, ...]:
        """pip --platform values: pip does not expand manylinux_2_X to older tags itself."""
        minor = int(self.glibc.split(".")[1])
        tags = [f"manylinux_2_{m}_{self.arch}" for m in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags += [f"{name}_{self.arch}" for m, name in legacy.items() if m <= minor]
        return tuple(tags)


class Recipe(Frozen):
    """A launch command and how to ask the image's own CLI about it, without starting anything.

    The check builds the CLI's parser (``parser`` called with a fresh ``parser_class()``), parses
    the command's words after the program and subcommand, runs ``validator`` on the result, and
    looks up each ``resolve`` option's value: a mapping must contain it, a callable must return
    something for it (not raise, not None). ``architecture`` goes through ``architecture_resolver``.
    """

    command: Words  # written as one line in the matrix
    parser: PyRef
    parser_class: PyRef
    validator: PyRef | None = None
    resolve: dict[EnvLikeDest, PyRef] = Field(default_factory=dict)  # argparse dest -> registry
    architecture: ModuleName | None = None
    architecture_resolver: PyRef | None = None
    # Environment of the probe process only (never of the image): what the CLI needs to build its
    # parser on a GPU-less host, each variable with why in the matrix's comments.
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)


class Runtime(Frozen):
    """What the final image offers code that compiles at run time (Triton, FlashInfer, DeepGEMM)."""

    # The CUDA toolkit with nvcc for run-time JIT; the runtime base must carry it (image check
    # runtime_toolchain). None: the target has no run-time CUDA toolkit (the smoke).
    cuda_home: AbsPath | None = None
    # Extra environment of the final image, e.g. Triton's ptxas.
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    # The launch command the field guides give, parsed in the image by its own CLI (check recipe_cli).
    recipe: Recipe | None = None
    # ELF files (fnmatch on the path in the image) that a package loads only as one of several
    # alternatives, each with why: their unresolved NEEDED libraries are shown, not failed
    # (check shared_libraries). A CUDA library of another major still fails.
    optional_libraries: dict[PathPattern, Reason] = Field(default_factory=dict)
    # Libraries a package loads by name at run time (dlopen), which no NEEDED entry shows, each
    # with who loads it: each must load in the image (check shared_libraries).
    dlopen: dict[Soname, Reason] = Field(default_factory=dict)
    waivers: Waivers = Field(default_factory=dict)  # check -> path pattern -> why (builder/config/waivers.py)


class Signing(Frozen):
    """Who signs the image (keyless, cosign): `build verify --registry` checks the signature
    against this identity. Unset: presence is reported, a missing signature is not a failure.
    CI sets it through $K3_SIGNING_IDENTITY (repository variables); see builder/records/signature.py."""

    identity: Identity | None = None
    issuer: HttpsUrl = "https://token.actions.githubusercontent.com"
    # The provenance's DSSE signature (builder/records/provsign.py): ``key`` a PEM private key file
    # (relative to the matrix) or a KMS URI securesystemslib signs with (gcpkms:, awskms:,
    # azurekms:, hv: (Vault), hsm:); ``public_key`` the PEM public key `verify` checks it against,
    # committed beside the matrix. Neither: explicitly unsigned, and `verify` says so.
    key: KeyRef | None = None
    public_key: KeyPath | None = None
    # SLSA identities (builder/records/slsa.py); None: the documented defaults ($K3_BUILDER_ID and
    # $K3_BUILD_TYPE win over both).
    builder_id: HttpsUrl | None = None
    build_type: HttpsUrl | None = None


class Layer(Frozen):
    """A group of the runtime lock installed as its own image layer (most stable first)."""

    name: LayerName
    match: tuple[NamePattern, ...] = Field(min_length=1)  # fnmatch patterns on normalized names


# Default grouping, most to least stable: what changes with CUDA, with torch, with FlashInfer.
# Everything else in the lock is the "deps" layer; the source's own wheel is the "app-native" and "app-python" layers.
DEFAULT_LAYERS = (
    Layer(name="cuda", match=("nvidia-*", "cuda-*")),
    Layer(name="torch", match=("torch", "torchvision", "torchaudio", "triton")),
    Layer(name="flashinfer", match=("flashinfer-*",)),
)
# "app" too: the name the application layer had before it was split into app-native and app-python.
RESERVED_LAYERS = ("base", "deps", "app", *contract.APP_LAYERS)


class Compile(Frozen):
    # None: derived from the builder. Like vLLM's MAX_JOBS: the total parallelism (nvcc jobs x
    # NVCC_THREADS); the source's build divides it by NVCC_THREADS itself.
    max_jobs: Annotated[StrictInt, Field(ge=1, le=512)] | None = None
    nvcc_threads: Annotated[StrictInt, Field(ge=1, le=64)] = 1
    memory_per_job_gib: Annotated[StrictInt, Field(ge=1, le=256)] = 4  # per nvcc thread, for MAX_JOBS
    apt_packages: tuple[AptPackage, ...] = ()  # build stage only; never in the final image
    # Programs the source's build runs (setup.py, CMakeLists.txt, cmake/, tools/), each with where;
    # the build stage asserts each is on PATH before compiling, so a missing one fails in seconds.
    tools: dict[ToolName, Reason] = Field(default_factory=dict)
    # BuildKit secret ids mounted (required) into the compile step at /run/secrets/<id>; their
    # values come from `build --secret id=<id>,env=VAR` and never from the matrix.
    secrets: tuple[SecretId, ...] = ()
    # Environment of the compile step, e.g. CMAKE_BUILD_TYPE=Release, VLLM_TARGET_DEVICE=cuda.
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    # Opt into a remote sccache backend (`build --compile-cache URL`): the compile step then has
    # network access (the rendered Dockerfile says so). Without it the compile runs --network=none
    # with sccache's local cache in a BuildKit cache mount.
    remote_cache: StrictBool = False  # strict: the string "false" is not a boolean (issue 32)
    # The backend when the command line names none (`--compile-cache` and $K3_COMPILE_CACHE win);
    # setting it opts into the remote cache like remote_cache: true.
    cache_url: CacheUrl | None = None

    @property
    def remote(self) -> bool:
        return self.remote_cache or self.cache_url is not None


class Target(Frozen):
    name: TargetName
    description: Text
    owner: Owner
    expires: IsoDate
    expiry_warning_days: Annotated[StrictInt, Field(ge=0, le=3650)] = 30
    expiry_horizon_days: Annotated[StrictInt, Field(ge=1, le=3650)] = 365
    # SPDX expression for the image label; an image of many components (NVIDIA's proprietary ones
    # included) is honestly NOASSERTION, with the licenses per component in the SBOM.
    licenses: Text = "NOASSERTION"
    vendor: Text = "K3 cu129 image pipeline"
    # This repository: the tool and matrix that build the image (label <prefix>.builder.source, the
    # provenance's tool and buildType URLs). The packaged software's repository is source.url
    # (labels org.opencontainers.image.source/revision, a pair: builder/config/contract.py says why).
    project_url: HttpsUrl = "https://github.com/k3-cu129/k3-cu129-images"
    # Reverse-DNS prefix of the project's own labels (expiry, owner, target, ...): a domain the
    # owner controls, e.g. com.example.gpu-platform. Readers of an image find it by its labels.
    label_prefix: LabelPrefix = contract.DEFAULT_LABEL_PREFIX
    image: ImageTarget
    bases: Bases
    source: Source
    python: Python
    cuda: Cuda
    gpu: GpuCode | None = None  # the GPU families the image serves and the driver floor (builder/config/gpu.py)
    kernels: Kernels = Kernels()  # the kernel plan's required selections and fetch waivers (builder/config/kernels.py)
    torch: Pin | None = None
    flashinfer: Pin | None = None
    nccl: Pin | None = None
    indexes: tuple[HttpsUrl, ...] = Field(default=("https://pypi.org/simple",), min_length=1)
    requirements: tuple[Requirement, ...] = ()
    build_requirements: tuple[Requirement, ...] = ()
    # Versions forced over what the resolved packages declare (uv --override), each with its
    # reason; `pip check` in the image reports these conflicts instead of failing on them.
    overrides: dict[Requirement, Reason] = Field(default_factory=dict)
    compile: Compile = Compile()
    runtime: Runtime = Runtime()
    os_packages: OsPackages | None = None
    layers: tuple[Layer, ...] = DEFAULT_LAYERS
    signing: Signing = Signing()
    entrypoint: tuple[Arg, ...] = Field(min_length=1)
    reference: Reference | None = None  # upstream's image for these hosts (build vet, build compare --vet)
    # The platforms one build makes into one image index (builder/config/platforms.py): the first
    # is the target's own bases, python and arch list; none named: one platform, linux/amd64.
    platforms: dict[PlatformName, Platform] = Field(default_factory=dict)
    # The oldest CPU each platform's hosts have (builder/config/cpulevel.py): the image's imports
    # must run on it (check cpu_level). What the image is checked against, not what is built: no input.
    cpu: dict[PlatformName, LevelName] = Field(default_factory=dict)
    # Set by for_platform on a platform after the first: its Dockerfile's cache mount ids add its
    # slug, the first's stay k3-<kind>-<target> as before the target named platforms.
    _later_platform: bool = PrivateAttr(default=False)

    def platform_names(self) -> tuple[str, ...]:
        return tuple(self.platforms) or (DEFAULT_PLATFORM,)

    def for_platform(self, platform: str) -> Target:
        """The target as ``platform`` sees it: its bases, CPython, arch list and OS loads."""
        p = self.platforms.get(platform)
        if p is None:
            return self
        # Narrowed to its own entry: what another platform pins is no input of this one.
        if platform == self.platform_names()[0]:
            return self.model_copy(update={"platforms": {platform: p}})
        python = self.python.model_copy(
            update={"arch": PLATFORM_ARCH[platform], "standalone": p.python or self.python.standalone}
        )
        cuda = self.cuda.model_copy(update={"arch_list": p.arch_list or self.cuda.arch_list})
        osp = self.os_packages
        if osp is not None:
            osp = osp.model_copy(
                update={"loads": osp.loads if p.loads is None else p.loads, "archive": p.archive or osp.archive}
            )
        update = {"bases": p.bases or self.bases, "python": python, "cuda": cuda, "os_packages": osp}
        narrowed = self.model_copy(update={**update, "platforms": {platform: p}})
        narrowed._later_platform = True
        return narrowed

    @property
    def later_platform(self) -> bool:
        """A platform after the first, as for_platform narrows the target to it."""
        return self._later_platform

    @property
    def labels(self) -> contract.LabelKeys:
        return contract.LabelKeys(self.label_prefix)

    def as_input(self) -> dict:
        """The entry as an input of the image (the input key, the provenance's externalParameters):
        everything but ``signing``, ``reference`` (upstream's image) and ``cpu`` (the oldest CPU it is
        checked on), which say who signs the record, what ours is vetted beside and what it is checked
        against, not what is built. Rotating a
        key or setting $K3_SIGNING_IDENTITY rebuilds nothing, and no key path is published."""
        if len(self.platforms) > 1:
            # One platform's input at a time: what another platform pins is no input of this one,
            # so an arm64-only change leaves the amd64 input key and provenance as they were.
            return self.for_platform(self.platform_names()[0]).as_input()
        # A one-platform target's input is what it was before platforms existed.
        return self.model_dump(
            mode="json", exclude={"signing", "reference", "cpu", *(() if self.platforms else ("platforms",))}
        )

    def pinned_requirements(self) -> tuple[str, ...]:
        """Top-level runtime pins for the lock: the matrix's own list plus the named pins."""
        pins = list(self.requirements)
        if self.torch:
            pins.append(f"torch=={self.torch.version}")
        if self.flashinfer:
            pins.append(f"flashinfer-python=={self.flashinfer.version}")
        if self.nccl:
            pins.append(f"nvidia-nccl-cu{self.cuda.major}=={self.nccl.version}")
        return tuple(sorted(pins, key=str.lower))

    def lock_indexes(self) -> tuple[str, ...]:
        """Indexes for the lock, in a fixed order: the matrix's list, then each pin's own."""
        extra = [p.index for p in (self.torch, self.flashinfer, self.nccl) if p and p.index]
        return tuple(dict.fromkeys([*self.indexes, *extra]))


class Matrix(Frozen):
    version: Literal[1]
    targets: dict[TargetName, Target] = Field(min_length=1)
    path: Path  # where it was read from, for messages

    def target(self, name: str) -> Target:
        if name not in self.targets:
            hint = did_you_mean(name, self.targets)
            raise ConfigError(
                f"{self.path}: targets: unknown target {name!r}{hint}; known: {', '.join(sorted(self.targets))}"
            )
        return self.targets[name]


class RawMatrix(Frozen):
    """The file's shape before targets get their names and defaults."""

    model_config = ConfigDict(title="matrix.yaml")

    version: Literal[1]
    defaults: dict = Field(default_factory=dict)
    targets: dict[TargetName, Target] = Field(min_length=1)
