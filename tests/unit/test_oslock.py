"""The OS package lock (builder/deps/oslock.py) on apt output shaped like the real one (the real
resolution runs in tests/integration/test_os_packages.py), the matrix's rules for os_packages, and
the rendered os-packages stage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.config import matrix
from builder.deps import oslock
from builder.dockerfile import render
from builder.errors import ConfigError, LockError, Unreachable
from tests.conftest import REPO

SHA = {"libnuma1": "1" * 64, "numactl": "2" * 64}


def _cu129():
    return matrix.load(REPO / "matrix.yaml").target("cu129")


# Packages the runtime base already has (dpkg-query's K3-HAVE lines): apt installs nothing for them.
BASE_HAS = ("libc6", "libibverbs1", "ibverbs-providers", "librdmacm1")


def _out(update=0, install=0, sim=None, log="", pkgs=None, have=BASE_HAS):
    """What the resolution script prints: K3-* lines, as a container of the base prints them."""
    sim = (
        sim
        if sim is not None
        else [
            "Inst libnuma1 (2.0.14-3ubuntu2 Ubuntu:22.04/jammy [amd64])",
            "Inst numactl (2.0.14-3ubuntu2 Ubuntu:22.04/jammy [amd64])",
        ]
    )
    pkgs = (
        pkgs
        if pkgs is not None
        else [
            (n, "2.0.14-3ubuntu2", f"pool/main/n/numactl/{n}_2.0.14-3ubuntu2_amd64.deb")
            for n in ("libnuma1", "numactl")
        ]
    )
    lines = [
        f"K3-UPDATE {update}",
        *(f"K3-LOG {ln}" for ln in log.splitlines()),
        "K3-ARCH amd64",
        *(f"K3-HAVE {name}" for name in have),
        f"K3-INSTALL {install}",
        *(f"K3-SIM {ln}" for ln in sim),
    ]
    archive = _cu129().os_packages.archive
    for _name, _version, filename in pkgs:
        lines.append(f"K3-URI '{archive}/{filename}' {filename.rsplit('/', 1)[1]} 100 MD5Sum:{'a' * 32}")
    for name, version, filename in pkgs:
        lines += [
            f"K3-PKG Package: {name}",
            f"K3-PKG Version: {version}",
            "K3-PKG Architecture: amd64",
            f"K3-PKG Filename: {filename}",
            "K3-PKG Size: 100",
            f"K3-PKG SHA256: {SHA[name]}",
            "K3-PKG --",
        ]
    return "\n".join(lines) + "\n"


def _parse(out):
    return oslock.parse_resolution(out, _cu129().os_packages, "targets.cu129.os_packages")


def test_the_closure_becomes_sorted_lock_lines_with_the_index_sha256():
    entries = _parse(_out())
    assert [(e.name, e.version, e.arch, e.sha256) for e in entries] == [
        ("libnuma1", "2.0.14-3ubuntu2", "amd64", SHA["libnuma1"]),
        ("numactl", "2.0.14-3ubuntu2", "amd64", SHA["numactl"]),
    ]
    assert entries[0].url == f"{_cu129().os_packages.archive}/pool/main/n/numactl/libnuma1_2.0.14-3ubuntu2_amd64.deb"


def test_an_updates_index_without_md5_still_resolves():
    # bookworm-updates gives no MD5Sum: apt's --print-uris line then ends after the size.
    entries = _parse(re.sub(r" MD5Sum:a+$", " ", _out(), flags=re.M))
    assert [e.name for e in entries] == ["libnuma1", "numactl"]


def test_a_closure_that_replaces_a_base_package_is_a_version_conflict():
    sim = [
        "Inst libc6 [2.35-0ubuntu3] (2.39-0ubuntu8 Ubuntu:24.04/noble [amd64])",
        "Inst numactl (2.0.18-1 Ubuntu:24.04/noble [amd64])",
    ]
    with pytest.raises(
        LockError,
        match=r"version conflict with the runtime base: .*libc6 2\.39-0ubuntu8 \(the base "
        r"has 2\.35-0ubuntu3\)",
    ) as info:
        _parse(_out(sim=sim, pkgs=[]))
    assert info.value.exit_code == 2


def test_a_package_the_archive_lacks_is_bad_input_with_apts_reason():
    with pytest.raises(
        LockError,
        match=r"os_packages\.packages: apt cannot install .*E: Unable to locate package "
        r"k3-nope",
    ) as info:
        _parse(_out(install=100, sim=["Reading package lists...", "E: Unable to locate package k3-nope"], pkgs=[]))
    assert info.value.exit_code == 2


def test_an_archive_that_does_not_answer_is_out_of_reach():
    with pytest.raises(Unreachable, match=r"os_packages\.archive: .* not reachable") as info:
        _parse(
            _out(update=100, log="W: Failed to fetch http://x/dists/jammy/InRelease  Could not resolve 'x'", pkgs=[])
        )
    assert info.value.exit_code == 3


def test_a_suite_the_archive_lacks_is_bad_input_not_unreachable():
    log = "W: Failed to fetch http://x/dists/jammy-nope/InRelease  404  Not Found [IP: 1.2.3.4 80]"
    with pytest.raises(LockError, match=r"os_packages\.suites: .* has no jammy") as info:
        _parse(_out(update=100, log=log, pkgs=[]))
    assert info.value.exit_code == 2


def test_a_closure_that_removes_a_base_package_is_a_conflict():
    sim = ["Remv libnuma1 [2.0.14-3ubuntu2]", "Inst numactl (2.0.18-1 Ubuntu:24.04/noble [amd64])"]
    with pytest.raises(LockError, match=r"version conflict .*libnuma1 \(removed from the base\)"):
        _parse(_out(sim=sim, pkgs=[]))


def test_an_index_without_sha256_is_refused():
    out = _out().replace(f"K3-PKG SHA256: {SHA['numactl']}\n", "")
    with pytest.raises(LockError, match="no SHA256 for numactl"):
        _parse(out)


def test_a_lock_round_trips_and_an_edited_line_fails_its_body_hash(tmp_path):
    t = _cu129()
    entries = _parse(_out())
    path = tmp_path / "os-packages.txt"
    path.write_text(oslock.lock_text(t, entries))
    assert oslock.read(path) == entries
    oslock.check_current(path, t)
    path.write_text(path.read_text().replace("numactl 2.0.14-3ubuntu2", "numactl 2.0.14-3ubuntu3"))
    with pytest.raises(LockError, match="does not match its # k3-lock-body-sha256"):
        oslock.read(path)


def test_a_changed_package_list_archive_or_base_makes_the_lock_stale(tmp_path):
    t = _cu129()
    path = tmp_path / "os-packages.txt"
    path.write_text(oslock.lock_text(t, _parse(_out())))
    osp = t.os_packages
    for changed in (
        t.model_copy(update={"os_packages": osp.model_copy(update={"packages": osp.packages[1:]})}),
        t.model_copy(update={"os_packages": osp.model_copy(update={"archive": osp.archive[:-3] + "01Z"})}),
        t.model_copy(
            update={
                "bases": t.bases.model_copy(
                    update={"runtime": t.bases.build.model_copy(update={"digest": "sha256:" + "9" * 64})}
                )
            }
        ),
    ):
        with pytest.raises(LockError, match="stale"):
            oslock.check_current(path, changed)


def _matrix_with(tmp_path: Path, block: str) -> str:
    text = (REPO / "matrix.yaml").read_text()
    start, end = text.index("    os_packages:\n"), text.index("    entrypoint: [vllm, serve]")
    return text[:start] + block + text[end:]


@pytest.mark.parametrize(
    "block,message",
    [
        (
            "    os_packages:\n      archive: http://deb.debian.org/debian\n      suites: [bookworm]\n"
            "      packages: [{name: numactl, why: x}]\n",
            r"os_packages\.archive: .* is not a snapshot archive",
        ),
        (
            "    os_packages:\n      archive: https://snapshot.ubuntu.com/ubuntu/20261101T000000Z\n      suites: [jammy]\n"
            "      packages: [{name: numactl, why: x}, {name: numactl, why: y}]\n",
            r"packages\.1\.name: numactl is listed twice",
        ),
        (
            "    os_packages:\n      archive: https://snapshot.ubuntu.com/ubuntu/20261101T000000Z\n      suites: [jammy]\n"
            "      packages: [{name: 'numactl; rm -rf /', why: x}]\n",
            r"packages\.0\.name: must be a Debian package name",
        ),
        (
            "    os_packages:\n      archive: https://snapshot.ubuntu.com/ubuntu/20261101T000000Z\n      suites: [jammy]\n"
            "      packages: [{name: numactl}]\n",
            r"packages\.0\.why: required key is missing",
        ),
        (
            "    os_packages:\n      archive: https://snapshot.ubuntu.com/ubuntu/20261101T000000Z\n      suites: [jammy]\n"
            "      packages: [{name: numactl, why: x}]\n      loads: ['libnuma.so.1 && id']\n",
            r"os_packages\.loads\.0: must be a soname",
        ),
    ],
)
def test_bad_os_packages_are_one_keyed_line(tmp_path, block, message):
    with pytest.raises(ConfigError, match=message) as info:
        matrix.parse(_matrix_with(tmp_path, block), tmp_path / "matrix.yaml")
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_the_os_layer_is_its_own_stage_and_one_copy_first_above_the_base():
    text = render.render(_cu129())
    stage = text[text.index("AS os-packages") : text.index("AS build\n")]
    assert "RUN --network=none --mount=type=bind,source=debs," in stage and "dpkg-deb -x" in stage
    assert "apt-get" not in stage and "ldconfig" not in stage.split("# ")[-1]
    assert 'skipped=" ibverbs-providers libibverbs1 "' in stage  # the matrix's scripts_skipped, sorted
    final = text[text.index("AS runtime\n") :]
    assert "\nRUN " not in final
    copies = re.findall(r"^COPY .*$", final, re.M)
    assert copies[0] == "COPY --from=os-packages /os-root/ /"  # least changeable layer lowest
    assert (REPO / "dockerfiles/cu129/Dockerfile").read_text() == text


def test_a_deb_is_cached_by_its_sha256_and_a_mismatch_is_refused_unwritten(tmp_path, monkeypatch):
    from builder.deps import buildcontext
    from builder.fsutil import sha256_bytes

    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    deb = tmp_path / "numactl_2.0.16-1_amd64.deb"
    deb.write_bytes(b"!<arch>\nnot really a deb\n")
    good = oslock.DebEntry(
        "numactl", "2.0.16-1", "amd64", deb.as_uri(), deb.stat().st_size, sha256_bytes(deb.read_bytes())
    )
    cached = buildcontext._fetch_deb(good)
    assert cached == tmp_path / "cache" / "debs" / f"{good.sha256}.deb" and cached.read_bytes() == deb.read_bytes()
    cached.write_bytes(b"swapped")  # a damaged or swapped cache entry is fetched again, never used
    assert buildcontext._fetch_deb(good).read_bytes() == deb.read_bytes()
    bad = oslock.DebEntry("numactl", "2.0.16-1", "amd64", deb.as_uri(), good.size, "0" * 64)
    with pytest.raises(
        LockError,
        match=r"numactl_2\.0\.16-1_amd64\.deb from file://\S+ has sha256 [0-9a-f]{16}\.\.\., "
        r"the lock says 0{16}",
    ) as info:
        buildcontext._fetch_deb(bad)
    assert info.value.exit_code == 2
    assert sorted(p.name for p in (tmp_path / "cache" / "debs").iterdir() if not p.name.endswith(".lock")) == [
        f"{good.sha256}.deb"
    ]  # nothing of the refused download is left
    gone = oslock.DebEntry("numactl", "2.0.16-1", "amd64", "http://127.0.0.1:9/x.deb", 1, "1" * 64)
    with pytest.raises(Unreachable):
        buildcontext._fetch_deb(gone)


def test_a_deb_download_stops_at_the_locked_size(tmp_path, monkeypatch):
    """Issue 32: 2 GiB were streamed for a 36 KB package before the hash check; now the download
    stops one byte past the locked size and is refused, nothing cached."""
    from builder.deps import buildcontext

    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))

    class Endless:  # what a hostile archive (or a broken proxy) streams: 2 GiB of zeros
        served = 0

        def read(self, n: int = -1) -> bytes:
            n = min(n if n > 0 else 1 << 20, 2 * 1024**3 - Endless.served)
            Endless.served += n
            return b"\0" * n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(buildcontext.urllib.request, "urlopen", lambda url, timeout: Endless())
    entry = oslock.DebEntry("libnuma1", "2.0.16-1", "amd64", "http://deb.example/x.deb", 36 * 1024, "a" * 64)
    with pytest.raises(LockError, match=r"longer than the locked 36864 bytes") as info:
        buildcontext._fetch_deb(entry)
    assert info.value.exit_code == 2 and Endless.served == 36 * 1024 + 1
    assert [p.name for p in (tmp_path / "cache" / "debs").iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.parametrize("size", [0, 1, 5, 1 << 16, (1 << 16) + 3])
def test_copy_capped_copies_what_fits_and_one_byte_more(size):
    import io

    from builder.deps.buildcontext import copy_capped

    for length in (0, size, size + 1, size + 70000):
        out = io.BytesIO()
        assert copy_capped(io.BytesIO(b"x" * length), out, size) == min(length, size + 1) == len(out.getvalue())


def test_an_os_lock_that_is_not_utf8_is_one_line_exit_2(tmp_path):
    from builder.deps import oslock
    from builder.errors import LockError

    bad = tmp_path / "os-packages.txt"
    bad.write_bytes(b"# k3\xff\n")
    with pytest.raises(LockError, match=r"os-packages.txt: unreadable OS lock") as info:
        oslock.read(bad)
    assert info.value.exit_code == 2
    with pytest.raises(LockError, match="no OS package lock for this target"):
        oslock.read(tmp_path / "missing.txt")


def test_a_name_apt_reads_as_a_pattern_is_refused_when_no_package_has_it_exactly():
    """Issue 32: `numa.+` locked 138 packages. A name no package has is a regex (or a glob) to apt,
    which installs whatever matches; the lock holds each name to one apt installs or the base has."""
    target = _cu129()
    osp = target.os_packages.model_copy(
        update={
            "packages": (
                *target.os_packages.packages,
                target.os_packages.packages[-1].model_copy(update={"name": "numa+"}),
            )
        }
    )
    with pytest.raises(LockError, match=r"os_packages\.packages: numa\+: no package has that exact name") as info:
        oslock.parse_resolution(_out(), osp, "targets.cu129.os_packages")
    assert info.value.exit_code == 2 and "\n" not in info.value.message
    with pytest.raises(LockError, match="libibverbs1, ibverbs-providers, librdmacm1: no package has that exact name"):
        _parse(_out(have=()))  # neither installed by apt nor in the base


@pytest.mark.parametrize("name", ["numa.+", "numa.", "numa*", "numa?", "[n]uma", "numa|x", "^numa", "numa$"])
def test_the_matrix_refuses_an_apt_pattern_as_a_package_name(name):
    text = (REPO / "matrix.yaml").read_text().replace("- name: numactl", f"- name: '{name}'", 1)
    with pytest.raises(ConfigError, match=r"os_packages\.packages\.\d+\.name: must be a Debian package name"):
        matrix.parse(text, Path("matrix.yaml"))


@pytest.mark.parametrize(
    ("key", "value"), [("accept_drift", "'true'"), ("accept_drift", "'no'"), ("accept_drift", "1")]
)
def test_a_string_or_number_where_a_boolean_is_expected_is_refused(key, value):
    text = (REPO / "matrix.yaml").read_text()
    text = re.sub(r"(\n(\s+)archive: )", rf"\n\2{key}: {value}\1", text, count=1)
    assert f"{key}: {value}" in text
    with pytest.raises(ConfigError, match=rf"os_packages\.{key}: Input should be a valid boolean \(got "):
        matrix.parse(text, Path("matrix.yaml"))
