"""The OS lock's format (builder/deps/oslock.py): each line is exactly
``name version arch url size sha256:<64 hex>`` (trailing text, a garbled hash, a line split or
doubled is refused, naming the file and line), the headers, and the archive index's own fields as
apt prints them (a garbled SHA256 or Filename, an architecture that is not the base's, a URL apt
would not download).
"""

from __future__ import annotations

import json

import pytest

from builder.deps import oslock
from builder.deps.lock import BODY_HEADER, INPUT_HEADER
from builder.errors import LockError
from builder.fsutil import sha256_bytes
from tests.unit.test_oslock import BASE_HAS, SHA, _cu129, _out, _parse

GOOD = (
    "libnuma1 2.0.16-1 amd64 http://deb.debian.org/debian/pool/main/n/numactl/libnuma1_2.0.16-1_amd64.deb "
    "38432 sha256:" + "1" * 64
)
HEAD = "# OS packages of target t, made by `build lock`; do not edit.\n# (a comment)\n"


def lock(body: str, *, inputs: str | None = "i" * 64, body_sha: str | None = None) -> str:
    text = HEAD
    if inputs is not None:
        text += f"{INPUT_HEADER}{inputs}\n"
    text += f"{BODY_HEADER}{body_sha or sha256_bytes(body.encode())}\n"
    return text + body


def test_a_good_line_parses_to_its_fields(tmp_path):
    inputs, entries = oslock.parse(lock(GOOD + "\n"), tmp_path / "os-packages.txt")
    assert inputs == "i" * 64
    (e,) = entries
    assert (e.name, e.version, e.arch, e.size, e.sha256) == ("libnuma1", "2.0.16-1", "amd64", 38432, "1" * 64)
    assert e.line() == GOOD and e.filename == "libnuma1_2.0.16-1_amd64.deb"


@pytest.mark.parametrize(
    "line",
    [
        GOOD + " trailing",
        GOOD + " ",
        " " + GOOD,
        GOOD + "0",  # 65 hex digits
        GOOD[:-1],  # 63
        GOOD[:-1] + "G",  # not hex
        GOOD[:-64] + "A" * 64,  # upper case: apt prints lower case
        GOOD.replace("sha256:", "sha512:"),
        GOOD.replace("sha256:", ""),
        GOOD.replace(" 38432 ", " 38k "),
        GOOD.replace(" 38432 ", " -1 "),
        GOOD.replace(".deb ", ".udeb "),
        GOOD.replace("http://", "ftp://"),
        GOOD.replace("libnuma1 ", "LibNuma1 ", 1),
        GOOD.replace(" amd64 ", " AMD64 ", 1),
        GOOD.replace(" 2.0.16-1 ", " v2.0 ", 1),
        GOOD.replace(" ", "  ", 1),
        GOOD.replace(" ", "\t", 1),
        GOOD + " " + GOOD,
    ],
)
def test_a_line_that_is_not_exactly_six_fields_is_refused_naming_its_line(tmp_path, line):
    path = tmp_path / "os-packages.txt"
    text = lock(f"{GOOD}\n{line}\n")
    with pytest.raises(LockError) as err:
        oslock.parse(text, path)
    assert str(err.value).startswith(f"{path}:6: not 'name version arch url size sha256:<hex>': ")


def test_an_epoch_version_and_an_all_arch_line_parse(tmp_path):
    line = GOOD.replace(" 2.0.16-1 amd64 ", " 1:2.0.16-1+b1 all ", 1)
    (e,) = oslock.parse(lock(line + "\n"), tmp_path / "x")[1]
    assert (e.version, e.arch, e.filename) == ("1:2.0.16-1+b1", "all", "libnuma1_1%3a2.0.16-1+b1_all.deb")


def test_an_empty_line_in_the_body_is_refused(tmp_path):
    with pytest.raises(LockError, match=r":6: not 'name version"):
        oslock.parse(lock(f"{GOOD}\n\n"), tmp_path / "x")


def test_the_body_hash_is_checked_before_any_line(tmp_path):
    with pytest.raises(LockError, match="does not match its # k3-lock-body-sha256: header"):
        oslock.parse(lock(GOOD + " trailing\n", body_sha=sha256_bytes((GOOD + "\n").encode())), tmp_path / "x")
    with pytest.raises(LockError, match="does not match its"):
        oslock.parse(lock(GOOD + "\n", body_sha="0" * 64), tmp_path / "x")


def test_a_lock_without_a_body_header_is_refused(tmp_path):
    path = tmp_path / "os-packages.txt"
    with pytest.raises(LockError, match=rf"^{path}: no '# k3-lock-body-sha256:' header; re-run `build lock`$"):
        oslock.parse(HEAD + GOOD + "\n", path)


def test_a_lock_without_an_inputs_header_is_stale(tmp_path):
    path = tmp_path / "os-packages.txt"
    inputs, _ = oslock.parse(lock(GOOD + "\n", inputs=None), path)
    assert inputs is None
    with pytest.raises(LockError, match="stale: made from another os_packages list"):
        oslock.check_inputs(inputs, path, _cu129())
    oslock.check_inputs(oslock.inputs_sha256(_cu129()), path, _cu129())  # the matrix's own: current


