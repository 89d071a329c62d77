"""`build verify`'s rows (builder/records/verify.py) pinned exactly: for a tamper, the set of rows
that fail (nothing else), each one's whole detail, and the boundary on both sides of each rule
(one more subject, one hash too many, the floor equal to the claim and just above it). The
clean record set and its editing helpers are test_verify_rows.py's (a whole build of the smoke
target on the fake engine, with two OS packages and a TEST-ONLY signing key).
"""

from __future__ import annotations

import json

import pytest

from builder.config import contract
from builder.deps import lock, oslock
from builder.dockerfile import render
from builder.errors import BuilderError
from builder.fsutil import sha256_bytes, sha256_file
from builder.records import provsign, store, verify
from tests.unit import test_verify_rows as shared
from tests.unit.test_verify_rows import PYPI, Checkout, _deb, _pypi

# The clean record set, built once per module, and a fresh copy of it per test (test_verify_rows.py).
built = shared.built
clean_target = shared.clean_target
co = shared.co


def _rows(co: Checkout, **kwargs) -> dict[str, verify.Row]:
    return {r.check: r for r in co.rows(**kwargs)}


def _digest(co: Checkout) -> str:
    return co.record()["digest"]


def _hex(co: Checkout) -> str:
    return _digest(co).removeprefix("sha256:")


def _exactly(co: Checkout, failing: dict[str, str], **kwargs) -> None:
    """Exactly these rows fail, each with exactly this detail; every other row holds."""
    rows = _rows(co, **kwargs)
    assert {n: r.detail for n, r in rows.items() if not r.ok} == failing


# --- image checks: a record made with --no-checks -------------------------------------------------


def _no_checks(r: dict) -> None:
    """What a build with --no-checks records: checks skipped, and no gpu block (no check proved it)."""
    r["checks"] = "skipped"
    r.pop(contract.RECORD_GPU)


def test_a_record_made_with_no_checks_fails_only_the_checks_row(co):
    co.edit_record(_no_checks)
    _exactly(
        co,
        {"image checks": "the image was never checked (built with --no-checks: checks 'skipped'); run `build test`"},
    )
    matrix_row = _rows(co)["matrix <-> image.json"]
    assert matrix_row == verify.Row(
        "matrix <-> image.json",
        True,
        f"{_digest(co)[:19]}, bases and commit match the matrix, 1 third-party source(s)"
        "; GPU code not checked (--no-checks)",
    )


def test_a_checked_record_holds_and_says_so(co):
    assert _rows(co)["image checks"] == verify.Row(
        "image checks", True, "the recorded image passed its checks before it was recorded"
    )


def test_a_checked_record_without_the_gpu_block_fails_the_matrix_row_only(co):
    co.edit_record(lambda r: r.pop(contract.RECORD_GPU))
    _exactly(co, {"matrix <-> image.json": "image.json lacks the gpu block the GPU-code checks record"})


def test_an_unchecked_record_that_has_a_gpu_block_still_has_it_checked(co):
    co.edit_record(lambda r: (r.__setitem__("checks", "skipped"), r[contract.RECORD_GPU].__setitem__("families", [])))
    _exactly(
        co,
        {
            "image checks": "the image was never checked (built with --no-checks: checks 'skipped'); run `build test`",
            "matrix <-> image.json": f"gpu.families [] != matrix {list(co.target.gpu.capabilities)}",
        },
    )


# --- the GPU floor, on both sides of the claim -----------------------------------------------------


def _floor_row(co: Checkout, derived) -> verify.Row:
    co.edit_record(lambda r: r[contract.RECORD_GPU].__setitem__("derived_floor", derived))
    return _rows(co)["matrix <-> image.json"]


def test_a_derived_floor_equal_to_the_claim_holds(co):
    claim = co.target.gpu.driver_floor
    row = _floor_row(co, claim)
    assert row.ok and row.detail.endswith(
        f"; GPU floor {claim} <= {claim}, {len(co.target.gpu.capabilities)} families covered"
    )


def test_a_derived_floor_one_step_above_the_claim_fails(co):
    claim = co.target.gpu.driver_floor
    above = claim + ".1"  # 575.51 -> 575.51.1: one component more is newer
    row = _floor_row(co, above)
    assert row == verify.Row("matrix <-> image.json", False, f"gpu.derived_floor {above} exceeds the claimed {claim}")


