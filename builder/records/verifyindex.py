"""`build verify` of a target built into an image index (builder/records/index.py): the index's
own rows, before every platform's record set is verified like a one-image target's
(builder/records/verify.py, each row named "<platform>: <row>"). The rows and when each holds are
``INDEX_ROWS``; docs/auditor.md ("An image index") holds the table ``table_markdown`` makes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from builder.config import contract
from builder.config.matrix import Target
from builder.config.targetplatform import index_manifests
from builder.errors import BuilderError
from builder.fsutil import sha256_file
from builder.records import artifacts, index, provsign

INDEX_ROWS: tuple[tuple[str, str, bool], ...] = (
    (
        "index record",
        "`locks/<target>/image.json` is a record of kind `image-index` for this target, under its image "
        "name and tag, naming exactly the matrix's platforms in its order",
        False,
    ),
    (
        "index <-> platform records",
        "each platform's `image.json` (`locks/<target>/<os>-<arch>/`) is there with the sha256 the index "
        "record names, and records that platform's manifest digest as the index names it",
        False,
    ),
    (
        "index <-> provenance",
        "the index provenance is the file the record names (sha256); its subjects are the index digest, "
        "then every platform's manifest digest, and its resolved dependencies each platform's provenance "
        "by sha256",
        False,
    ),
    (
        "index provenance signature",
        "signed as the per-image provenance is (the same three questions: signed, by the matrix's "
        "`signing.public_key`, verifying over the payload); unsigned holds with a warning when the "
        "matrix names no key",
        False,
    ),
    (
        "registry: index",
        "the registry serves the index digest, the tag points at it, and it names exactly the recorded "
        "manifest of each platform",
        True,
    ),
    ("registry: index provenance", "the provenance attached to the index digest equals the committed file", True),
)


class _Fail(Exception):
    pass


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise _Fail(message)


def table_markdown() -> str:
    """The index table of docs/auditor.md, made from INDEX_ROWS."""
    lines = ["| row | holds when |", "| --- | --- |"]
    lines += [f"| `{name}`{' (`--registry`)' if registry else ''} | {when} |" for name, when, registry in INDEX_ROWS]
    return "\n".join(lines) + "\n"


class IndexVerifier:
    def __init__(self, root: Path, target: Target) -> None:
        self.root, self.t = root, target
        self.dir = contract.record_path(root, target.name).parent
        self.prov = self.dir / index.PROVENANCE_NAME
        try:
            self.record = index.read(self.dir / contract.RECORD_NAME)
        except BuilderError as exc:
            self.record, self.problem = None, exc.message
        else:
            self.problem = "" if self.record else "image.json is missing (never built?)"

    def index_record(self) -> str:
        r = self.record
        assert r is not None
        _need(r.target == self.t.name, f"target {r.target!r} != {self.t.name!r}")
        _need(r.image == f"{self.t.image.name}@{r.digest}", f"image {r.image} is not {self.t.image.name}@{r.digest}")
        _need(r.tag == self.t.image.tag, f"tag {r.tag} != the matrix's {self.t.image.tag}")
        platforms = list(self.t.platform_names())
        _need(list(r.platforms) == platforms, f"platforms {list(r.platforms)} != the matrix's {platforms}")
        return f"{r.digest[:19]}: {', '.join(platforms)}"

    def platform_records(self) -> str:
        r = self.record
        assert r is not None
        problems = [p for p in index.set_problems(self.root, r) if not p.startswith(index.PROVENANCE_NAME)]
        _need(not problems, "; ".join(problems))
        return "; ".join(f"{p} {e['digest'][:19]}" for p, e in r.platforms.items())

    def _statement(self) -> dict:
        _need(self.prov.is_file(), f"{self.prov.name} is missing")
        try:
            return provsign.read(self.prov.read_text())[1]
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Fail(f"{self.prov.name}: {str(exc)[:160]}") from None

    def provenance(self) -> str:
        r = self.record
        assert r is not None
        _need(sha256_file(self.prov) == r.build.get("provenance_sha256"), f"{self.prov.name} is not the one named")
        doc = self._statement()
        got = ["sha256:" + str(s.get("digest", {}).get("sha256")) for s in doc.get("subject", [])]
        want = [r.digest, *r.manifests().values()]
        _need(got == want, f"subjects {got} != the index and its manifests {want}")
        deps = {
            d.get("name"): d.get("digest")
            for d in doc.get("predicate", {}).get("buildDefinition", {}).get("resolvedDependencies", [])
        }
        for p in r.platforms:
            path = contract.platform_record_dir(self.root, self.t.name, p) / contract.PROVENANCE_NAME
            mine = {"sha256": sha256_file(path)} if path.is_file() else None
            _need(deps.get(f"provenance:{p}") == mine, f"provenance:{p} {deps.get(f'provenance:{p}')} != {mine}")
        return f"subjects: the index and {len(r.platforms)} manifests; each platform's provenance by sha256"

    def signature(self) -> str:
        _need(self.prov.is_file(), f"{self.prov.name} is missing")
        try:
            env, _ = provsign.read(self.prov.read_text())
        except ValueError as exc:
            raise _Fail(str(exc)[:160]) from None
        pub = self.t.signing.public_key
        key = provsign.public_key(self.root, pub) if pub else None
        answers = [q(env, key) for q in (provsign.signed, provsign.signer_is, provsign.signature_holds)]
        failed = [a.detail for a in answers if not a.ok]
        _need(not failed, "; ".join(failed))
        return answers[-1].detail

    def registry_index(self, engine) -> str:
        r = self.record
        assert r is not None
        name = self.t.image.name
        served = engine.registry.raw_manifest(name, r.digest)
        _need(served is not None and served.digest == r.digest, f"the registry does not serve {r.image}")
        now = engine.registry.resolve_digest(self.t.image.tagged)
        _need(now == r.digest, f"tag {self.t.image.tag} points at {now}, image.json says {r.digest}")
        entries = index_manifests(json.loads(served.raw))
        _need(entries == r.manifests(), f"the served index names {entries}, image.json {r.manifests()}")
        return f"serves {r.digest[:19]} under {self.t.image.tag}, naming {len(entries)} manifests as recorded"

    def registry_provenance(self, engine) -> str:
        r = self.record
        assert r is not None
        found = engine.registry.referrers(self.t.image.name, r.digest).get(artifacts.PROVENANCE_TYPE)
        _need(found is not None, f"no provenance attached to {r.digest[:19]}")
        _need(found == self.prov.read_bytes(), f"the attached provenance differs from the committed {self.prov.name}")
        return "attached, identical to the committed file"

    def checks(self, engine) -> list[tuple[str, Callable[[], str]]]:
        fns: dict[str, Callable[[], str]] = {
            "index record": self.index_record,
            "index <-> platform records": self.platform_records,
            "index <-> provenance": self.provenance,
            "index provenance signature": self.signature,
            "registry: index": lambda: self.registry_index(engine),
            "registry: index provenance": lambda: self.registry_provenance(engine),
        }
        return [(name, fns[name]) for name, _, registry in INDEX_ROWS if engine is not None or not registry]


def rows(root: Path, target: Target, engine=None) -> list[tuple[str, bool, str]]:
    """(row, holds, detail) for each of INDEX_ROWS (the --registry ones with ``engine``)."""
    v = IndexVerifier(root, target)
    if v.record is None:
        return [("index record", False, v.problem)]
    out = []
    for name, fn in v.checks(engine):
        try:
            out.append((name, True, fn()))
        except _Fail as exc:
            out.append((name, False, str(exc)))
        except BuilderError as exc:  # the registry out of reach, a key that cannot be read
            out.append((name, False, exc.message))
        except (KeyError, TypeError, AttributeError, OSError) as exc:
            out.append((name, False, f"{exc.__class__.__name__}: {exc}"))
    return out
