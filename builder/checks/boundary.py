"""The trust boundary of the image checks (`build test`, `build vet`; issue 49).

An image under check is untrusted: a foreign one (vet) is anyone's, and ours may be broken. Each
check's answer therefore comes from one of three places (``Basis``), and the scorecard says which:

- ``HOST``: the tool's own code reads it, on the host, from the image's config or its files as the
  engine exports them (builder/checks/imagefiles.py; GPU code: gpuread.py); no program of the image
  runs. A probe may still run beside it (gpucode's listing, the assemblers), held to that reading.
- ``CROSS``: the image's interpreter runs a probe isolated (``python -I -S``, the site directories
  named explicitly: no ``.pth``, no sitecustomize, no PYTHON* variable), and what it reports is held
  against the host's reading: a module whose bytes are not a loadable ELF never "loads".
- ``IMAGE``: only the image's own programs can answer (its interpreter importing its modules, its
  compiler, its CLI); run isolated where it is Python, but a replaced interpreter or standard
  library can still lie. Such a row is evidence, not proof.

Every command runs in the hardened container (builder/engine/containers.py: no capability, no
network, bounded pids, memory and CPU) through ``ContainerHost``: with a timeout and its output
capped, so a check that never returns or prints without end fails instead of hanging vet.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shlex
import time

import pytest

from builder.checks import elfdyn, gpuread, imagefiles, layers
from builder.config import contract
from builder.config.imageref import names_registry_host
from builder.engine.containers import ContainerSeam, Ran
from builder.errors import BuilderError

TIMEOUT_ENV = "K3_CHECK_TIMEOUT"
DEFAULT_TIMEOUT = 1800.0  # seconds per command: cu129's whole-image probes take minutes, not half an hour


class Basis(enum.Enum):
    HOST = "host"
    CROSS = "cross-checked"
    IMAGE = "image"


# Which rows the image could influence (docs/checks.md#who-answers-each-row): HOST rows it cannot,
# beyond its bytes; CROSS rows it cannot make pass where the host's reading says otherwise.
BASIS = {
    "expiry": Basis.HOST,
    "labels": Basis.HOST,
    "non_root": Basis.HOST,
    "no_world_writable": Basis.HOST,
    "cuda_runtime": Basis.CROSS,
    "compiled_modules": Basis.CROSS,
    "shared_libraries": Basis.CROSS,
    "everything_loads": Basis.CROSS,
    "gpu_code": Basis.HOST,  # the files' GPU code read and decoded on the host (gpuread.py)
    "gpu_coverage": Basis.HOST,
    "least_privilege": Basis.CROSS,
    "installed_files": Basis.CROSS,
    # The runtime's view (issue 51): the config and the files, read by the tool's own code.
    "container_runtime": Basis.HOST,
    "interpreter_options": Basis.HOST,
    "startup_hooks": Basis.HOST,
    "runtime_user": Basis.HOST,
    "system_files": Basis.HOST,
    "base_whiteouts": Basis.HOST,
}


def basis(check: str) -> Basis:
    return BASIS.get(check, Basis.IMAGE)


def timeout() -> float:
    """Seconds a command of the checks may run: K3_CHECK_TIMEOUT, else DEFAULT_TIMEOUT."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        value = DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


class ContainerHost:
    """What the checks ask of a host (testinfra's ``run(command, *args)``, each argument quoted
    into ``command``), in the checks' container: every command bounded by ``limit`` seconds (a
    command that outlives it fails its check, naming it) and its output capped."""

    def __init__(self, containers: ContainerSeam, container_id: str, limit: float | None = None) -> None:
        self._containers, self._container, self.limit = containers, container_id, limit or timeout()

    def run(self, command: str, *args: object) -> Ran:
        text = command % tuple(shlex.quote(str(a)) for a in args) if args else command
        ran = self._containers.exec(self._container, ["/bin/sh", "-c", text], self.limit)
        if ran.timed_out:
            shown = command.split(" -c ")[0][:120]
            pytest.fail(f"expected `{shown} ...` to finish within {self.limit:g} s, found it still running: killed")
        return ran


