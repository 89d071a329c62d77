"""Rendering: a pure function from a Target to Dockerfile text (repo2docker's render, minus
its silent undefineds). No I/O besides reading the packaged template; same input, same bytes."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import jinja2

from builder import contract
from builder.matrix import Target

RUNTIME_UID = 2000  # vLLM's own non-root variant uses uid 2000 ("vllm")


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("builder", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing key is an error, never an empty string
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def static_labels(target: Target) -> dict[str, str]:
    """Labels known at render time. Two more come from build args (created, lock sha256)."""
    runtime = target.bases.runtime
    return {
        contract.LABEL_CUDA: target.cuda.version,
        contract.LABEL_EXPIRES: target.expires.isoformat(),
        contract.LABEL_OWNER: target.owner,
        contract.LABEL_TARGET: target.name,
        contract.OCI_BASE_DIGEST: runtime.digest,
        contract.OCI_BASE_NAME: runtime.display_name,
        contract.OCI_DESCRIPTION: target.description,
        contract.OCI_LICENSES: target.licenses,
        contract.OCI_REVISION: target.source.commit,
        contract.OCI_SOURCE: target.source.url,
        contract.OCI_TITLE: f"{target.source.package} ({target.name})",
        contract.OCI_VENDOR: target.vendor,
        contract.OCI_VERSION: target.source.version,
    }


def context(target: Target) -> dict:
    """The template's whole input, derived from the target alone, with sorted collections."""
    labels = static_labels(target)
    labels[contract.OCI_CREATED] = "${K3_CREATED}"
    labels[contract.LABEL_LOCK_SHA256] = "${K3_LOCK_SHA256}"
    standalone = target.python.provider == "standalone"
    return {
        "name": target.name,
        "bases": target.bases,
        "arch_list": " ".join(target.cuda.arch_list),
        "nvcc_threads": target.compile.nvcc_threads,
        "apt_packages": sorted(target.compile.apt_packages),
        "secrets": sorted(target.compile.secrets),
        "standalone": standalone,
        "python_version": target.python.version,
        "python": "/opt/k3/python/bin/python3" if standalone else f"/usr/bin/python{target.python.version}",
        "source_package": target.source.package,
        "source_version": target.source.version,
        "lock_name": contract.LOCK_NAME,
        "build_lock_name": contract.BUILD_LOCK_NAME,
        "uid": RUNTIME_UID,
        "entrypoint": json.dumps(list(target.entrypoint)),
        "labels": sorted(labels.items()),
    }


def render(target: Target) -> str:
    return _environment().get_template("Dockerfile.j2").render(**context(target))


def output_path(matrix_path: Path, target: str) -> Path:
    """Rendered Dockerfiles live beside the matrix that produced them."""
    return contract.dockerfile_path(matrix_path.resolve().parent, target)
