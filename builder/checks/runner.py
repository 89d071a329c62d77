"""`build test`: run the image checks (builder/checks/checklist.py) with pytest.

Expectations are computed here from the matrix, the record and the source at the pinned commit,
then handed to the checklist as a fixture; the checklist holds no constants of its own. A
container of the image (by digest) idles, hardened and with no network, while the checks run
commands in it (boundary.ContainerHost: each with a timeout, its output capped) and read its files
on the host (boundary.read_files); the container is removed afterwards whatever happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import platform as _host
import re
import shutil
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pip
import pytest

from builder import log
from builder.checks import boundary, cpurun
from builder.checks.fixtures import PIP_DIR, Fixtures
from builder.config import contract
from builder.config.cudamajor import major_minor
from builder.config.gpu import GpuCode
from builder.config.matrix import Target
from builder.config.platforms import PLATFORM_ARCH, base_for
from builder.deps.lock import LockEntry, normalize
from builder.deps.oslock import DebEntry
from builder.dockerfile import render
from builder.engine import interrupts
from builder.engine.buildx import Engine
from builder.errors import BuildError, CheckFailed, Interrupted
from builder.source import extensions
from builder.source.pinned import PinnedSource

CHECKLIST = Path(__file__).with_name("checklist.py")
CHECKLIST_GPU = CHECKLIST.with_name("checklist_gpu.py")  # gpu_code, gpu_coverage
CHECKLIST_RUNTIME = CHECKLIST.with_name("checklist_runtime.py")  # the runtime's view of the image (issue 51)
CHECKLISTS = (CHECKLIST, CHECKLIST.with_name("checklist_image.py"), CHECKLIST_GPU, CHECKLIST_RUNTIME)  # contract.CHECKS
CHECK_OUTPUT_NAME = "checks.txt"  # pytest's own output, beside the JUnit report


@dataclass(frozen=True)
class OsExpectations:
    """What the os_packages check expects: the OS lock's (name, version, arch), the matrix's list,
    the libraries to load and the commands to run."""

    locked: tuple[tuple[str, str, str], ...]
    listed: tuple[str, ...]
    loads: tuple[str, ...]
    runs: tuple[tuple[str, ...], ...]


def os_expectations(target: Target, entries) -> OsExpectations | None:
    osp = target.os_packages
    if osp is None:
        return None
    return OsExpectations(
        tuple((e.name, e.version, e.arch) for e in entries), tuple(p.name for p in osp.packages), osp.loads, osp.runs
    )


@dataclass(frozen=True)
class Expectations:
    target: str
    cuda_version: str  # e.g. 12.9.1
    modules: extensions.ModulePlan
    ops: tuple[str, ...]
    pins: dict[str, str]  # normalized distribution -> version (flashinfer, nccl)
    labels: dict[str, str]  # label -> exact expected value
    expires: dt.date
    build_date: dt.date
    today: dt.date
    warning_days: int
    horizon_days: int
    lock: dict[str, str]  # normalized name -> version
    overrides: frozenset[str]  # normalized names forced by the matrix over resolver pins
    source_package: tuple[str, str]  # (normalized name, wheel version incl. local label): built from source
    other_major: dict[str, str] = field(default_factory=dict)  # normalized name -> why it may be there
    absent: dict[str, str] = field(default_factory=dict)  # op -> why this build leaves it out
    compat_dir: str = "/usr/local/cuda/compat"
    cuda_home: str | None = None
    nvcc_arch: str = "sm_90"  # the first arch of the matrix, for the trivial-kernel compile
    label_keys: contract.LabelKeys = field(default_factory=contract.LabelKeys)  # the matrix's label_prefix
    python_trees: tuple[str, ...] = ()
    python_skip: dict[str, str] = field(default_factory=dict)  # module pattern -> why
    python_setup: tuple[str, ...] = ()
    recipe: dict | None = None  # runtime.recipe as the recipe probe takes it (argv after program, subcommand)
    optional_libraries: dict[str, str] = field(default_factory=dict)  # ELF path pattern -> why
    dlopen: dict[str, str] = field(default_factory=dict)  # library loaded by name at run time -> by whom
    os_packages: OsExpectations | None = None  # None: the target has no os_packages
    package: str = ""  # the source's top-level package directory (vllm)
    package_files: dict[str, bool] = field(default_factory=dict)  # its files at the pin -> executable
    package_blobs: dict[str, str] = field(default_factory=dict)  # the same files -> git blob id (their content)
    # Each locked wheel's RECORD digest (deps.buildcontext.wheel_records); None: not recorded for this image.
    wheel_records: dict[str, dict] | None = None
    dropped: dict[str, str] = field(default_factory=dict)  # normalized requirement the matrix drops -> why
    gpu: GpuCode | None = None  # the matrix's gpu block (None: the GPU-code checks skip)
    waivers: dict[str, dict[str, str]] = field(default_factory=dict)  # check -> path pattern -> why
    app_prefix: str = contract.APP_PREFIX  # what the whole-image checks scan (build vet: a foreign image's own)
    # The platform of the image checked (one manifest of an image index; None: the engine's own), and
    # whether it runs emulated here (QEMU): a check that cannot run so says NOT CHECKED, never passes.
    platform: str | None = None
    emulated: bool = False
    cpu: dict[str, str] = field(default_factory=dict)  # platform -> the oldest CPU level its hosts have
    qemu: str | None = None  # the host's QEMU user-mode binary, mounted read-only in the container (cpurun)
    runtime_bases: dict[str, str] = field(default_factory=dict)  # platform -> pinned runtime base (name@digest)

    def native_command(self, image: str) -> str:
        """Where and how to run natively what could not run emulated: `build test --platform P
        --image REF` on a P machine (REF: this platform's own image, a manifest digest)."""
        return f"on a {self.platform} machine run `build test --platform {self.platform} --image {image}`"

    @property
    def cuda_major(self) -> int:
        return int(self.cuda_version.split(".")[0])

    @property
    def cuda_major_minor(self) -> str:
        found = major_minor(self.cuda_version)
        assert found is not None, "cuda_version is the target's validated CUDA version, never empty"
        return found

    @property
    def cudart_version(self) -> int:  # what cudaRuntimeGetVersion returns: 12.9 -> 12090
        major, minor = (int(x) for x in self.cuda_version.split(".")[:2])
        return major * 1000 + minor * 10


class BuiltFrom(Protocol):
    """What the checks read of the locks an image was built from (pipeline.plan.LockSet is one):
    the bytes the build hashed, never the files again."""

    @property
    def runtime_entries(self) -> tuple[LockEntry, ...]: ...
    @property
    def runtime_sha256(self) -> str: ...
    @property
    def os_entries(self) -> tuple[DebEntry, ...]: ...


def host_platform() -> str:
    """This machine's platform as a matrix names one (x86_64 -> linux/amd64, aarch64 -> linux/arm64)."""
    machine = _host.machine()
    return next((p for p, arch in PLATFORM_ARCH.items() if arch == machine), f"linux/{machine}")


def expectations(
    target: Target,
    pinned: PinnedSource,
    locks: BuiltFrom,
    build_date: dt.date,
    today: dt.date | None = None,
    wheel_records: dict[str, dict] | None = None,
) -> Expectations:
    """What the image must hold, from the matrix, the source and ``locks`` (a plan.LockSet: the
    lock bytes the build read, hashed and built from, never the files again), and ``wheel_records``
    (each installed wheel's RECORD digest: made from the wheelhouse by the build, else the record's)."""
    policy = target.source.extensions
    modules = extensions.plan({path: pinned.read(path) for path in policy.declared_in}, policy)
    entries = locks.runtime_entries
    labels = render.static_labels(target)
    labels[contract.OCI_CREATED] = contract.created_iso(pinned.source_date_epoch)
    labels[target.labels.lock_sha256] = locks.runtime_sha256
    fields = target_fields(target)
    return Expectations(
        **fields,
        modules=modules,
        labels=labels,
        build_date=build_date,
        today=today or dt.date.today(),
        lock={normalize(e.name): e.version for e in entries},
        overrides=frozenset(normalize(e.name) for e in entries if e.override),
        os_packages=os_expectations(target, locks.os_entries),
        package_files=pinned.files_under(fields["package"]),
        package_blobs=pinned.blob_ids_under(fields["package"]),
        wheel_records=wheel_records,
    )


def target_fields(target: Target) -> dict:
    """The expectations the matrix target alone gives: shared by a build's checks and `build vet`
    (an image this pipeline did not build), so the two never hold an image to different rules."""
    policy = target.source.extensions
    pins = {}
    if target.flashinfer:
        pins["flashinfer-python"] = target.flashinfer.version
    if target.nccl:
        pins[f"nvidia-nccl-cu{target.cuda.version.split('.')[0]}"] = target.nccl.version
    return {
        "target": target.name,
        "cuda_version": target.cuda.version,
        "ops": tuple(policy.ops),
        "pins": pins,
        "expires": target.expires,
        "warning_days": target.expiry_warning_days,
        "horizon_days": target.expiry_horizon_days,
        "source_package": (normalize(target.source.package), target.source.wheel_version),
        "other_major": {normalize(n): r for n, r in target.cuda.other_major.items()},
        "absent": dict(policy.absent),
        "compat_dir": target.cuda.compat_dir,
        "cuda_home": target.runtime.cuda_home,
        "nvcc_arch": "sm_" + target.cuda.arch_list[0].split("+")[0].replace(".", ""),
        "label_keys": target.labels,
        "python_trees": policy.python_trees,
        "python_skip": dict(policy.python_skip),
        "python_setup": policy.python_setup,
        "recipe": _recipe(target),
        "optional_libraries": dict(target.runtime.optional_libraries),
        "dlopen": dict(target.runtime.dlopen),
        "package": normalize(target.source.package).replace("-", "_"),  # vllm -> vllm/, the import name
        "dropped": {normalize(n): r for n, r in target.source.drop.items()},
        "gpu": target.gpu,
        "waivers": {check: dict(paths) for check, paths in target.runtime.waivers.items()},
        "cpu": dict(target.cpu),
        "runtime_bases": {
            p: "{0.name}@{0.digest}".format(base_for(target, p).runtime) for p in target.platform_names()
        },
    }


def _recipe(target: Target) -> dict | None:
    r = target.runtime.recipe
    if r is None:
        return None
    return {
        "command": " ".join(r.command),
        "argv": list(r.command[2:]),
        "parser": r.parser,
        "parser_class": r.parser_class,
        "validator": r.validator,
        "resolve": dict(r.resolve),
        "architecture": r.architecture,
        "architecture_resolver": r.architecture_resolver,
        "env": dict(r.env),
    }


@dataclass
class CheckResult:
    """One check's outcome. ``passed``: it ran and held. A skipped check (the target gives it
    nothing to check, e.g. no pins) did not pass and did not fail: it is reported as skipped."""

    name: str
    passed: bool
    message: str = ""
    skipped: bool = False

    def __post_init__(self) -> None:
        if self.passed and self.skipped:
            raise ValueError(f"check {self.name}: a skipped check is not a passed one")

    @property
    def status(self) -> str:
        return "pass" if self.passed else "skip" if self.skipped else "FAIL"


@dataclass
class Report:
    image: str
    results: list[CheckResult]
    warnings: list[str] = field(default_factory=list)
    junit: Path | None = None
    facts: dict = field(default_factory=dict)  # what checks proved for the record (record_fact): gpu, gpu_coverage

    @property
    def ok(self) -> bool:
        """No check failed and at least one ran and passed; skips are neither."""
        return not self.failed() and any(r.passed for r in self.results)

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "FAIL"]

    def counts(self) -> dict[str, int]:
        """How many checks passed, were skipped and failed (every check is exactly one of these)."""
        return {status: sum(r.status == status for r in self.results) for status in ("pass", "skip", "FAIL")}

    def to_json(self) -> dict:
        return {
            "image": self.image,
            "checks": [{"name": r.name, "status": r.status, "message": r.message} for r in self.results],
            "counts": self.counts(),
            "warnings": self.warnings,
            "junit": str(self.junit) if self.junit else None,
        }

    def raise_for_failures(self) -> None:
        if not self.ok:
            names = ", ".join(r.name for r in self.failed())
            raise CheckFailed(f"{self.image}: image checks failed: {names}; the image is kept; report: {self.junit}")