def test_a_derived_floor_one_step_below_the_claim_holds(co):
    claim = co.target.gpu.driver_floor
    major, _, rest = claim.partition(".")
    below = f"{int(major) - 1}.{rest}" if rest else str(int(major) - 1)
    assert _floor_row(co, below).ok


def test_the_driver_floor_must_be_the_claim_exactly(co):
    claim = co.target.gpu.driver_floor
    co.edit_record(lambda r: r[contract.RECORD_GPU].__setitem__("driver_floor", claim + ".0"))
    _exactly(co, {"matrix <-> image.json": f"gpu.driver_floor {claim}.0 != matrix {claim}"})


def test_a_coverage_entry_missing_is_a_gap_and_any_code_is_coverage(co):
    gpu = co.target.gpu
    ext = sorted(gpu.required)[0]
    cc = gpu.required_on(ext)[0]
    co.edit_record(lambda r: r[contract.RECORD_GPU]["coverage"][ext].__setitem__(cc, "PTX JIT compute_80 (ISA 8.8)"))
    assert _rows(co)["matrix <-> image.json"].ok
    co.edit_record(lambda r: r[contract.RECORD_GPU]["coverage"][ext].pop(cc))
    _exactly(co, {"matrix <-> image.json": f"gpu.coverage has no code for {ext} on {cc}"})


# --- OS lock <-> SBOM: a .deb whose architecture is not the lock's ---------------------------------


def _purl_arch(arch: str):
    return lambda d: _deb(d).__setitem__("purl", _deb(d)["purl"].replace("arch=amd64", f"arch={arch}"))


@pytest.mark.parametrize("arch", ["arm64", "amd64x", "AMD64", "all"])
def test_a_deb_whose_architecture_differs_from_the_lock_s_fails_only_its_row(co, arch):
    co.edit_sbom(_purl_arch(arch))
    _exactly(co, {"OS lock <-> SBOM": f"numactl: SBOM 2.0.16-1 {arch} != OS lock 2.0.16-1 amd64"})


def test_a_deb_of_the_lock_s_architecture_and_version_holds(co):
    assert _rows(co)["OS lock <-> SBOM"] == verify.Row(
        "OS lock <-> SBOM", True, "all 2 .deb(s) in the SBOM as pkg:deb, same version, arch and sha256"
    )


def test_a_deb_whose_version_and_arch_both_differ_names_both(co):
    co.edit_sbom(lambda d: (_purl_arch("i386")(d), _deb(d).__setitem__("version", "2.0.16-0")))
    _exactly(co, {"OS lock <-> SBOM": "numactl: SBOM 2.0.16-0 i386 != OS lock 2.0.16-1 amd64"})


def test_the_first_lock_entry_that_differs_is_named_in_the_lock_s_order(co):
    co.edit_sbom(lambda d: (_purl_arch("arm64")(d), _deb(d, "libnuma1").__setitem__("version", "9")))
    _exactly(co, {"OS lock <-> SBOM": "libnuma1: SBOM 9 amd64 != OS lock 2.0.16-1 amd64"})


# --- SBOM components without a hash, or with one too many -----------------------------------------

DEB_HASH = "numactl: the SBOM's sha256 (the unpacked .deb's) is not the OS lock's"
PYPI_HASH = f"{PYPI}: the SBOM's hash (the installed wheel's) is not one of the lock's"


@pytest.mark.parametrize("edit", [lambda c: c.pop("hashes"), lambda c: c.__setitem__("hashes", [])], ids=["none", "[]"])
def test_a_deb_component_without_a_hash_fails_only_its_row(co, edit):
    co.edit_sbom(lambda d: edit(_deb(d)))
    _exactly(co, {"OS lock <-> SBOM": DEB_HASH})


@pytest.mark.parametrize("edit", [lambda c: c.pop("hashes"), lambda c: c.__setitem__("hashes", [])], ids=["none", "[]"])
def test_a_wheel_component_without_a_hash_fails_only_its_row(co, edit):
    co.edit_sbom(lambda d: edit(_pypi(d)))
    _exactly(co, {"lock <-> SBOM": PYPI_HASH})


def test_the_lock_s_own_hash_twice_is_one_hash_too_many(co):
    co.edit_sbom(lambda d: _pypi(d)["hashes"].append(dict(_pypi(d)["hashes"][0])))
    _exactly(co, {"lock <-> SBOM": PYPI_HASH})
    co.edit_sbom(lambda d: _pypi(d).__setitem__("hashes", _pypi(d)["hashes"][:1]))  # back to one: holds
    _exactly(co, {})


