"""The SLSA v1 provenance of one build: an in-toto v1 Statement whose predicate names the build's
type and builder (its identities), the tool that ran it, every input it read (resolved
dependencies, each by an absolute URI and a digest) and the SBOM made beside it. It describes one
build (its id and times), so it changes with every build; builder/records/provsign.py wraps it in
a DSSE envelope and signs it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from packageurl import PackageURL

from builder import __version__
from builder.config import cascade, contract
from builder.config.matrix import Target
from builder.config.targetplatform import TargetPlatform
from builder.deps.lock import normalize
from builder.deps.oslock import DebEntry
from builder.fsutil import sha256_bytes, sha256_file
from builder.records.artifacts import SBOM_TYPE, WHEEL_NAME, oci_purl, third_party_trees
from builder.records.store import Record, wheel_records_sha256

# --- identities and the tool itself --------------------------------------------------------------
# SLSA asks for a buildType that documents its parameters and a builder.id that names who ran the
# build. Defaults (docs/buildtypes/matrix-dockerfile/v1.md): the buildType page in this repository;
# on GitHub Actions the workflow's identity, elsewhere the documented local form.

BUILD_TYPE_DOC = "docs/buildtypes/matrix-dockerfile/v1.md"
BUILDER_ID_ENV, BUILD_TYPE_ENV = "K3_BUILDER_ID", "K3_BUILD_TYPE"
TOOL_ROOT = Path(__file__).resolve().parents[2]  # this repository, when run from a checkout
TEMPLATES = Path(__file__).resolve().parents[1] / "dockerfile" / "templates"


def build_type(target: Target, environ: Mapping[str, str]) -> str:
    """$K3_BUILD_TYPE, else the matrix's signing.build_type, else this repository's page."""
    given = cascade.environment_or_target(BUILD_TYPE_ENV, target.signing.build_type, environ).value
    return given or f"{target.project_url}/blob/main/{BUILD_TYPE_DOC}"


def local_builder_id(target: Target) -> str:
    """The builder.id of a build that is not a CI workflow run: the page that says what that means."""
    return f"{target.project_url}/blob/main/{BUILD_TYPE_DOC}#local-builder"


def fixed_builder_id(target: Target, environ: Mapping[str, str]) -> str | None:
    """The builder.id the environment or the matrix fixes ($K3_BUILDER_ID > signing.builder_id),
    or None: then the build's own identity stands (builder_id) and verify accepts its forms."""
    return cascade.environment_or_target(BUILDER_ID_ENV, target.signing.builder_id, environ).value


def builder_id(target: Target, environ: Mapping[str, str]) -> str:
    """$K3_BUILDER_ID, else signing.builder_id, else on GitHub Actions the workflow identity
    (``https://github.com/<owner>/<repo>/.github/workflows/<file>@<ref>``, the same string a
    keyless signature's certificate carries), else the local form."""
    fixed = fixed_builder_id(target, environ)
    if fixed:
        return fixed
    if environ.get("GITHUB_ACTIONS") == "true" and environ.get("GITHUB_WORKFLOW_REF"):
        return f"{environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{environ['GITHUB_WORKFLOW_REF']}"
    return local_builder_id(target)


def builder_id_forms(target: Target) -> re.Pattern:
    """What verify accepts as builder.id when neither matrix nor environment fixes one."""
    workflow = re.escape(target.project_url) + r"/\.github/workflows/[A-Za-z0-9._-]+\.ya?ml@\S+"
    return re.compile(f"{workflow}|{re.escape(local_builder_id(target))}")


@functools.cache
def tool_checkout() -> tuple[str | None, bool]:
    """(commit, dirty) of the checkout this tool runs from; (None, False) when it is installed
    without one (or its directory belongs to another repository)."""

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(TOOL_ROOT), *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != TOOL_ROOT:
        return None, False
    commit, status = git("rev-parse", "HEAD"), git("status", "--porcelain")
    return (commit.strip() if commit else None), bool(status and status.strip())


def _repo_uri(target: Target, path: Path) -> tuple[str, dict]:
    """An absolute URI of a file: ``git+<project_url>@<commit>#<path>`` inside this repository's
    checkout (annotated when the tree was dirty), ``file://`` outside it (the smoke's directory)."""
    commit, dirty = tool_checkout()
    path = path.resolve()
    if commit and path.is_relative_to(TOOL_ROOT):
        return f"git+{target.project_url}@{commit}#{path.relative_to(TOOL_ROOT).as_posix()}", (
            {"dirty": True} if dirty else {}
        )
    return path.as_uri(), {}


def _dep(name: str, uri: str, digest: dict, annotations: dict | None = None) -> dict:
    return {"name": name, "uri": uri, "digest": digest, **({"annotations": annotations} if annotations else {})}


def tool_dependencies(target: Target) -> list[dict]:
    """This repository at its commit (and whether the tree was dirty): the builderDependencies."""
    commit, dirty = tool_checkout()
    if commit is None:
        return [
            {
                "name": "tool",
                "uri": f"git+{target.project_url}",
                "annotations": {"version": __version__, "commit": "unknown: not run from a git checkout"},
            }
        ]
    return [
        _dep(
            "tool",
            f"git+{target.project_url}@{commit}",
            {"gitCommit": commit},
            {"version": __version__, "dirty": dirty},
        )
    ]


def _wheel_deps(prefix: str, wheels: Mapping[str, str]) -> list[dict]:
    out = []
    for filename, sha in sorted(wheels.items()):
        m = WHEEL_NAME.fullmatch(filename)
        if m is None:
            continue
        purl = PackageURL(
            type="pypi", name=normalize(m["name"]), version=m["version"], qualifiers={"file_name": filename}
        )
        out.append(_dep(f"{prefix}:{filename}", purl.to_string(), {"sha256": sha}))
    return out


