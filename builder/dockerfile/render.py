"""Rendering: a pure function from a Target to Dockerfile text (repo2docker's render, minus
its silent undefineds). No I/O besides reading the packaged template; same input, same bytes."""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path

import jinja2

from builder.config import contract
from builder.config.matrix import Target
from builder.config.targetplatform import TargetPlatform
from builder.dockerfile import compilecache
from builder.errors import DriftError

RUNTIME_UID = 2000  # vLLM's own non-root variant uses uid 2000 ("vllm")
RUNTIME_USER = "vllm"  # what USER/LOGNAME say for that uid (getpass.getuser() reads them first)
THIRD_PARTY_ROOT = "/third_party"  # where the compile step mounts the pinned third-party sources


def third_party(target: Target) -> list[dict]:
    """Each pinned third-party source: its build context, mount point and the path its variable gets."""
    out = []
    for name, tp in sorted(target.source.third_party.items()):
        mount = f"{THIRD_PARTY_ROOT}/{name}"
        out.append(
            {
                "name": name,
                "context": contract.third_party_context(name),
                "mount": mount,
                "env": tp.env,
                "cmake_var": tp.cmake_var,
                "path": f"{mount}/{tp.subdir}" if tp.subdir else mount,
            }
        )
    return out


TEMPLATES = Path(__file__).resolve().parent / "templates"


def context_scripts(target: Target) -> dict[str, str]:
    """Context path -> sha256 of each script this target's build runs (contract.CONTEXT_SCRIPTS)."""
    wanted = [contract.LAYER_TOOL] + ([contract.RELOCATE_TOOL] if target.python.provider == "standalone" else [])
    return {
        path: hashlib.sha256((TEMPLATES / contract.CONTEXT_SCRIPTS[path]).read_bytes()).hexdigest() for path in wanted
    }


_SCRIPT_LINE = re.compile(r"^#   (\S+) sha256:([0-9a-f]{64})$", re.M)


def scripts_named(dockerfile_text: str) -> dict[str, str]:
    """The context scripts a rendered Dockerfile names, with their sha256 (see context_scripts)."""
    return dict(_SCRIPT_LINE.findall(dockerfile_text))