def test_the_deb_s_own_sha256_twice_is_not_the_lock_s(co):
    co.edit_sbom(lambda d: _deb(d)["hashes"].append(dict(_deb(d)["hashes"][0])))
    _exactly(co, {"OS lock <-> SBOM": DEB_HASH})


def test_a_wheel_version_that_differs_is_named_with_both(co):
    co.edit_sbom(lambda d: _pypi(d).__setitem__("version", "12.9.79.post1"))
    _exactly(co, {"lock <-> SBOM": f"{PYPI}: SBOM 12.9.79.post1 != lock 12.9.79"})


# --- image.json <-> provenance: the subjects ------------------------------------------------------


def _subjects_row(co: Checkout, subjects: list[str]) -> str:
    return f"subject {subjects} != image.json {_digest(co)}"


def test_one_subject_more_than_expected_fails_the_provenance_row(co):
    extra = "e" * 64
    co.edit_statement(lambda d: d["subject"].append({"name": "other", "digest": {"sha256": extra}}))
    _exactly(co, {"image.json <-> provenance": _subjects_row(co, [_hex(co), extra])})


def test_the_image_named_twice_is_a_subject_too_many(co):
    co.edit_statement(lambda d: d["subject"].append(json.loads(json.dumps(d["subject"][0]))))
    _exactly(co, {"image.json <-> provenance": _subjects_row(co, [_hex(co), _hex(co)])})


def test_another_subject_first_fails_the_audit_files_row_too(co):
    extra = "e" * 64
    co.edit_statement(lambda d: d["subject"].insert(0, {"name": "other", "digest": {"sha256": extra}}))
    _exactly(
        co,
        {
            "image.json <-> audit files": f"{contract.PROVENANCE_NAME} describes sha256:{extra}, "
            f"image.json names {_digest(co)}",
            "image.json <-> provenance": _subjects_row(co, [extra, _hex(co)]),
        },
    )


def test_exactly_the_recorded_subject_holds(co):
    assert [s["digest"]["sha256"] for s in co.statement()["subject"]] == [_hex(co)]
    assert _rows(co)["image.json <-> provenance"] == verify.Row(
        "image.json <-> provenance",
        True,
        "subject, identities and resolved dependencies match image.json and the matrix",
    )


# --- image.json <-> provenance: the wheel records --------------------------------------------------


def _drop_dep(name: str):
    def edit(d):
        deps = d["predicate"]["buildDefinition"]["resolvedDependencies"]
        d["predicate"]["buildDefinition"]["resolvedDependencies"] = [x for x in deps if x["name"] != name]

    return edit


def test_a_provenance_without_the_wheel_records_the_record_has_fails(co):
    co.edit_statement(_drop_dep("wheel-records"))
    want = {"sha256": store.wheel_records_sha256(co.record()[contract.RECORD_WHEELS])}
    _exactly(co, {"image.json <-> provenance": f"resolvedDependencies wheel-records None != image.json {want}"})


def test_a_record_and_provenance_both_from_before_wheel_records_hold(co):
    co.edit_record(lambda r: r.pop(contract.RECORD_WHEELS))
    co.edit_statement(_drop_dep("wheel-records"))
    _exactly(co, {})
    assert _rows(co)["lock <-> image.json"].detail == "both lock sha256 match (a record without wheel RECORD digests)"


def test_a_wheel_record_of_another_version_names_other_versions(co):
    co.edit_record(lambda r: r[contract.RECORD_WHEELS][PYPI].__setitem__("version", "12.9.80"))
    rows = _rows(co)
    assert rows["lock <-> image.json"] == verify.Row(
        "lock <-> image.json",
        False,
        f"{contract.RECORD_WHEELS} names other versions, not the {contract.LOCK_NAME} entries",
    )


def test_a_wheel_record_that_is_not_a_mapping_names_other_versions(co):
    co.edit_record(lambda r: r[contract.RECORD_WHEELS].__setitem__(PYPI, "12.9.79"))
    assert _rows(co)["lock <-> image.json"].detail == (
        f"{contract.RECORD_WHEELS} names other versions, not the {contract.LOCK_NAME} entries"
    )