def read_files(
    containers: ContainerSeam, container_id: str, prefix: str, gpu_major: int | None = None
) -> imagefiles.ImageFiles:
    """The static view of the checks' container (its root file system as exported), read on the host;
    with ``gpu_major`` (a target that claims GPU code, of that CUDA major) its GPU code read too,
    decoding bounded by the checks' timeout (past it, entries are unread and ``gpu_code`` fails)."""
    judge = None
    if gpu_major is not None:
        judge = gpuread.Judge(gpuread.Codecs(deadline=time.monotonic() + timeout()), gpu_major)
    with containers.export(container_id) as stream:
        return imagefiles.read(stream, (prefix,), judge)


def read_layers(engine, image_id: str) -> layers.Layers:
    """The image's layers (``docker save`` of ``image_id``), read on the host: whiteouts, file capabilities.
    When every layer the engine lists for the image has a kept reading (layers.kept), those readings,
    and the image is not streamed again: a save costs the engine seconds of CPU per GB."""
    found = layers.kept(_diff_ids(engine, image_id))
    if found is not None:
        return found
    with engine.export_image(image_id) as stream:
        return layers.read(stream)


def _diff_ids(engine, image_id: str) -> list[str]:
    """The local image's ``rootfs.diff_ids`` as the engine lists them ([] when it cannot say: the
    image is then streamed, and the stream says what is wrong)."""
    try:
        found = json.loads(engine.image_inspect(image_id))
        return _listed_diff_ids(found[0]) or []
    except (BuilderError, ValueError, LookupError, TypeError, RecursionError):
        return []


def _listed_diff_ids(config) -> list[str] | None:
    """A config's diff_ids, as an OCI config (``rootfs.diff_ids``) or the engine's inspect
    (``RootFS.Layers``) lists them; None unless they are a list of strings."""
    rootfs = (config.get("rootfs") or config.get("RootFS")) if isinstance(config, dict) else None
    diff_ids = (rootfs.get("diff_ids") or rootfs.get("Layers")) if isinstance(rootfs, dict) else None
    return diff_ids if isinstance(diff_ids, list) and all(isinstance(d, str) for d in diff_ids) else None


def base_layers(engine, ref: str, platform: str) -> layers.PinnedBase:
    """The pinned runtime base ``ref`` (name@digest)'s layers for ``platform`` (os/arch), bottom first:
    its config's rootfs.diff_ids, from its registry when ``ref`` names one (an index followed to the
    platform's image), else from the local engine's copy, never pulled (a multi-GB base is no part of
    a check). When neither answers, the record says why (``unread``), never an empty "no layers"."""
    arch = platform.partition("/")[2]
    if not ref:
        return layers.PinnedBase(ref, unread=f"the target pins no runtime base for {platform}")
    try:
        if names_registry_host(ref):
            config = engine.registry.image_config(ref, arch)
            where = "its registry"
        else:
            found = json.loads(engine.image_inspect(ref))
            config = found[0] if isinstance(found, list) and found else None
            where = "the local engine"
    except (BuilderError, ValueError) as exc:
        why = exc.message if isinstance(exc, BuilderError) else str(exc)
        return layers.PinnedBase(ref, unread=f"{ref} not read: {why[:300]}")
    if not isinstance(config, dict):
        return layers.PinnedBase(ref, unread=f"{where} has no {ref} for {platform}")
    diff_ids = _listed_diff_ids(config)
    have = config.get("architecture") or config.get("Architecture")
    if not diff_ids:
        return layers.PinnedBase(ref, unread=f"{where} lists no layers of {ref} for {platform}")
    if have != arch:
        return layers.PinnedBase(ref, unread=f"{where}'s {ref} is for linux/{have}, not {platform}")
    return layers.PinnedBase(ref, tuple(diff_ids))