def test_the_inputs_hash_changes_with_each_input():
    t = _cu129()
    osp = t.os_packages
    base = oslock.inputs_sha256(t)
    variants = [
        t.model_copy(update={"os_packages": osp.model_copy(update={"archive": osp.archive + "/x"})}),
        t.model_copy(update={"os_packages": osp.model_copy(update={"suites": (*osp.suites, "extra")})}),
        t.model_copy(update={"os_packages": osp.model_copy(update={"components": (*osp.components, "contrib")})}),
        t.model_copy(update={"os_packages": osp.model_copy(update={"packages": osp.packages[:-1]})}),
        t.model_copy(
            update={
                "os_packages": osp.model_copy(
                    update={"packages": (osp.packages[0].model_copy(update={"version": "9.9"}), *osp.packages[1:])}
                )
            }
        ),
        t.model_copy(
            update={
                "bases": t.bases.model_copy(
                    update={"runtime": t.bases.runtime.model_copy(update={"digest": "sha256:" + "0" * 64})}
                )
            }
        ),
    ]
    hashes = [oslock.inputs_sha256(v) for v in variants]
    assert base not in hashes and len(set(hashes)) == len(hashes)
    assert oslock.inputs_sha256(t.model_copy()) == base


# --- the archive's index, as apt prints it ---------------------------------------------------------


@pytest.mark.parametrize(
    "garbled",
    ["1" * 63, "1" * 65, "G" * 64, "A" * 64, "", "sha256:" + "1" * 64, "1" * 64 + " extra"],
)
def test_a_garbled_index_hash_is_refused(garbled):
    out = _out().replace(f"K3-PKG SHA256: {SHA['numactl']}\n", f"K3-PKG SHA256: {garbled}\n")
    with pytest.raises(LockError, match="the archive's index gives no SHA256 for numactl; a lock needs one"):
        _parse(out)


def test_the_first_sha256_field_of_a_block_is_the_one_read():
    out = _out().replace(
        f"K3-PKG SHA256: {SHA['numactl']}\n", f"K3-PKG SHA256: {SHA['numactl']}\nK3-PKG SHA256: {'9' * 64}\n"
    )
    assert {e.name: e.sha256 for e in _parse(out)} == SHA


@pytest.mark.parametrize(
    "filename",
    [
        "../pool/main/x.deb",
        "pool/main/x.deb extra",
        "pool/main/x.tar",
        "/pool/main/x.deb",
        "dists/x.deb",
        "pool/main/x y.deb",
    ],
)
def test_a_garbled_index_filename_is_refused(filename):
    good = "pool/main/n/numactl/numactl_2.0.14-3ubuntu2_amd64.deb"
    out = _out().replace(f"K3-PKG Filename: {good}\n", f"K3-PKG Filename: {filename}\n")
    with pytest.raises(LockError, match="numactl: unexpected Filename"):
        _parse(out)


def test_an_architecture_that_is_not_the_base_s_is_refused_and_all_is_not():
    out = _out().replace("K3-PKG Architecture: amd64\n", "K3-PKG Architecture: arm64\n", 1)
    with pytest.raises(LockError, match="architecture arm64 is not the base's amd64"):
        _parse(out)
    assert [
        e.arch for e in _parse(_out().replace("K3-PKG Architecture: amd64\n", "K3-PKG Architecture: all\n", 1))
    ] == [
        "all",
        "amd64",
    ]


def test_a_url_apt_would_not_download_is_refused():
    out = "\n".join(ln for ln in _out().splitlines() if not (ln.startswith("K3-URI") and "numactl_" in ln)) + "\n"
    with pytest.raises(LockError, match=r"numactl_2.0.14-3ubuntu2_amd64.deb is not what apt would download \(1 URIs\)"):
        _parse(out)


def test_a_url_the_lock_percent_encodes_is_the_one_apt_printed():
    # The lock's URL quotes the index's Filename ("+" becomes %2B); apt prints the "+" as it is.
    out = _out(
        pkgs=[
            ("libnuma1", "2.0.14-3ubuntu2+b1", "pool/main/n/numactl/libnuma1_2.0.14-3ubuntu2+b1_amd64.deb"),
            ("numactl", "2.0.14-3ubuntu2", "pool/main/n/numactl/numactl_2.0.14-3ubuntu2_amd64.deb"),
        ]
    )
    entries = _parse(out)
    assert [e.name for e in entries] == ["libnuma1", "numactl"] and "%2B" in entries[0].url


def test_apt_cache_and_apt_must_describe_the_same_packages():
    # libnuma1 is in the base (so its name is exact), yet apt-cache still describes it
    out = _out(sim=["Inst numactl (2.0.14-3ubuntu2 Ubuntu:22.04/jammy [amd64])"], have=(*BASE_HAS, "libnuma1"))
    with pytest.raises(LockError, match=r"apt-cache describes \['libnuma1', 'numactl'\], apt installs \['numactl'\]"):
        _parse(out)