def test_a_target_without_os_packages_needs_no_os_lock_dependency(co):
    bare = co.target.model_copy(update={"os_packages": None})

    def as_bare(d):
        d["predicate"]["buildDefinition"]["externalParameters"]["matrix"] = bare.as_input()
        _drop_dep("os-lock")(d)

    co.edit_statement(as_bare)
    assert _rows(co, target=bare)["image.json <-> provenance"].ok
    co.edit_statement(
        lambda d: d["predicate"]["buildDefinition"]["externalParameters"].__setitem__("matrix", co.target.as_input())
    )
    assert _rows(co)["image.json <-> provenance"] == verify.Row(  # the matrix's target has os_packages
        "image.json <-> provenance",
        False,
        f"resolvedDependencies os-lock None != image.json {{'sha256': '{co.record()['os_lock_sha256']}'}}",
    )


# --- every other row: one passing input, one failing, exactly ---------------------------------------


def test_the_render_row_names_the_drift(co):
    df = contract.dockerfile_path(co.root, "smoke")
    assert _rows(co)["matrix <-> Dockerfile"] == verify.Row(
        "matrix <-> Dockerfile", True, f"sha256 {sha256_file(df)[:16]}"
    )
    df.write_text(df.read_text() + "# a comment\n")
    problem = render.drift(co.target, df)
    assert problem
    rows = _rows(co)
    assert rows["matrix <-> Dockerfile"] == verify.Row(
        "matrix <-> Dockerfile", False, f"the committed Dockerfile: {problem}"
    )
    assert rows["Dockerfile <-> image.json"] == verify.Row(
        "Dockerfile <-> image.json",
        False,
        f"Dockerfile sha256 {sha256_file(df)[:16]} != image.json {co.record()['dockerfile_sha256'][:16]}",
    )


def _read_error(read, path) -> str:
    """The one-line error ``read`` (the lock's or the OS lock's reader) gives for ``path``."""
    try:
        read(path)
    except BuilderError as exc:
        return exc.message
    raise AssertionError(f"{path} reads")


def test_the_lock_row_names_the_lock_s_own_error(co):
    path = co.path(contract.BUILD_LOCK_NAME)
    path.write_text(path.read_text() + "extra==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    _exactly(
        co,
        {
            "lock hash-pinned": _read_error(lock.read_entries, path),
            "lock <-> image.json": f"{path.name} sha256 {sha256_file(path)[:16]} != image.json "
            f"{co.record()['build_lock_sha256'][:16]}",
        },
    )


def test_the_os_lock_rows_name_the_lock_s_own_error_and_the_recorded_hash(co):
    path = co.path(contract.OS_LOCK_NAME)
    recorded = co.record()["os_lock_sha256"]
    path.write_text(path.read_text().replace("numactl 2.0.16-1", "numactl 2.0.16-9", 1))
    why = _read_error(oslock.read, path)
    _exactly(
        co,
        {
            "OS lock hash-pinned": why,
            "OS lock <-> image.json": f"{path.name} sha256 {sha256_file(path)[:16]} != image.json {recorded[:16]}",
            "OS lock <-> SBOM": why,
        },
    )


def test_a_missing_os_lock_is_named_missing(co):
    path = co.path(contract.OS_LOCK_NAME)
    recorded = co.record()["os_lock_sha256"]
    path.unlink()
    rows = _rows(co)
    assert rows["OS lock <-> image.json"] == verify.Row(
        "OS lock <-> image.json", False, f"{path.name} sha256 missing != image.json {recorded[:16]}"
    )
    assert not rows["OS lock hash-pinned"].ok and not rows["OS lock <-> SBOM"].ok


def test_the_recorded_digest_must_be_sha256_and_sixty_four_lower_hex(co):
    good = _digest(co)
    for bad in ("sha256:" + good[7:].upper(), good[:-1], good + "0", "sha512:" + good[7:]):
        co.edit_record(
            lambda r, bad=bad: (
                r.__setitem__("digest", bad),
                r.__setitem__("image", r["image"].split("@")[0] + "@" + bad),
            )
        )
        assert _rows(co)["matrix <-> image.json"] == verify.Row(
            "matrix <-> image.json", False, f"digest {bad!r} is malformed"
        ), bad


def test_a_record_of_another_target_is_named(co):
    co.edit_record(lambda r: r.__setitem__("target", "smoke2"))
    assert _rows(co)["matrix <-> image.json"] == verify.Row(
        "matrix <-> image.json", False, "target 'smoke2' != 'smoke'"
    )