def static_unloadable(files: imagefiles.ImageFiles, expect) -> list[tuple[str, str]]:
    """(path, why) of the shared objects under the prefix that cannot load: the host's reading,
    which the loads, ELF and GPU probes' answers are held to."""
    return files.not_loadable(expect.app_prefix, expect.platform)


def missing_modules(files: imagefiles.ImageFiles, expect, modules: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, why) for each compiled module with no loadable shared object under the prefix."""
    found = []
    for module in modules:
        tail = "/" + module.replace(".", "/") + "."
        files_of = [e for e in files.under(expect.app_prefix) if e.kind == "file" and tail in e.path]
        shared = [e for e in files_of if imagefiles.SHARED_OBJECT.search(e.path)]
        if not shared:
            found.append((module, f"no shared object for it under {expect.app_prefix} (read on the host)"))
        elif all(imagefiles.elf_problem(e.head, imagefiles.MACHINES.get(expect.platform or "")) for e in shared):
            found.append((module, f"{shared[0].path} is not a loadable ELF shared object (read on the host)"))
    return found


def mapped_elsewhere(files: imagefiles.ImageFiles, mapped: list[str]) -> list[tuple[str, str]]:
    """(path, why) of every file an import mapped (the loads probe's /proc/self/maps) that is not a
    file of the image as the host reads it: code written at run time (to /tmp, a cache, a memfd)
    that no layer carries, so no check of the image's files has read it."""
    found = []
    for path in mapped:
        if path.endswith(" (deleted)") or path.startswith("/memfd:"):
            found.append((path, "mapped at import from a deleted file or from memory: in no layer of the image"))
        elif path.split("/")[1:2] in (["dev"], ["proc"], ["sys"]):
            continue
        else:
            entry = files.resolve(path)
            if entry is None or entry.kind != "file":
                why = "mapped at import but not a file of the image (read on the host): made at run time"
                found.append((path, why))
    return found


def static_needed(
    files: imagefiles.ImageFiles, expect, ld_library_path: str, reported: set[tuple[str, str]]
) -> list[tuple[str, str]]:
    """(path, why) of each NEEDED entry under the prefix, read on the host, that ld.so finds nowhere
    in the image or that names a CUDA library of another major, and that the ELF probe did not
    report (``reported``: its (path, soname) pairs): the probe's answer held to the host's reading."""
    names = "|".join(map(re.escape, contract.CUDA_TRACKING_LIBS))
    tracking = re.compile(rf"lib({names})\.so\.(\d+)(?:\.\d+)*$")
    found = []
    for path, soname in elfdyn.unresolved(files, expect.app_prefix, ld_library_path):
        if (path, soname) not in reported and soname not in contract.DRIVER_LIBRARIES:
            found.append((path, f"needs {soname}, found nowhere in the image (read on the host; the probe said not)"))
    top = expect.app_prefix.rstrip("/") + "/"
    for path, dyn in sorted(files.dynamic.items()):
        if not path.startswith(top) or not isinstance(dyn, elfdyn.Dynamic):
            continue
        for soname in dyn.needed:
            m = tracking.match(soname)
            if m and int(m.group(2)) != expect.cuda_major and (path, soname) not in reported:
                why = f"needs {soname}, a CUDA {m.group(2)} library (read on the host; the probe said not)"
                found.append((path, why))
    return found


def host_unread(files: imagefiles.ImageFiles, expect) -> list[tuple[str, str]]:
    """(path, why) of each shared object under the prefix whose NEEDED list the host could not read:
    the probe's answer for it stands unchecked, and the check says so."""
    top = expect.app_prefix.rstrip("/") + "/"
    return [(p, why) for p, why in sorted(files.dynamic.items()) if p.startswith(top) and isinstance(why, str)]


def unread_line(unread: list[tuple[str, str]]) -> str:
    shown = "; ".join(f"{p}: {why}" for p, why in unread[:5]) + (" ..." if len(unread) > 5 else "")
    return f"shared_libraries: {len(unread)} NEEDED lists not read on the host (the probe's answer stands): {shown}"