def _pytest(plugin: Fixtures, tmp: Path, junit: Path, extra: tuple = ()) -> int:
    """Run the checklist against the container; pytest's own output goes to a file beside the
    JUnit report (the terminal gets the check table)."""
    junit.parent.mkdir(parents=True, exist_ok=True)
    ini = tmp / "pytest.ini"
    ini.write_text("[pytest]\n")
    output = io.StringIO()
    # No plugin is auto-loaded: the checks run the same whatever pytest plugins the tool's
    # environment holds (pytest-randomly would reorder them; hypothesis's plugin alone imported 73
    # modules through the assertion rewriter, seconds per run). testinfra's own plugin stays off:
    # its parametrized "host" fixture would run checks on this machine; the checklist gets its
    # host for the container from image_host.
    with contextlib.redirect_stdout(output):
        code = pytest.main(
            [
                *map(str, CHECKLISTS),
                "-c",
                str(ini),
                "--rootdir",
                str(tmp),
                "--disable-plugin-autoload",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:testinfra",
                "-q",
                "--tb=line",
                "--no-header",
                "-W",
                "ignore::DeprecationWarning",
                f"--junitxml={junit}",
                "-o",
                "junit_family=xunit2",
                "-o",
                "junit_suite_name=k3-image-checks",
            ],
            plugins=[plugin, *extra],
        )
    junit.with_name(CHECK_OUTPUT_NAME).write_text(log.redact(output.getvalue()))
    return code