def test_the_image_must_be_the_matrix_s_name_at_the_digest(co):
    name = co.target.image.name
    digest = _digest(co)
    co.edit_record(lambda r: r.__setitem__("image", f"{name}x@{digest}"))
    assert _rows(co)["matrix <-> image.json"].detail == f"image {name}x@{digest} is not {name}@{digest}"
    co.edit_record(lambda r: r.__setitem__("image", f"{name}@{digest}@{digest}"))
    assert _rows(co)["matrix <-> image.json"].ok is False


def test_the_signature_rows_hold_and_each_names_the_key(co):
    mine = provsign.public_key(co.root, co.target.signing.public_key)
    rows = _rows(co)
    assert rows["provenance signed"] == verify.Row("provenance signed", True, "1 signature(s)")
    assert rows["provenance signer"] == verify.Row(
        "provenance signer", True, f"by the matrix's signing.public_key (key id {mine.keyid[:16]})"
    )
    assert rows["provenance signature"] == verify.Row(
        "provenance signature", True, f"verifies over the payload ({mine.scheme}, offline)"
    )


def test_an_unsigned_provenance_fails_only_the_signed_row_naming_the_key(co):
    mine = provsign.public_key(co.root, co.target.signing.public_key)
    co.edit_statement(lambda d: None, sign_with=None)
    _exactly(
        co,
        {"provenance signed": f"no signature, but the matrix names signing.public_key (key id {mine.keyid[:16]})"},
    )


def test_a_wrong_payload_type_over_a_good_payload_fails_exactly_the_four_provenance_rows(co):
    env = co.envelope()
    env["payloadType"] = "application/json"
    co.set_provenance_text(json.dumps(env, indent=2) + "\n")
    why = f"{contract.PROVENANCE_NAME}: payloadType 'application/json' is not application/vnd.in-toto+json"
    _exactly(
        co,
        {
            "image.json <-> provenance": why,
            "provenance signed": why,
            "provenance signer": why,
            "provenance signature": why,
        },
    )


def test_a_target_that_claims_no_gpu_code_and_a_record_without_a_gpu_block_hold(co):
    bare = co.target.model_copy(update={"gpu": None})
    co.edit_record(lambda r: r.pop(contract.RECORD_GPU))
    # (the rendered Dockerfile and the provenance's matrix entry are the gpu-claiming target's: those
    # rows fail for the bare target by design; the matrix row is the one about the record's gpu block)
    assert _rows(co, target=bare)["matrix <-> image.json"] == verify.Row(
        "matrix <-> image.json", True, f"{_digest(co)[:19]}, bases and commit match the matrix, 1 third-party source(s)"
    )
    co.edit_record(lambda r: r.__setitem__("checks", "skipped"))  # unchecked: the same, no gpu block either way
    assert _rows(co, target=bare)["matrix <-> image.json"].detail.endswith(", 1 third-party source(s)")


def test_several_coverage_gaps_are_all_named_in_the_matrix_s_order(co):
    gpu = co.target.gpu
    ext = sorted(gpu.required)[0]
    first, second = gpu.required_on(ext)[:2]
    co.edit_record(lambda r: [r[contract.RECORD_GPU]["coverage"][ext].pop(cc) for cc in (second, first)])
    _exactly(co, {"matrix <-> image.json": f"gpu.coverage has no code for {ext} on {first}, {ext} on {second}"})


def test_a_damaged_lock_the_record_names_fails_the_record_row_with_the_lock_s_error(co):
    path = co.path(contract.LOCK_NAME)
    path.write_text(path.read_text().replace("==", "== ", 1))  # its body no longer matches its header
    co.edit_record(lambda r: r.__setitem__("lock_sha256", sha256_file(path)))  # ...and re-recorded
    why = _read_error(lock.read_entries, path)
    failing = {r.check: r.detail for r in co.rows() if not r.ok}
    assert failing["lock hash-pinned"] == why
    assert failing["lock <-> image.json"] == why
    assert failing["lock <-> SBOM"] == why
    assert sorted(failing) == ["image.json <-> provenance", "lock <-> SBOM", "lock <-> image.json", "lock hash-pinned"]


def _first_dependency(co: Checkout) -> tuple[str, dict]:
    """The first dependency the row checks (base:build) and the digest image.json gives it."""
    return "base:build", {"sha256": co.record()["bases"]["build"]["digest"].removeprefix("sha256:")}


def test_a_dependency_without_a_digest_is_named_with_an_empty_one(co):
    name, want = _first_dependency(co)
    co.edit_statement(
        lambda d: next(x for x in d["predicate"]["buildDefinition"]["resolvedDependencies"] if x["name"] == name).pop(
            "digest"
        )
    )
    _exactly(co, {"image.json <-> provenance": f"resolvedDependencies {name} {{}} != image.json {want}"})


