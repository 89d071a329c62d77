"""Issue 34's last three rules, on real artefacts made here: a wheel installed by this machine's pip
(its RECORD digest recorded from the wheel as the build does, then held against what pip wrote,
forged or not), the source's package files by content (git blob ids, as `git hash-object` makes
them), and the side effects of the python_trees imports (report-only)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.checks import checklist, probes
from builder.config import contract
from builder.deps import buildcontext
from builder.records import store
from tests.unit.test_checks_image import _expect
from tests.unit.test_probes import run


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(into: Path, files: dict[str, bytes]) -> Path:
    """A real wheel of demo-pkg 1.0 holding ``files`` (paths as in the archive), with its RECORD."""
    info = "demo_pkg-1.0.dist-info"
    files = {
        **files,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: k3-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": b"[console_scripts]\ndemo-cli = demo_pkg:main\n",
    }
    record = "".join(f"{p},{_hash(d)},{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    whl = into / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", record)
    return whl


FILES = {
    "demo_pkg/__init__.py": b"def main():\n    return 0\n",
    "demo_pkg/data.json": b'{"k": 1}\n',
    "demo_pkg/__pycache__/__init__.cpython-311.pyc": b"wheel-shipped bytecode",
    "demo_pkg-1.0.data/purelib/demo_extra.py": b"X = 1\n",
    "demo_pkg-1.0.data/scripts/demo-tool": b"#!python\nprint('hi')\n",
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel directory, site-packages, prefix) after this machine's pip installed the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    (tmp / "wheels").mkdir()
    whl = _wheel(tmp / "wheels", FILES)
    prefix = tmp / "prefix"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "--prefix", str(prefix)]
        + ["--disable-pip-version-check", "--quiet", str(whl)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"pip could not install a local wheel here: {proc.stderr[-300:]}")
    site = next(prefix.glob("lib/python*/site-packages"))
    return tmp / "wheels", site, prefix


def _probe(site: Path, prefix: Path, wheels) -> dict:
    return run("installed", {"roots": [str(prefix)], "wheels": wheels}, {"PYTHONPATH": str(site)})


def test_the_recorded_digest_is_the_wheel_s_own_record(installed):
    wheels, _, _ = installed
    got = buildcontext.wheel_records(wheels)
    assert list(got) == ["demo-pkg"] and got["demo-pkg"]["version"] == "1.0"
    # purelib mapped into site-packages, scripts and the wheel's own bytecode left out, RECORD itself too
    lines = [
        f"demo_extra.py,{_hash(b'X = 1' + bytes([10]))},6",
        *(
            f"{p},{_hash(d)},{len(d)}"
            for p, d in sorted(FILES.items())
            if p.startswith("demo_pkg/") and "__py" not in p
        ),
        *(
            f"demo_pkg-1.0.dist-info/{n},{_hash(d)},{len(d)}"
            for n, d in (
                ("METADATA", b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n"),
                ("WHEEL", b"Wheel-Version: 1.0\nGenerator: k3-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
                ("entry_points.txt", b"[console_scripts]\ndemo-cli = demo_pkg:main\n"),
            )
        ),
    ]
    assert got["demo-pkg"]["entries"] == 6
    assert got["demo-pkg"]["sha256"] == hashlib.sha256("".join(sorted(x + "\n" for x in lines)).encode()).hexdigest()


def test_what_pip_installed_equals_the_wheel_and_what_it_added_is_counted(installed):
    wheels, site, prefix = installed
    found = _probe(site, prefix, buildcontext.wheel_records(wheels))
    assert found["problems"] == [] and found["wheel_checked"] == 1 and found["wheel_unmatched"] == 0
    # INSTALLER (+ REQUESTED, direct_url.json as this pip writes them); the rewritten script and the
    # generated console script live outside site-packages
    assert found["pip_added"]["metadata"] >= 1 and found["pip_added"]["outside"] == 2


def _rewrite_record(site: Path, rel: str, data: bytes) -> None:
    """Edit an installed file and re-hash its RECORD line to match: what a forger does."""
    (site / rel).write_bytes(data)
    record = site / "demo_pkg-1.0.dist-info" / "RECORD"
    rows = list(csv.reader(io.StringIO(record.read_text())))
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(
        [[r[0], _hash(data), str(len(data))] if r and r[0] == rel else r for r in rows]
    )
    record.write_text(out.getvalue())


def test_a_forged_record_fails_though_every_file_matches_it(installed, tmp_path):
    wheels, site, prefix = installed
    recorded = buildcontext.wheel_records(wheels)
    _rewrite_record(site, "demo_pkg/data.json", b'{"k": 2}\n')
    try:
        found = _probe(site, prefix, recorded)
        assert [p for p, _ in found["problems"]] == [f"{site}/demo_pkg-1.0.dist-info/RECORD"]
        assert "not the locked wheel's RECORD (demo-pkg 1.0): the build recorded 6 entries" in found["problems"][0][1]
        # without the recorded digests the forgery passes: the gap the record closes
        assert _probe(site, prefix, None)["problems"] == []
    finally:
        _rewrite_record(site, "demo_pkg/data.json", b'{"k": 1}\n')
    assert _probe(site, prefix, recorded)["problems"] == []


def test_a_wheel_of_another_version_or_an_unreadable_one(installed):
    wheels, site, prefix = installed
    other = {"demo-pkg": {**buildcontext.wheel_records(wheels)["demo-pkg"], "version": "2.0"}}
    found = _probe(site, prefix, other)
    assert found["problems"] == [] and found["wheel_unmatched"] == 1  # lock_contents judges the version
    broken = {"demo-pkg": {"version": "1.0", "error": "demo.whl: no readable RECORD"}}
    assert _probe(site, prefix, broken)["problems"] == [
        [
            f"{site}/demo_pkg-1.0.dist-info",
            "the build could not read the locked wheel's RECORD: demo.whl: no readable RECORD",
        ]
    ]


def test_a_wheel_that_is_no_zip_is_recorded_with_its_error(tmp_path):
    (tmp_path / "stand_in-2.0-py3-none-any.whl").write_bytes(b"not a zip")
    got = buildcontext.wheel_records(tmp_path)
    assert (
        list(got) == ["stand-in"]
        and got["stand-in"]["version"] == "2.0"
        and "no readable RECORD" in got["stand-in"]["error"]
    )


def test_the_record_keeps_wheel_records_and_refuses_the_wrong_type(tmp_path):
    base = dict(
        target="t", image="r/i@sha256:" + "a" * 64, digest="sha256:" + "a" * 64, bases={}, source={},
        lock_sha256="b", build_lock_sha256="c", dockerfile_sha256="d", source_date_epoch=1, input_key="e",
        tool_version="0", checks="passed", build={},
    )  # fmt: skip
    wheels = {"demo-pkg": {"version": "1.0", "entries": 6, "sha256": "f" * 64}}
    path = tmp_path / contract.RECORD_NAME
    path.write_text(store.Record(**base, wheel_records=wheels).to_json())
    assert store.read(path).wheel_records == wheels
    assert list(json.loads(path.read_text()))[-2:] == [contract.RECORD_WHEELS, "build"]
    path.write_text(store.Record(**base).to_json())
    assert store.read(path).wheel_records is None and contract.RECORD_WHEELS not in path.read_text()
    doc = json.loads(store.Record(**base, wheel_records=wheels).to_json())
    doc[contract.RECORD_WHEELS] = ["not", "a", "mapping"]
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception, match="wrong type: wheel_records"):
        store.read(path)


# --- package_files by content ---------------------------------------------------------------------


def _git_blob(path: Path) -> str:
    return subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()


def test_the_files_probe_names_each_file_by_its_git_blob_id(tmp_path):
    site = tmp_path / "site"
    (site / "demo_pkg-1.0.dist-info").mkdir(parents=True)
    (site / "demo_pkg-1.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
    (site / "demo_pkg/configs").mkdir(parents=True)
    (site / "demo_pkg/__init__.py").write_bytes(b"x = 1\n")
    (site / "demo_pkg/configs/E=8.json").write_bytes(b"{}\n")
    request = {"distribution": "demo-pkg", "package": "demo_pkg", "blobs": ["demo_pkg/__init__.py", "demo_pkg/gone.py"]}
    found = run("files", request, {"PYTHONPATH": str(site)})
    assert found["blobs"] == {"demo_pkg/__init__.py": _git_blob(site / "demo_pkg/__init__.py")}


class _FilesHost:
    def __init__(self, answer: dict) -> None:
        self.answer = answer

    def run(self, command, *args):
        assert args[0] == probes.script("files")
        answer = self.answer

        class Ran:
            rc, stderr = 0, ""
            stdout = probes.MARKER + json.dumps(answer) + "\n"

        return Ran()


def test_package_files_fails_on_a_file_whose_content_differs_and_a_waiver_passes_it():
    files = {"vllm/__init__.py": False, "vllm/envs.py": False}
    blobs = {"vllm/__init__.py": "a" * 40, "vllm/envs.py": "b" * 40}
    root = "/opt/k3/venv/lib/python3.12/site-packages/vllm"
    answer = {"root": root, "files": dict(files), "blobs": {**blobs, "vllm/envs.py": "c" * 40}}
    e = _expect(package_files=files, package_blobs=blobs)
    with pytest.raises(AssertionError, match=r"1 changed: .*/site-packages/vllm/envs.py: differs from the pinned"):
        checklist.test_package_files(_FilesHost(answer), e, print)
    shown: list[str] = []
    w = {"package_files": {"/opt/k3/*/vllm/envs.py": "patched on purpose (a reason)"}}
    import dataclasses

    checklist.test_package_files(_FilesHost(answer), dataclasses.replace(e, waivers=w), shown.append)
    assert shown == [
        f"package_files: {root}/envs.py: differs from the pinned commit's (git blob bbbbbbbbbbbb, installed "
        "cccccccccccc); waived (/opt/k3/*/vllm/envs.py): patched on purpose (a reason)"
    ]
    checklist.test_package_files(_FilesHost({**answer, "blobs": blobs}), e, print)


# --- python_trees: side effects, reported -----------------------------------------------------------


def test_the_trees_probe_reports_what_each_import_does_besides_importing(tmp_path):
    pkg = tmp_path / "noisy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # the audit event comes before the open: a write where nothing can be written is still seen
    out = "/k3-nowhere/written-at-import.txt"
    (pkg / "writes.py").write_text(f"try:\n    open({out!r}, 'w')\nexcept OSError:\n    pass\n")
    (pkg / "spawns.py").write_text("import subprocess\nsubprocess.run(['true'])\n")
    (pkg / "quiet.py").write_text("import json\nopen('/tmp/k3-ok-' + str(id(json)), 'w').close()\n")
    request = {"trees": ["noisy"], "skip": [], "setup": [], "timeout": 60}
    found = run("trees", request, {"PYTHONPATH": str(tmp_path)})
    assert found["imported"] == {"noisy": None, "noisy.quiet": None, "noisy.spawns": None, "noisy.writes": None}
    assert found["side_effects"]["noisy.writes"] == [["write", out]]
    assert found["side_effects"]["noisy.spawns"][0][0] == "subprocess"
    assert set(found["side_effects"]) == {"noisy.writes", "noisy.spawns"}  # /tmp is the app's to write
    (pkg / "sneaky.py").write_text("try:\n    open('/tmp/../k3-nowhere/x', 'a')\nexcept OSError:\n    pass\n")
    found = run("trees", request, {"PYTHONPATH": str(tmp_path)})
    assert found["side_effects"]["noisy.sneaky"] == [["write", "/k3-nowhere/x"]]  # normalized before judged


def test_python_trees_reports_side_effects_and_does_not_fail_on_them():
    answer = {
        "setup": {},
        "trees": {"vllm.x": None},
        "imported": {"vllm.x": None},
        "skipped": {},
        "side_effects": {"vllm.x": [["connect", "('10.0.0.1', 443)"]]},
    }

    class Host:
        def run(self, command, *args):
            class Ran:
                rc, stderr = 0, ""
                stdout = probes.MARKER + json.dumps(answer) + "\n"

            return Ran()

    shown: list[str] = []
    checklist.test_python_trees(Host(), _expect(python_trees=("vllm.x",)), shown.append)
    assert shown == ["python_trees: importing vllm.x made 1 side effect(s): connect ('10.0.0.1', 443)"]