def run(engine: Engine, ref: str, expect: Expectations, junit: Path, plugins: tuple = ()) -> Report:
    """Start a container of ``ref``, run the checklist against it, remove the container.

    The container is started inside the cleanup scope; one a killed run left behind (they carry
    the tool's label and their starter's pid) is removed first. ``plugins``: more pytest plugins
    (build vet's marks the checks that do not apply to a foreign image)."""
    config = engine.image_config(ref)
    engine.containers.remove_stale()
    container = None
    mounts = cpurun.mounts(expect.cpu, expect.platform or host_platform())  # QEMU for cpu_level, read-only
    expect = dataclasses.replace(expect, qemu=mounts[0][1] if mounts else None)
    try:
        with interrupts.deferred():  # a signal now is raised once `container` names what to remove
            container = engine.containers.start(ref, platform=expect.platform, mounts=mounts)
        with tempfile.TemporaryDirectory(prefix="k3-check-") as tmp:
            # pip is not in the image (nothing outside the lock is); pip check runs from a copy.
            shutil.copytree(
                Path(pip.__file__).parent, Path(tmp) / "pip-path" / "pip", ignore=shutil.ignore_patterns("__pycache__")
            )
            engine.containers.copy_into(container, Path(tmp) / "pip-path", PIP_DIR)
            host, cid, seam = boundary.ContainerHost(engine.containers, container), container, engine.containers
            major = expect.cuda_major if expect.gpu is not None else None  # GPU code read only when claimed
            files = lambda: boundary.read_files(seam, cid, expect.app_prefix, major)  # noqa: E731
            plat = expect.platform or host_platform()
            base = lambda: boundary.base_layers(engine, expect.runtime_bases.get(plat, ""), plat)  # noqa: E731
            plugin = Fixtures(expect, config, host, files, lambda: boundary.read_layers(engine, config.id), base)
            code = _pytest(plugin, Path(tmp), junit, plugins)
    finally:
        if container:
            engine.containers.remove(container)
    if code == pytest.ExitCode.INTERRUPTED:  # pytest swallows the KeyboardInterrupt (SIGINT, SIGTERM)
        raise Interrupted("interrupted during the image checks; the image is kept, nothing recorded")
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        raise BuildError(
            f"the image checks could not run (pytest exit {int(code)}); see {junit.with_name(CHECK_OUTPUT_NAME)}"
        )
    return Report(image=ref, results=_parse_junit(junit), warnings=plugin.warnings, junit=junit, facts=plugin.facts)