def test_a_provenance_without_resolved_dependencies_names_the_first_it_lacks(co):
    name, want = _first_dependency(co)
    co.edit_statement(lambda d: d["predicate"]["buildDefinition"].pop("resolvedDependencies"))
    _exactly(co, {"image.json <-> provenance": f"resolvedDependencies {name} None != image.json {want}"})


def test_a_target_that_pins_torch_needs_it_in_the_lock_and_the_row_names_the_lock(co):
    from builder.config.schema import Pin

    torch = Pin(version="2.13.0+cu129", index="https://download.pytorch.org/whl/cu129")
    pinned = co.target.model_copy(update={"torch": torch})
    path = co.path(contract.LOCK_NAME)
    assert _rows(co, target=pinned)["lock hash-pinned"] == verify.Row(
        "lock hash-pinned",
        False,
        f"{path}: no torch in the lock, but the target pins torch 2.13.0+cu129; re-lock with the cu129 index",
    )


def test_the_lock_row_counts_each_lock_s_entries(co):
    path = co.path(contract.LOCK_NAME)
    text = path.read_text()
    body = lock._split_header(text)[1]
    extra = body + "zz-extra==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    path.write_text(
        text[: len(text) - len(body)].replace(sha256_bytes(body.encode()), sha256_bytes(extra.encode())) + extra
    )
    assert _rows(co)["lock hash-pinned"] == verify.Row(
        "lock hash-pinned", True, "2 runtime + 1 build entries, all hash-pinned"
    )


# --- the rows not pinned above: one failing input each, the failing set and detail exactly ---------


def _base_runtime_x(co: Checkout) -> dict[str, str]:
    co.edit_sbom(
        lambda d: next(c for c in d["components"] if c["bom-ref"] == "base:runtime").__setitem__("version", "x")
    )
    return {"image.json <-> SBOM": "SBOM base runtime x != image.json"}


def _sbom_other_bytes(co: Checkout) -> dict[str, str]:
    path = co.path(contract.SBOM_NAME)
    path.write_text(path.read_text() + "\n")  # not re-recorded: a file of another build
    return {"image.json <-> audit files": f"{contract.SBOM_NAME} differs from what image.json names"}


def _recorded_dockerfile(co: Checkout) -> dict[str, str]:
    df = contract.dockerfile_path(co.root, "smoke")
    co.edit_record(lambda r: r.__setitem__("dockerfile_sha256", "f" * 64))
    return {
        "Dockerfile <-> image.json": f"Dockerfile sha256 {sha256_file(df)[:16]} != image.json ffffffffffffffff",
        "image.json <-> provenance": "resolvedDependencies dockerfile "
        f"{{'sha256': '{sha256_file(df)}'}} != image.json {{'sha256': '{'f' * 64}'}}",
    }


def _recorded_os_lock(co: Checkout) -> dict[str, str]:
    path = co.path(contract.OS_LOCK_NAME)
    co.edit_record(lambda r: r.__setitem__("os_lock_sha256", "f" * 64))
    return {
        "OS lock <-> image.json": f"{path.name} sha256 {sha256_file(path)[:16]} != image.json ffffffffffffffff",
        "image.json <-> provenance": "resolvedDependencies os-lock "
        f"{{'sha256': '{sha256_file(path)}'}} != image.json {{'sha256': '{'f' * 64}'}}",
    }


@pytest.mark.parametrize("tamper", [_base_runtime_x, _sbom_other_bytes, _recorded_dockerfile, _recorded_os_lock])
def test_each_remaining_row_fails_alone_with_its_detail(co, tamper):
    _exactly(co, {})  # the clean set: every row holds
    _exactly(co, tamper(co))


def test_the_registry_image_row_holds_and_fails_on_a_moved_tag(co):
    digest, tag = _digest(co), co.target.image.tag
    rows = _rows(co, registry=True)
    assert rows["registry: image"] == verify.Row(
        "registry: image", True, f"serves {digest[:19]}; tag {tag} points at it"
    )
    moved = co.engine.registry.push(co.target.image.name, tag, {"architecture": "amd64"}, [b"other"])
    _exactly(
        co,
        {"registry: image": f"tag {tag} now points at {moved}, image.json says {digest}"},
        registry=True,
    )