def cmake_args(target: Target, tps: list[dict] | None = None) -> list[str]:
    """What the compile passes CMake (CMAKE_ARGS, which vLLM's setup.py splits on spaces): download
    nothing, and fail on a source it was not given (CMP0170 NEW; vLLM's cmake_minimum_required(3.26)
    leaves it unset, and then a disconnected FetchContent skips a missing source silently); then
    each tree handed to FetchContent itself."""
    args = ["-DFETCHCONTENT_FULLY_DISCONNECTED=ON", "-DCMAKE_POLICY_DEFAULT_CMP0170=NEW"]
    args += [f"-D{tp['cmake_var']}={tp['path']}" for tp in (tps or third_party(target)) if tp["cmake_var"]]
    return args


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("builder.dockerfile", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing key is an error, never an empty string
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def static_labels(target: Target) -> dict[str, str]:
    """Labels known at render time. Two more come from build args (created, lock sha256)."""
    runtime, keys = target.bases.runtime, target.labels
    gpu = (
        {keys.driver_floor: target.gpu.driver_floor, keys.gpu_families: " ".join(target.gpu.capabilities)}
        if target.gpu
        else {}
    )
    return {
        **gpu,
        keys.cuda: target.cuda.version,
        keys.expires: target.expires.isoformat(),
        keys.owner: target.owner,
        keys.target: target.name,
        contract.OCI_BASE_DIGEST: runtime.digest,
        contract.OCI_BASE_NAME: runtime.display_name,
        contract.OCI_DESCRIPTION: target.description,
        contract.OCI_LICENSES: target.licenses,
        contract.OCI_REVISION: target.source.commit,
        contract.OCI_SOURCE: target.source.url,  # with revision: one repository (contract.py says why)
        keys.builder_source: target.project_url,
        keys.sbom: "CycloneDX SBOM attached to this digest (OCI referrers): licenses per component",
        contract.OCI_TITLE: f"{target.source.package} ({target.name})",
        contract.OCI_VENDOR: target.vendor,
        contract.OCI_VERSION: target.source.wheel_version,
    }


def template_vars(target: Target) -> dict:
    """The template's whole input, derived from the target alone, with sorted collections."""
    labels = static_labels(target)
    labels[contract.OCI_CREATED] = "${K3_CREATED}"
    labels[target.labels.lock_sha256] = "${K3_LOCK_SHA256}"
    standalone = target.python.provider == "standalone"
    tps = third_party(target)
    own = target.platform_names()[0] if target.platforms else None  # this view's platform
    return {
        "name": target.name,
        # The platform this Dockerfile builds, for a target that names platforms (one per platform).
        "platform": own,
        # BuildKit cache mount ids: one set per platform (config/targetplatform.py: cache_id).
        "cache_id": TargetPlatform.of(target, own).cache_id,
        "bases": target.bases,
        "arch_list": " ".join(target.cuda.arch_list),
        "nvcc_threads": target.compile.nvcc_threads,
        "apt_packages": sorted(target.compile.apt_packages),
        "secrets": sorted(target.compile.secrets),
        "standalone": standalone,
        "python_version": target.python.version,
        "python": "/opt/k3/python/bin/python3" if standalone else f"/usr/bin/python{target.python.version}",
        "source_package": target.source.package,
        "wheel_version": target.source.wheel_version,
        "version_env": target.source.version_env,
        "compile_env": sorted(target.compile.env.items()),
        "third_party": tps,
        "env_third_party": [tp for tp in tps if tp["env"]],
        "cmake_args": " ".join(cmake_args(target, tps)),
        "tools": sorted(target.compile.tools),
        "context_scripts": sorted(context_scripts(target).items()),
        "cuda_home": target.runtime.cuda_home,
        "runtime_env": sorted(target.runtime.env.items()),
        "user": RUNTIME_USER,
        "layers": contract.layer_names(target.layers),
        "os_packages": bool(target.os_packages),
        "os_scripts_skipped": sorted(
            p.name for p in (target.os_packages.packages if target.os_packages else ()) if p.scripts_skipped
        ),
        "os_status_dir": contract.OS_STATUS_DIR,
        "remote_cache": target.compile.remote,
        "cache_secret": contract.COMPILE_CACHE_SECRET,
        "fallback_marker": contract.FALLBACK_MARKER,
        "cache_vars": compilecache.BACKEND_VARS,
        "compile_mode_arg": contract.COMPILE_MODE_ARG,
        "compile_mode_remote": contract.COMPILE_MODE_REMOTE,
        "deps_epoch": contract.DEPS_EPOCH,
        "build_lock_name": contract.BUILD_LOCK_NAME,
        "uid": RUNTIME_UID,
        "entrypoint": json.dumps(list(target.entrypoint)),
        "labels": sorted(labels.items()),
    }


def render(target: Target) -> str:
    return _environment().get_template("Dockerfile.j2").render(**template_vars(target))


def output_path(matrix_path: Path, target: str) -> Path:
    """Rendered Dockerfiles live beside the matrix that produced them."""
    return contract.dockerfile_path(matrix_path.resolve().parent, target)


def outputs(target: Target, matrix_path: Path) -> list[tuple[Path, str]]:
    """Every Dockerfile a target renders to, with its text: one per platform it names, the first
    at dockerfiles/<target>/Dockerfile, each further one under <os>-<arch>/ (as pipeline.plan's)."""
    root, out = matrix_path.resolve().parent, []
    for p in target.platform_names():
        where = TargetPlatform.of(target, p)
        out.append((where.dockerfile(root), render(target if where.first else target.for_platform(p))))
    return out


def drift(target: Target, path: Path, rendered: str | None = None) -> str | None:
    """Why the committed Dockerfile at ``path`` is not what the matrix renders, or None when it is.
    The one drift rule: `build render --check`, every build and `build verify` use it."""
    if not path.exists():
        return "missing (not rendered)"
    if path.read_text() != (rendered if rendered is not None else render(target)):
        return "differs from what the matrix renders"
    return None


def check_committed(target: Target, path: Path) -> str:
    """The rendered text, when the committed Dockerfile is exactly it; DriftError otherwise."""
    problem = drift(target, path)
    if problem:
        raise DriftError(f"{path}: {problem}; run `build render --target {target.name}`")
    return render(target)
