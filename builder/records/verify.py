"""`build verify`: the auditor's command. Each row is one link in the chain
matrix <-> Dockerfile <-> lock <-> image.json <-> SBOM <-> provenance (<-> registry), checked from
the repository alone (and, with --registry, the registry alone). Offline by default. The rows,
in order, and when each holds are builder/records/chain.py's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from builder.config import contract
from builder.config.gpu import cell_runs
from builder.config.matrix import Target
from builder.config.targetplatform import TargetPlatform
from builder.deps import lock, oslock
from builder.deps.lock import normalize
from builder.dockerfile import render
from builder.errors import BuilderError, VerifyFailed
from builder.fsutil import sha256_file
from builder.records import artifacts, attest, provsign, signature, slsa
from builder.records import store as records
from builder.records.chain import ROWS, all_rows

T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    check: str
    ok: bool
    detail: str


class _Fail(Exception):
    pass


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise _Fail(message)


def _found(value: T | None, message: str) -> T:
    """``value``; the row fails with ``message`` when it is None."""
    if value is None:
        raise _Fail(message)
    return value


def _read_json(path: Path) -> dict:
    _need(path.is_file(), f"{path.name} is missing")
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Fail(f"{path.name} is not JSON: {str(exc)[:80]}") from None
    _need(isinstance(doc, dict), f"{path.name} is not a JSON object")
    return doc


class Verifier:
    def __init__(self, root: Path, target: Target, platform: str | None = None) -> None:
        """``platform``: one platform of a target built into an image index (its own Dockerfile,
        locks and record set, locks/<target>/<os>-<arch>/; builder/records/verifyindex.py)."""
        self.root = root
        self.t = target.for_platform(platform) if platform else target
        self.platform = platform
        where = TargetPlatform.of(target, platform)  # its files, record set and tag: config/targetplatform.py
        locks = where.lock_paths(root)
        self.dockerfile = where.dockerfile(root)
        self.lock = locks.runtime
        self.build_lock = locks.build
        self.os_lock = where.lock_dir(root) / contract.OS_LOCK_NAME
        self.record_dir = where.record_dir(root)
        self.sbom_path = self.record_dir / contract.SBOM_NAME
        self.prov_path = self.record_dir / contract.PROVENANCE_NAME
        self.tag = where.image_tag
        self._record: records.Record | None = None

    @property
    def record(self) -> records.Record:
        if self._record is None:
            try:
                rec = records.read(self.record_dir / contract.RECORD_NAME)
            except BuilderError as exc:
                raise _Fail(exc.message) from None
            self._record = _found(rec, "image.json is missing (never built?)")
        return self._record

    # -- rows -----------------------------------------------------------------------------------
    def matrix_dockerfile(self) -> str:
        problem = render.drift(self.t, self.dockerfile)
        _need(problem is None, f"the committed Dockerfile: {problem}")
        return f"sha256 {sha256_file(self.dockerfile)[:16]}"

    def record_set(self) -> str:
        problems = records.set_problems(self.root, self.t.name, self.record, self.record_dir)
        _need(not problems, "; ".join(problems))
        return "image.json names this SBOM and this provenance (sha256)"

    def checked(self) -> str:
        _need(
            self.record.checks == "passed",
            f"the image was never checked (built with --no-checks: checks {self.record.checks!r}); run `build test`",
        )
        return "the recorded image passed its checks before it was recorded"

    def lock_pinned(self) -> str:
        counts = []
        for path in (self.lock, self.build_lock):
            try:
                entries = lock.read_entries(path)
                lock.check_torch_build(self.t, entries, path)
            except BuilderError as exc:
                raise _Fail(exc.message) from None
            counts.append(len(entries))
        return f"{counts[0]} runtime + {counts[1]} build entries, all hash-pinned"

    def os_lock_pinned(self) -> str:
        try:
            entries = oslock.read(self.os_lock)
            oslock.check_current(self.os_lock, self.t)
        except BuilderError as exc:
            raise _Fail(exc.message) from None
        return f"{len(entries)} .deb(s) by sha256, made from these os_packages and this runtime base"

    def os_lock_record(self) -> str:
        got = sha256_file(self.os_lock) if self.os_lock.exists() else "missing"
        _need(
            got == self.record.os_lock_sha256,
            f"{self.os_lock.name} sha256 {got[:16]} != image.json {str(self.record.os_lock_sha256)[:16]}",
        )
        return f"{self.os_lock.name} sha256 matches"

    def os_lock_sbom(self) -> str:
        doc = _read_json(self.sbom_path)
        debs = {}
        for c in doc.get("components", []):
            if c.get("purl", "").startswith("pkg:deb/"):
                arch = re.search(r"[?&]arch=([^&]+)", c["purl"])
                debs[c.get("name")] = (
                    c.get("version"),
                    arch and arch.group(1),
                    sorted(h["content"] for h in c.get("hashes", [])),
                )
        try:
            entries = oslock.read(self.os_lock)
        except BuilderError as exc:
            raise _Fail(exc.message) from None
        for e in entries:
            got = _found(debs.get(e.name), f"{e.name} is in {self.os_lock.name} but not in the SBOM as pkg:deb")
            _need(got[:2] == (e.version, e.arch), f"{e.name}: SBOM {got[0]} {got[1]} != OS lock {e.version} {e.arch}")
            _need(got[2] == [e.sha256], f"{e.name}: the SBOM's sha256 (the unpacked .deb's) is not the OS lock's")
        return f"all {len(entries)} .deb(s) in the SBOM as pkg:deb, same version, arch and sha256"

    def dockerfile_record(self) -> str:
        got = sha256_file(self.dockerfile) if self.dockerfile.exists() else "missing"
        _need(
            got == self.record.dockerfile_sha256,
            f"Dockerfile sha256 {got[:16]} != image.json {self.record.dockerfile_sha256[:16]}",
        )
        return "Dockerfile sha256 matches"

    def lock_record(self) -> str:
        for path, want in ((self.lock, self.record.lock_sha256), (self.build_lock, self.record.build_lock_sha256)):
            got = sha256_file(path) if path.exists() else "missing"
            _need(got == want, f"{path.name} sha256 {got[:16]} != image.json {want[:16]}")
        wheels = self.record.wheel_records
        if wheels is None:
            return "both lock sha256 match (a record without wheel RECORD digests)"
        try:
            locked = {normalize(e.name): e.version for e in lock.read_entries(self.lock)}
        except BuilderError as exc:
            raise _Fail(exc.message) from None
        got_versions = {name: str(w.get("version")) if isinstance(w, dict) else None for name, w in wheels.items()}
        _need(
            got_versions == locked,
            f"{contract.RECORD_WHEELS} names {sorted(set(got_versions) ^ set(locked)) or 'other versions'}, "
            f"not the {self.lock.name} entries",
        )
        return f"both lock sha256 match; a RECORD digest for each of the {len(locked)} locked wheels"

    def matrix_record(self) -> str:
        r = self.record
        _need(r.target == self.t.name, f"target {r.target!r} != {self.t.name!r}")
        _need(r.platform == self.platform, f"platform {r.platform!r} != {self.platform!r}")
        _need(r.image == f"{self.t.image.name}@{r.digest}", f"image {r.image} is not {self.t.image.name}@{r.digest}")
        _need(re.fullmatch(r"sha256:[0-9a-f]{64}", r.digest or "") is not None, f"digest {r.digest!r} is malformed")
        for role in ("build", "runtime"):
            want = getattr(self.t.bases, role).digest
            got = r.bases.get(role, {}).get("digest")
            _need(got == want, f"base {role} {got} != matrix {want}")
        _need(
            r.source.get("commit") == self.t.source.commit,
            f"source commit {r.source.get('commit')} != matrix {self.t.source.commit}",
        )
        _need(r.source.get("url") == self.t.source.url, "source url differs from the matrix")
        recorded = r.source.get("third_party") or {}
        _need(isinstance(recorded, dict), "source.third_party in image.json is not a mapping")
        _need(
            set(recorded) == set(self.t.source.third_party),
            f"third-party sources {sorted(recorded)} != matrix {sorted(self.t.source.third_party)}",
        )
        for name, spec in self.t.source.third_party.items():
            tp = recorded[name] if isinstance(recorded[name], dict) else {}
            _need(
                (tp.get("url"), tp.get("commit")) == (spec.url, spec.commit),
                f"third party {name} {tp.get('url')} @ {tp.get('commit')} != matrix {spec.url} @ {spec.commit}",
            )
        return (
            f"{r.digest[:19]}, bases and commit match the matrix"
            + (f", {len(recorded)} third-party source(s)" if recorded else "")
            + self._gpu_record()
        )

    def _gpu_record(self) -> str:
        """The record's ``gpu`` against the matrix's ``gpu`` (the labels are rendered from it)."""
        want, got = self.t.gpu, self.record.gpu
        if want is None:
            _need(got is None, "image.json has a gpu block, the matrix claims no GPU code")
            return ""
        if got is None:
            _need(self.record.checks != "passed", "image.json lacks the gpu block the GPU-code checks record")
            return "; GPU code not checked (--no-checks)"
        _need(
            got.get("driver_floor") == want.driver_floor,
            f"gpu.driver_floor {got.get('driver_floor')} != matrix {want.driver_floor}",
        )
        _need(
            got.get("families") == list(want.capabilities),
            f"gpu.families {got.get('families')} != matrix {list(want.capabilities)}",
        )
        derived = got.get("derived_floor")
        _need(
            derived is None or _driver(derived) <= _driver(want.driver_floor),
            f"gpu.derived_floor {derived} exceeds the claimed {want.driver_floor}",
        )
        coverage = got.get("coverage") or {}
        gaps = [
            f"{ext} on {cc}"
            for ext in want.required
            for cc in want.required_on(ext)
            if not cell_runs((coverage.get(ext) or {}).get(cc))
        ]
        _need(not gaps, f"gpu.coverage has no code for {', '.join(gaps)}")
        return f"; GPU floor {derived or 'none'} <= {want.driver_floor}, {len(want.capabilities)} families covered"

    def record_sbom(self) -> str:
        r = self.record
        text = _found(
            self.sbom_path.read_text() if self.sbom_path.exists() else None, f"{self.sbom_path.name} is missing"
        )
        try:
            attest.validate_sbom(text)
        except ValueError as exc:
            raise _Fail(str(exc)[:200]) from None
        doc = json.loads(text)
        _need(isinstance(doc, dict), "the SBOM is not a JSON object")
        comp = doc.get("metadata", {}).get("component", {})
        _need(
            comp.get("version") == r.digest and f"@{r.digest}" in comp.get("purl", ""),
            f"SBOM describes {comp.get('version')}, image.json {r.digest}",
        )
        by_ref = {c.get("bom-ref"): c for c in doc.get("components", [])}
        for role in ("build", "runtime"):
            got = (by_ref.get(f"base:{role}") or {}).get("version")
            _need(got == r.bases[role]["digest"], f"SBOM base {role} {got} != image.json")
        _need((by_ref.get("source") or {}).get("version") == r.source["commit"], "SBOM source commit != image.json")
        for ref, _, url, commit in artifacts.third_party_trees(r):
            _need((by_ref.get(ref) or {}).get("version") == commit, f"SBOM {ref} is not {url} @ {commit}")
        return f"CycloneDX 1.6 valid, {len(by_ref)} components, describes {r.digest[:19]}"

    def lock_sbom(self) -> str:
        _need(self.sbom_path.exists(), f"{self.sbom_path.name} is missing")
        doc = _read_json(self.sbom_path)
        pypi = {}
        for c in doc.get("components", []):
            if c.get("purl", "").startswith("pkg:pypi/"):
                pypi[normalize(c["name"])] = (c.get("version"), sorted(h["content"] for h in c.get("hashes", [])))
        try:
            entries = lock.read_entries(self.lock)
        except BuilderError as exc:
            raise _Fail(exc.message) from None
        for e in entries:
            got = _found(pypi.get(normalize(e.name)), f"{e.name} is in the lock but not in the SBOM")
            _need(got[0] == e.version, f"{e.name}: SBOM {got[0]} != lock {e.version}")
            _need(
                len(got[1]) == 1 and got[1][0] in e.hashes,
                f"{e.name}: the SBOM's hash (the installed wheel's) is not one of the lock's",
            )
        return f"all {len(entries)} lock entries in the SBOM, same version, installed wheel's hash in the lock"

    def _envelope(self):
        """(envelope, Statement) of the committed provenance file."""
        _need(self.prov_path.is_file(), f"{self.prov_path.name} is missing")
        try:
            return provsign.read(self.prov_path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Fail(f"{self.prov_path.name}: {str(exc)[:160]}") from None

    def _identities(self, predicate: dict) -> None:
        definition = predicate.get("buildDefinition", {})
        want_type = slsa.build_type(self.t, os.environ)
        _need(definition.get("buildType") == want_type, f"buildType {definition.get('buildType')!r} is not {want_type}")
        got = predicate.get("runDetails", {}).get("builder", {}).get("id")
        fixed = slsa.fixed_builder_id(self.t, os.environ)
        _need(
            got == fixed if fixed else slsa.builder_id_forms(self.t).fullmatch(str(got)) is not None,
            f"builder.id {got!r} is not {fixed or 'a workflow of ' + self.t.project_url + ' or the local form'}",
        )
        tool = {
            d.get("name"): d for d in predicate.get("runDetails", {}).get("builder", {}).get("builderDependencies", [])
        }.get("tool", {})
        _need(
            str(tool.get("uri", "")).startswith(f"git+{self.t.project_url}"),
            f"builderDependencies names no tool at {self.t.project_url}",
        )

    def record_provenance(self) -> str:
        r = self.record
        _, doc = self._envelope()
        _need(doc.get("_type") == "https://in-toto.io/Statement/v1", "not an in-toto v1 statement")
        _need(doc.get("predicateType") == "https://slsa.dev/provenance/v1", "not an SLSA provenance v1 predicate")
        predicate = doc.get("predicate", {})
        definition = predicate.get("buildDefinition", {})
        _need(
            definition.get("externalParameters") == {"target": self.t.name, "matrix": self.t.as_input()},
            "externalParameters differ from the matrix's entry for this target",
        )
        self._identities(predicate)
        subjects = [s.get("digest", {}).get("sha256") for s in doc.get("subject", [])]
        _need(subjects == [r.digest.removeprefix("sha256:")], f"subject {subjects} != image.json {r.digest}")
        deps = {d.get("name"): d.get("digest", {}) for d in definition.get("resolvedDependencies", [])}
        want = {
            "base:build": {"sha256": r.bases["build"]["digest"].removeprefix("sha256:")},
            "base:runtime": {"sha256": r.bases["runtime"]["digest"].removeprefix("sha256:")},
            "source": {"gitCommit": r.source["commit"]},
            "lock": {"sha256": r.lock_sha256},
            "build-lock": {"sha256": r.build_lock_sha256},
            "dockerfile": {"sha256": r.dockerfile_sha256},
        }
        if self.t.os_packages:  # its .debs (deb:<name>) are the lock's: "OS lock <-> SBOM" checks those
            want["os-lock"] = {"sha256": r.os_lock_sha256}
        if r.wheel_records is not None or "wheel-records" in deps:  # a dropped field must not pass either
            want["wheel-records"] = {"sha256": records.wheel_records_sha256(r.wheel_records or {})}
        for ref, _, _, commit in artifacts.third_party_trees(r):
            want[ref] = {"gitCommit": commit}
        for name, digest in want.items():
            _need(deps.get(name) == digest, f"resolvedDependencies {name} {deps.get(name)} != image.json {digest}")
        return "subject, identities and resolved dependencies match image.json and the matrix"

    def _signature_answer(self, question) -> str:
        env, _ = self._envelope()
        pub = self.t.signing.public_key
        answer = question(env, provsign.public_key(self.root, pub) if pub else None)
        _need(answer.ok, answer.detail)
        return answer.detail

    def provenance_signed(self) -> str:
        return self._signature_answer(provsign.signed)

    def provenance_signer(self) -> str:
        return self._signature_answer(provsign.signer_is)

    def provenance_signature(self) -> str:
        return self._signature_answer(provsign.signature_holds)

    def registry_image(self, engine) -> str:
        r = self.record
        _need(engine.registry.serves(self.t.image.name, r.digest), f"the registry does not serve {r.image}")
        now = engine.registry.resolve_digest(f"{self.t.image.name}:{self.tag}")
        _need(now == r.digest, f"tag {self.tag} now points at {now}, image.json says {r.digest}")
        return f"serves {r.digest[:19]}; tag {self.tag} points at it"

    def registry_attachments(self, engine) -> str:
        r = self.record
        found = engine.registry.referrers(self.t.image.name, r.digest)
        for kind, path in ((artifacts.SBOM_TYPE, self.sbom_path), (artifacts.PROVENANCE_TYPE, self.prov_path)):
            _need(kind in found, f"no {kind} attached to {r.digest[:19]}")
            local = path.read_bytes() if path.exists() else b""
            _need(found[kind] == local, f"the attached {path.name} differs from the committed one")
        return "SBOM and provenance attached, identical to the committed files"

    def registry_signature(self, engine) -> str:
        r, name = self.record, self.t.image.name
        # $K3_SIGNING_* already reached the matrix (its environment overrides, validated there).
        identity, issuer = signature.resolve_identity(self.t.signing.identity, self.t.signing.issuer, environ={})
        tag_exists, referrers = signature.registry_probes(
            lambda ref: engine.registry.raw_manifest(name, ref), lambda d: engine.registry.blob(name, d), r.digest
        )
        st = signature.signature_status(name, r.digest, identity, issuer, tag_exists=tag_exists, referrers=referrers)
        _need(st.ok(required=identity is not None), f"{st.state}: {st.detail}")
        return f"{st.state}: {st.detail}"

    def rows(self, engine=None) -> list[Row]:
        offline = {
            "matrix <-> Dockerfile": self.matrix_dockerfile,
            "lock hash-pinned": self.lock_pinned,
            "image.json <-> audit files": self.record_set,
            "image checks": self.checked,
            "Dockerfile <-> image.json": self.dockerfile_record,
            "lock <-> image.json": self.lock_record,
            "matrix <-> image.json": self.matrix_record,
            "image.json <-> SBOM": self.record_sbom,
            "lock <-> SBOM": self.lock_sbom,
            "image.json <-> provenance": self.record_provenance,
            "provenance signed": self.provenance_signed,
            "provenance signer": self.provenance_signer,
            "provenance signature": self.provenance_signature,
            "OS lock hash-pinned": self.os_lock_pinned,
            "OS lock <-> image.json": self.os_lock_record,
            "OS lock <-> SBOM": self.os_lock_sbom,
        }
        online = {
            "registry: image": self.registry_image,
            "registry: SBOM + provenance": self.registry_attachments,
            "registry: signature": self.registry_signature,
        }
        rows = all_rows(bool(self.t.os_packages))
        head = [(name, offline[name]) for name, _, _ in ROWS[:2]]
        head += [(name, offline[name]) for name, _, _ in rows if name == "OS lock hash-pinned"]
        try:
            _ = self.record  # reading it raises _Fail when the record is missing or corrupt
        except _Fail as exc:  # one row says so, not one per link that needs the record
            return self._run(head) + [Row("image.json", False, str(exc))]
        checks = [(name, offline[name]) for name, _, registry in rows if not registry]
        if engine is not None:
            checks += [(name, (lambda fn: lambda: fn(engine))(online[name])) for name, _, registry in ROWS if registry]
        return self._run(checks)

    @staticmethod
    def _run(checks: list[tuple[str, Callable[[], str]]]) -> list[Row]:
        out = []
        for name, fn in checks:
            try:
                out.append(Row(name, True, fn()))
            except _Fail as exc:
                out.append(Row(name, False, str(exc)))
            except BuilderError as exc:  # the registry out of reach, or a damaged file
                out.append(Row(name, False, exc.message))
            except (KeyError, TypeError, AttributeError) as exc:
                # A record that reads as one can still lack a nested field the rows index (bases
                # without "runtime", a third-party entry that is not a mapping): that row fails and
                # says which field, instead of a traceback ending the auditor's whole run.
                out.append(
                    Row(name, False, f"image.json lacks a field this row reads ({exc.__class__.__name__}: {exc})")
                )
        return out


def _driver(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(text).split(".") if p.isdigit())


def verify_targets(matrix, names: list[str], engine=None, *, explicit: bool) -> list[tuple[str, Row]]:
    """Rows for each target. Without named targets, targets never built are skipped; with nothing
    recorded at all, that is a failure ("nothing recorded"), not a silent pass."""
    from builder.records import verifyindex

    root = matrix.path.resolve().parent
    rows: list[tuple[str, Row]] = []
    for name in names:
        if not contract.record_path(root, name).exists() and not explicit:
            continue
        target = matrix.target(name)
        if target.platforms:  # an image index: its rows, then every platform's record set
            rows += [(name, Row(*row)) for row in verifyindex.rows(root, target, engine)]
            for p in target.platform_names():
                rows += [(name, Row(f"{p}: {r.check}", r.ok, r.detail)) for r in Verifier(root, target, p).rows(engine)]
            continue
        rows += [(name, row) for row in Verifier(root, target).rows(engine)]
    if not rows:
        raise VerifyFailed(
            f"verify: nothing recorded for {', '.join(names)} (no {contract.RECORD_NAME}); "
            "build first, or restore the records from git"
        )
    return rows