# --- issue 38's mutation run: the inputs hash, the header, and which file each message names --------


def _with_pins(t, pins: dict[str, str | None]):
    osp = t.os_packages
    packages = tuple(p.model_copy(update={"version": pins[p.name]}) for p in osp.packages if p.name in pins)
    return t.model_copy(update={"os_packages": osp.model_copy(update={"packages": packages})})


def test_the_inputs_hash_is_the_sha256_of_the_documented_canonical_document():
    """The hash every committed OS lock carries: a change of its document's keys or of their order
    makes every lock ever committed stale, so the document is pinned here as the docs state it."""
    t = _cu129()
    osp = t.os_packages
    doc = (
        f'{{"archive": "{osp.archive}", "base": "{t.bases.runtime.digest}", '
        f'"components": {json.dumps(list(osp.components))}, '
        f'"packages": {json.dumps([[p.name, p.version] for p in osp.packages])}, '
        f'"suites": {json.dumps(list(osp.suites))}}}'
    )
    assert oslock.inputs_sha256(t) == sha256_bytes(doc.encode())


def test_a_request_carries_its_pin_and_an_unpinned_one_is_the_bare_name():
    t = _with_pins(_cu129(), {"libibverbs1": "39.0-1", "ibverbs-providers": None})
    script = oslock.resolve_script(t.os_packages)
    assert " libibverbs1=39.0-1 ibverbs-providers " in script.replace("\n", " ")
    assert "ibverbs-providers=" not in script


def test_the_header_names_the_base_archive_every_suite_and_component(tmp_path):
    t = _cu129()
    osp = t.os_packages.model_copy(update={"suites": ("jammy", "jammy-updates"), "components": ("main", "universe")})
    t = t.model_copy(update={"os_packages": osp})
    head = oslock.lock_text(t, []).splitlines()[:3]
    assert head == [
        f"# OS packages of target {t.name}, made by `build lock`; do not edit.",
        f"# Resolved against {t.bases.runtime.ref} from {osp.archive} jammy jammy-updates (main universe)",
        "# name version arch url size sha256 (packages the base already has are not listed)",
    ]


def test_a_stale_lock_an_edited_lock_and_a_malformed_line_each_name_the_file(tmp_path):
    t = _cu129()
    path = tmp_path / "os-packages.txt"
    path.write_text(lock(GOOD + "\n"))  # made from other inputs ("i" * 64)
    with pytest.raises(LockError) as e:
        oslock.check_current(path, t)
    assert e.value.message == (
        f"{path}: stale: made from another os_packages list, archive or runtime base than the matrix gives now; "
        f"run `build lock --target {t.name}`"
    )
    path.write_text(lock(GOOD + "\n", body_sha="0" * 64))
    for call in (lambda: oslock.check_current(path, t), lambda: oslock.read(path)):
        with pytest.raises(LockError) as e:
            call()
        assert e.value.message == (
            f"{path}: the lock's body does not match its {BODY_HEADER.strip()} header (truncated or edited by "
            "hand); restore it from git or re-run `build lock`"
        )
    long = GOOD + " and trailing text that makes the line longer than sixty characters"
    path.write_text(lock(long + "\n"))
    with pytest.raises(LockError) as e:
        oslock.read(path)
    assert e.value.message == f"{path}:5: not 'name version arch url size sha256:<hex>': {long[:60]!r}"


def test_a_missing_lock_says_where_to_make_it(tmp_path):
    path = tmp_path / "cu129" / "os-packages.txt"
    with pytest.raises(LockError) as e:
        oslock.read(path)
    assert e.value.message == (
        f"{path}: no OS package lock for this target; run `build lock --target cu129` where the archive is "
        "reachable, and commit it"
    )


def test_an_index_block_without_a_package_name_or_hash_is_named_as_unknown():
    out = _out().replace("K3-PKG Package: numactl\n", "").replace(f"K3-PKG SHA256: {SHA['numactl']}\n", "")
    with pytest.raises(LockError) as e:
        _parse(out)
    assert e.value.message == ("targets.cu129.os_packages: the archive's index gives no SHA256 for ?; a lock needs one")


def test_an_index_filename_with_upper_case_letters_is_a_pool_path():
    out = _out(
        pkgs=[
            ("libnuma1", "2.0.14-3ubuntu2", "pool/main/n/numactl/libnuma1_2.0.14-3ubuntu2_amd64.deb"),
            ("numactl", "2.0.14-3ubuntu2", "pool/main/n/numactl/NumaCtl_2.0.14-3ubuntu2_amd64.deb"),
        ]
    )
    assert [e.url.rsplit("/", 1)[1] for e in _parse(out)] == [
        "libnuma1_2.0.14-3ubuntu2_amd64.deb",
        "NumaCtl_2.0.14-3ubuntu2_amd64.deb",
    ]