def _parse_junit(path: Path) -> list[CheckResult]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise BuildError(f"{path}: unreadable check report: {exc}") from None
    results = []
    for case in root.iter("testcase"):
        name = case.get("name", "?").removeprefix("test_")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        message = ""
        if problem is not None:
            message = (problem.get("message") or problem.text or "").strip()
            message = message.splitlines()[0] if message else "failed"
            # pytest 9.2 cuts the attribute at 500 characters; the text holds the line whole
            lines = (re.sub(r"^E\s+", "", line).strip() for line in (problem.text or "").splitlines())
            message = next((line for line in lines if line.startswith(message.removesuffix("...")[:200])), message)
            message = re.sub(r"^(AssertionError|Failed): ", "", message)
        skip = case.find("skipped") if problem is None else None  # an error after a skip is a failure
        skipped = skip is not None
        if skip is not None:
            message = (skip.get("message") or "").strip()
        results.append(CheckResult(name, problem is None and not skipped, message, skipped))
    if {r.name for r in results} != set(contract.CHECKS):
        missing = sorted(set(contract.CHECKS) - {r.name for r in results})
        raise BuildError(f"{path}: checks missing from the report: {', '.join(missing) or '(extra checks)'}")
    return results


def check_target(
    engine: Engine,
    ref: str,
    *,
    target: Target,
    locks: BuiltFrom,
    pinned: PinnedSource,
    build_date: dt.date,
    out_dir: Path,
    wheel_records: dict[str, dict] | None = None,
    platform: str | None = None,
) -> Report:
    """Run every check on ``ref`` for ``target`` (built from ``locks`` and ``pinned`` on
    ``build_date``), the report under ``out_dir``, and log a table; the caller decides what a
    failure means. ``platform``: the image's, when one manifest of an index (emulated if foreign)."""
    expect = expectations(target, pinned, locks, build_date, wheel_records=wheel_records)
    if platform is not None:
        expect = dataclasses.replace(expect, platform=platform, emulated=platform != host_platform())
        if expect.emulated:
            log.info(f"    {platform} on a {host_platform()} host: the checks run emulated (QEMU)")
    report = run(engine, ref, expect, out_dir / contract.CHECK_REPORT_NAME)
    for r in report.results:
        log.info(f"    {r.status}  {r.name:<20} {r.message}")
    counts = report.counts()
    log.info(f"    checks: {counts['pass']} pass, {counts['skip']} skip, {counts['FAIL']} FAIL")
    for w in report.warnings:
        log.warn(w)
    log.info(f"    JUnit report: {report.junit}")
    return report