def resolved_dependencies(
    target: Target,
    record: Record,
    root: Path,
    wheels: Mapping[str, str],
    build_wheels: Mapping[str, str],
    os_lock: Sequence[DebEntry] = (),
) -> list[dict]:
    """Everything the build read, each with an absolute URI and a digest (docs/buildtypes)."""
    deps = [
        _dep(
            f"base:{role}",
            oci_purl(info["name"], info["digest"]).to_string(),
            {"sha256": info["digest"].removeprefix("sha256:")},
        )
        for role, info in sorted(record.bases.items())
    ]
    deps.append(
        _dep(
            "source",
            f"git+{record.source['url']}@refs/heads/{record.source['branch']}",
            {"gitCommit": record.source["commit"]},
        )
    )
    for ref, _, url, commit in third_party_trees(record):
        deps.append(_dep(ref, f"git+{url}@{commit}", {"gitCommit": commit}))
    # The files this platform's build read: its own (config/targetplatform.py says where).
    where = TargetPlatform.of(target, record.platform)
    locks, dockerfiles = where.lock_dir(root), where.dockerfile(root).parent
    for name, path, sha in (
        ("lock", locks / contract.LOCK_NAME, record.lock_sha256),
        ("build-lock", locks / contract.BUILD_LOCK_NAME, record.build_lock_sha256),
        ("dockerfile", dockerfiles / contract.DOCKERFILE_NAME, record.dockerfile_sha256),
    ):
        uri, notes = _repo_uri(target, path)
        deps.append(_dep(name, uri, {"sha256": sha}, notes))
    if record.os_lock_sha256:
        uri, notes = _repo_uri(target, locks / contract.OS_LOCK_NAME)
        deps.append(_dep("os-lock", uri, {"sha256": record.os_lock_sha256}, notes))
    if record.wheel_records is not None:  # what installed_files holds each installed RECORD to
        # The record that holds them: the platform's own (locks/<target>/<os>-<arch>/image.json) for
        # one platform of an image index, whose locks/<target>/image.json is the index's (no wheel_records).
        held = where.record_dir(root) / contract.RECORD_NAME
        uri, notes = _repo_uri(target, held)
        digest = {"sha256": wheel_records_sha256(record.wheel_records)}
        deps.append(_dep("wheel-records", uri, digest, {**notes, "field": contract.RECORD_WHEELS}))
    for e in os_lock:  # each .deb unpacked into the OS layer, as fetched on the host
        deps.append(_dep(f"deb:{e.name}", e.url, {"sha256": e.sha256}, {"version": e.version, "arch": e.arch}))
    for template in sorted(TEMPLATES.iterdir()):
        if template.is_file() and template.suffix in (".j2", ".py"):
            uri, notes = _repo_uri(target, template)
            deps.append(_dep(f"template:{template.name}", uri, {"sha256": sha256_file(template)}, notes))
    return deps + _wheel_deps("wheel", wheels) + _wheel_deps("build-wheel", build_wheels)


def provenance(
    target: Target,
    record: Record,
    build_args: dict[str, str],
    started: str,
    *,
    root: Path | None = None,
    wheels: Mapping[str, str] | None = None,
    build_wheels: Mapping[str, str] | None = None,
    sbom_text: str | None = None,
    environ: Mapping[str, str] | None = None,
    os_lock: Sequence[DebEntry] = (),
) -> str:
    """An in-toto v1 Statement with an SLSA provenance v1 predicate for one build (`publish` wraps
    it in a DSSE envelope). ``root``: the matrix's directory (default this repository)."""
    environ = os.environ if environ is None else environ
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": record.image.split("@")[0], "digest": {"sha256": record.digest.removeprefix("sha256:")}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": build_type(target, environ),
                "externalParameters": {"target": target.name, "matrix": target.as_input()},
                "internalParameters": {
                    "buildArgs": dict(sorted(build_args.items())),
                    "sourceDateEpoch": record.source_date_epoch,
                    "inputKey": record.input_key,
                },
                "resolvedDependencies": resolved_dependencies(
                    target, record, root or TOOL_ROOT, wheels or {}, build_wheels or {}, os_lock
                ),
            },
            "runDetails": _run_details(target, record, started, environ, _byproducts(target, root, sbom_text)),
        },
    }
    return json.dumps(statement, indent=2, sort_keys=True) + "\n"


def _byproducts(target: Target, root: Path | None, sbom_text: str | None) -> list[dict]:
    """The SBOM made beside the build, by the URI of its committed file and its digest."""
    if sbom_text is None:
        return []
    return [
        {
            "name": "sbom",
            "uri": _repo_uri(target, contract.sbom_path(root or TOOL_ROOT, target.name))[0],
            "digest": {"sha256": sha256_bytes(sbom_text.encode())},
            "mediaType": SBOM_TYPE,
        }
    ]


def _run_details(
    target: Target, record: Record, started: str, environ: Mapping[str, str], byproducts: list[dict]
) -> dict:
    """Who ran the build (builder.id, the versions of the tool and of Docker), when, and its byproducts."""
    b = record.build
    return {
        "builder": {
            "id": builder_id(target, environ),
            "version": {
                "k3-cu129-builder": record.tool_version,
                "docker-engine": b.get("engine", ""),
                "buildx": b.get("buildx", ""),
                "driver": b.get("driver", ""),
            },
            "builderDependencies": tool_dependencies(target),
        },
        "metadata": {
            "invocationId": b.get("id", ""),
            "startedOn": started,
            "finishedOn": b.get("finished", ""),
        },
        **({"byproducts": byproducts} if byproducts else {}),
    }
