"""The whole-image checks (builder/checks/checklist_image.py) and their probes, on real artefacts
made here: dist-info trees with real hashes, shared objects from the C compiler, bytecode from
py_compile; each probe is run the way the checks run it (`python -c <script> <request>`) and
each shown failing on its own broken input. The waiver mechanism is tested through the checks."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from builder.checks import checklist_image, imagefiles, probes
from builder.checks import runner as checks
from builder.config import contract, waivers
from builder.engine.seam import ImageConfig
from builder.source import extensions
from tests.unit.test_probes import compile_so, run


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _dist(site: Path, name: str, files: dict[str, bytes], native: tuple[str, ...] = ()) -> Path:
    """A dist-info for ``files`` (written under site) with a RECORD as an installer writes it;
    the ``native`` ones keep their hashes in RECORD.native as the app's layers do."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines, moved = [f"{info.name}/METADATA,{_hash((info / 'METADATA').read_bytes())},"], []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        (moved if rel in native else lines).append(f"{rel},{_hash(data)},{len(data)}")
    lines += [f"{line.split(',')[0]},," for line in moved] + [f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("".join(x + "\n" for x in lines))
    if moved:
        (info / "RECORD.native").write_text("".join(x + "\n" for x in moved))
    return info


def test_installed_files_verifies_every_record_hash_and_owns_every_file(tmp_path):
    site = tmp_path / "lib/python3.12/site-packages"
    # a vendored dist-info (setuptools/_vendor/wheel-*.dist-info): its RECORD names files never installed here
    vendored = {"pkg/_vendor/wheel-1.0.dist-info/RECORD": b"../../bin/wheel,sha256=AAAA,1\n"}
    files = {"pkg/__init__.py": b"x = 1\n", "pkg/_c.so": b"\x7fELF native", **vendored}
    _dist(site, "pkg", files, native=("pkg/_c.so",))
    (site / "pkg/__pycache__").mkdir()
    (site / "pkg/__pycache__/__init__.cpython-312.pyc").write_bytes(b"bytecode is bytecode_matches'")
    request, env = {"roots": [str(tmp_path)]}, {"PYTHONPATH": str(site)}
    found = run("installed", request, env)
    assert found["vendored"] == 1
    assert found["dists"] == 1 and found["hashed"] == 4 and found["problems"] == []
    (site / "pkg/_c.so").write_bytes(b"\x7fELF patched")  # RECORD.native's hash is the one held
    (site / "pkg/__init__.py").unlink()
    (site / "evil.pth").write_text("import os\n")
    found = run("installed", request, env)
    assert sorted(found["problems"]) == [
        [f"{site}/evil.pth", "listed by no RECORD"],
        [f"{site}/pkg/__init__.py", f"missing (listed in {site}/pkg-1.0.dist-info/RECORD)"],
        [f"{site}/pkg/_c.so", "sha256 differs from pkg-1.0.dist-info/RECORD"],
    ]


def test_installed_files_holds_the_base_s_files_to_dpkg_md5sums(tmp_path):
    data = tmp_path / "usr/bin/tool"
    data.parent.mkdir(parents=True)
    data.write_bytes(b"#!/bin/sh\n")
    info = tmp_path / "info"
    info.mkdir()
    rel = str(data).lstrip("/")
    good = hashlib.md5(b"#!/bin/sh\n").hexdigest()  # noqa: S324 - dpkg's own md5sums
    (info / "tool.md5sums").write_text(f"{good}  {rel}\n{'0' * 32}  {rel}-gone\n")
    found = run("installed", {"roots": [], "dpkg_info": str(info)})
    assert (found["dpkg_checked"], found["dpkg_absent"], found["problems"]) == (1, 1, [])
    data.write_bytes(b"#!/bin/sh\nexit 3\n")
    found = run("installed", {"roots": [], "dpkg_info": str(info)})
    assert found["problems"] == [[str(data), "md5 differs from dpkg's record of tool"]]


def _loads(root: Path, env: dict | None = None) -> dict:
    request = {"roots": [str(root)], "driver_libraries": sorted(contract.DRIVER_LIBRARIES), "timeout": 60}
    return run("loads", request, env)


def test_everything_loads_binds_every_symbol_and_imports_every_extension(tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg/__init__.py").write_text("")
    good = compile_so(site / "pkg/libgood.so")
    # an undefined symbol: links (shared objects may leave symbols open), fails under LD_BIND_NOW
    src = tmp_path / "u.c"
    src.write_text("extern int k3_nowhere(void);\nint k3_use(void) { return k3_nowhere(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(site / "pkg/libopen.so"), str(src)], check=True)
    # an extension module that is no module (no PyInit_): imports fail
    ext = site / "pkg" / f"broken{_ext_suffix()}"
    compile_so(ext)
    # needs the driver: the one allowed gap
    stub = compile_so(tmp_path / "libcuda.so.1", soname="libcuda.so.1")
    compile_so(site / "pkg/libdrv.so", needs=(stub,))
    stub.unlink()
    # a library whose open symbol its dependent defines: bound in the dependent's load, as ld.so does
    src.write_text("extern int k3_from_parent(void);\nint k3_child(void) { return k3_from_parent(); }\n")
    child = site / "pkg/libchild.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libchild.so", "-o", str(child), str(src)], check=True)
    src.write_text("int k3_from_parent(void) { return 1; }\n")
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-o",
            str(site / "pkg/libparent.so"),
            str(src),
            "-Wl,--no-as-needed",
            str(child),
            "-Wl,-rpath,$ORIGIN",
        ],
        check=True,
    )
    found = _loads(site, {"PYTHONPATH": str(site)})
    failed = {Path(p).name: (m, err) for p, m, err in found["failed"]}
    assert set(failed) == {"libopen.so", ext.name}, found
    assert "undefined symbol: k3_nowhere" in failed["libopen.so"][1] and failed["libopen.so"][0] is None
    assert failed[ext.name][0] == "pkg.broken" and "PyInit_broken" in failed[ext.name][1]
    assert found["gaps"] == [[str(site / "pkg/libdrv.so"), "libcuda.so.1"]]
    assert good.exists() and (found["extensions"], found["shared"], found["covered"]) == (1, 4, 1)


def _ext_suffix() -> str:
    import importlib.machinery

    return importlib.machinery.EXTENSION_SUFFIXES[0]


def test_bytecode_must_be_checked_hash_equal_to_its_source_and_never_sourceless(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    mods = {name: pkg / f"{name}.py" for name in ("good", "stale", "timestamp", "unchecked")}
    for name, path in mods.items():
        path.write_text(f"NAME = {name!r}\n")
        mode = {
            "timestamp": py_compile.PycInvalidationMode.TIMESTAMP,
            "unchecked": py_compile.PycInvalidationMode.UNCHECKED_HASH,
        }.get(name, py_compile.PycInvalidationMode.CHECKED_HASH)
        py_compile.compile(str(path), invalidation_mode=mode, doraise=True)
    mods["stale"].write_text("NAME = 'patched'\n")
    (pkg / "ghost.pyc").write_bytes((pkg / "__pycache__" / f"good.{sys.implementation.cache_tag}.pyc").read_bytes())
    found = run("bytecode", {"roots": [str(tmp_path)]})
    problems = {Path(p).name.split(".")[0]: why for p, why in found["problems"]}
    assert problems == {
        "stale": "its hash differs from the source's (stale bytecode)",
        "timestamp": "timestamp-based, not checked hash-based",
        "unchecked": "unchecked hash-based, not checked hash-based",
        "ghost": "sourceless: imported in place of a missing source",
    }
    assert found["checked"] == 4


def test_least_privilege_finds_set_id_files_and_paths_the_user_can_write(tmp_path):
    root = tmp_path / "opt"
    (root / "bin").mkdir(parents=True)
    tool = root / "bin" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o4755)
    site = tmp_path / "site"
    site.mkdir()
    found = run("privilege", {"roots": [str(root)]}, {"PYTHONPATH": str(site)}, sys_path_under=tmp_path)
    assert found["setid"] == [[str(tool), "0o4755"]]
    # owned by the user running the probe (as the image's user runs it): it can chmod, so it can write
    assert [str(site), oct(site.stat().st_mode & 0o7777), os.getuid(), os.getgid()] in found["writable"]


def test_image_starts_resolves_the_entrypoint_and_runs_its_help(tmp_path, bare_python):
    ok = run("starts", {"argv": ["python3", "-c", "pass"], "help": ["-c", "pass", "--help"]}, python=bare_python)
    assert ok["entrypoint"]["error"] is None and ok["entrypoint"]["program"].endswith("python3")
    bad = run("starts", {"argv": ["python3"], "help": ["-c", "raise SystemExit(3)", "--help"]}, python=bare_python)
    assert "exited 3" in bad["entrypoint"]["error"]
    gone = run("starts", {"argv": ["k3-no-such-program"], "help": ["--help"]}, python=bare_python)
    assert "is not on PATH" in gone["entrypoint"]["error"]
    script = tmp_path / "tool"
    script.write_text("#!/opt/python/bin/python3.12\n")
    script.chmod(0o755)
    assert (
        "/opt/python/bin/python3.12, which is no executable"
        in run("starts", {"argv": [str(script)], "help": ["--help"]}, python=bare_python)["entrypoint"]["error"]
    )


def test_a_console_script_whose_entry_point_does_not_resolve_is_named(tmp_path, bare_python):
    site = tmp_path / "site"
    info = _dist(site, "tool", {"tool/__init__.py": b""})
    (info / "entry_points.txt").write_text("[console_scripts]\nk3-tool-x = tool.cli:main\n")
    found = run(
        "starts",
        {"argv": ["python3", "-c", "pass"], "help": ["-c", "pass"]},
        {"PYTHONPATH": str(site)},
        python=bare_python,
    )
    (path, entry), *_ = [(p, s) for p, s in found["scripts"].items() if p.endswith("/k3-tool-x")]
    assert entry["dist"] == "tool 1.0" and "does not exist" in entry["error"]


def test_loaded_reports_search_paths_that_dangle_or_shadow(tmp_path):
    root = tmp_path / "opt"
    (root / "lib").mkdir(parents=True)
    lib = compile_so(root / "lib" / "libk3x.so.1", soname="libk3x.so.1")
    other = tmp_path / "other"
    other.mkdir()
    (other / "libk3x.so.1").write_bytes(lib.read_bytes())
    env = {"LD_LIBRARY_PATH": f"{other}:/k3/nowhere", "LD_PRELOAD": "/k3/missing.so"}
    found = run("loaded", {"argv": [], "package": "", "roots": [str(root)], "env": env}, scan_root=tmp_path)
    paths = found["paths"]
    assert paths["LD_LIBRARY_PATH"][str(other)]["shadows"] == [f"libk3x.so.1 ({lib})"]
    assert paths["LD_LIBRARY_PATH"]["/k3/nowhere"]["exists"] is False
    assert paths["LD_PRELOAD"]["/k3/missing.so"]["exists"] is False


def test_hygiene_reads_rpath_and_runpath(tmp_path):
    root = tmp_path / "opt"
    (root / "lib").mkdir(parents=True)
    compile_so(root / "lib" / "libok.so", runpath="$ORIGIN")
    compile_so(root / "lib" / "libbuild.so", runpath="/build/venv/lib")
    compile_so(root / "lib" / "libgone.so", runpath="/usr/local/k3-nowhere/lib")
    compile_so(root / "lib" / "libpbs.so", runpath="/install/lib")
    found = run("hygiene", {"roots": [str(root)], "build_roots": list(contract.BUILD_ONLY_ROOTS)})
    named = {Path(p).name: why for p, _, why in found["named"]}
    assert named == {
        "libbuild.so": "DT_RUNPATH /build/venv/lib is under a build-only root",
        "libgone.so": "DT_RUNPATH /usr/local/k3-nowhere/lib does not exist in the image",
        "libpbs.so": "DT_RUNPATH /install/lib is under a build-only root",
    }


# --- the checks, their waivers ----------------------------------------------------------------------


class _Host:
    def __init__(self, answers: dict[str, dict]) -> None:
        self.answers = answers

    commands: list[str] = []

    def run(self, command, *args):
        self.commands.append(command)
        name = next(n for n in probes.IMAGE_NAMES if probes.script(n) == args[0])

        class Ran:
            rc, stderr = 0, ""
            stdout = probes.MARKER + json.dumps(self.answers[name]) + "\n"

        return Ran()


def _expect(**kw) -> checks.Expectations:
    import datetime as dt

    day = dt.date(2026, 12, 1)
    base = dict(
        target="t",
        cuda_version="12.9.1",
        modules=extensions.ModulePlan((), (), ()),
        ops=(),
        pins={},
        labels={},
        expires=day,
        build_date=day,
        today=day,
        warning_days=1,
        horizon_days=1,
        lock={},
        overrides=frozenset(),
        source_package=("vllm", "0.30.0"),
        package="vllm",
    )
    base.update(kw)
    return checks.Expectations(**base)


PRIV = {
    "uid": 2000,
    "gids": [2000],
    "setid": [["/opt/k3/bin/su", "0o4755"]],
    "writable": [],
    "caches": {"XDG_CACHE_HOME": ["/tmp/k3-cache", None]},
    "scanned": 9,
    "count": 1,
}


def test_a_waiver_is_the_only_way_past_a_finding_and_it_is_shown():
    host = _Host({"privilege": PRIV})
    with pytest.raises(AssertionError, match=r"found 1: /opt/k3/bin/su: set-id mode 0o4755"):
        checklist_image.test_least_privilege(host, _expect(), lambda m: None, imagefiles.ImageFiles())
    shown: list[str] = []
    w = {"least_privilege": {"/opt/k3/bin/s?": "a vendor's helper", "/opt/k3/old/*": "gone now"}}
    checklist_image.test_least_privilege(host, _expect(waivers=w), shown.append, imagefiles.ImageFiles())
    assert shown == [
        "least_privilege: /opt/k3/bin/su: set-id mode 0o4755; waived (/opt/k3/bin/s?): a vendor's helper",
        "least_privilege: waiver /opt/k3/old/* matched nothing: drop it from runtime.waivers.least_privilege",
    ]
    # a waiver of another check does not apply
    with pytest.raises(AssertionError):
        checklist_image.test_least_privilege(
            host, _expect(waivers={"bytecode_matches": w["least_privilege"]}), print, imagefiles.ImageFiles()
        )


def test_loaded_libraries_judges_every_copy_but_leaves_the_loaded_one_to_cuda_runtime():
    loaded = "/opt/k3/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
    answer = {
        "imports": {"vllm": None},
        "cudart": [loaded],
        "nccl": {"/n/libnccl.so.2": 22607},
        "copies": {loaded: 12080, "/usr/local/cuda-12.8/lib64/libcudart.so.12.8.90": 12080},
        "paths": {},
    }
    image = ImageConfig("r", "i", {}, {"PATH": "/bin"}, "2000", ("vllm", "serve"))
    e = _expect(pins={"nvidia-nccl-cu12": "2.26.7"})
    with pytest.raises(AssertionError) as info:
        checklist_image.test_loaded_libraries(_Host({"loaded": answer}), image, e, lambda m: None)
    assert "/usr/local/cuda-12.8/lib64/libcudart.so.12.8.90: reports 12080, expected 12090" in str(info.value)
    assert loaded not in str(info.value)
    answer["copies"].pop("/usr/local/cuda-12.8/lib64/libcudart.so.12.8.90")
    checklist_image.test_loaded_libraries(_Host({"loaded": answer}), image, e, lambda m: None)
    answer["nccl"] = {"/n/libnccl.so.2": 22507}
    with pytest.raises(AssertionError, match="reports NCCL 22507, expected 22607"):
        checklist_image.test_loaded_libraries(_Host({"loaded": answer}), image, e, lambda m: None)
    answer.update(nccl={}, cudart=[loaded, "/usr/local/cuda/lib64/libcudart.so.12.9.79"])
    with pytest.raises(AssertionError, match="2 libcudart mapped"):
        checklist_image.test_loaded_libraries(_Host({"loaded": answer}), image, e, lambda m: None)


def test_waivers_are_a_matrix_key_of_checks_and_path_patterns():
    from builder.config.schema import Runtime

    r = Runtime.model_validate({"waivers": {"everything_loads": {"/opt/k3/*/libfoo.so": "loaded only on ARM"}}})
    assert waivers.waived(r.waivers, "everything_loads", "/opt/k3/x/libfoo.so") == (
        "/opt/k3/*/libfoo.so",
        "loaded only on ARM",
    )
    assert waivers.waived(r.waivers, "least_privilege", "/opt/k3/x/libfoo.so") is None
    with pytest.raises(ValueError):
        Runtime.model_validate({"waivers": {"no_such_check": {"/x": "y"}}})
    assert set(waivers.WaivableCheck.__args__) <= set(contract.CHECKS)  # type: ignore[attr-defined]


def test_image_starts_runs_help_as_recipe_cli_does_and_names_what_does_not_start():
    ok = {"entrypoint": {"program": "/opt/k3/venv/bin/vllm", "error": None}, "scripts": {}}
    image = ImageConfig("r", "i", {}, {}, "2000", ("vllm", "serve"), ("--model", "m"))
    host = _Host({"starts": ok})
    e = _expect(recipe={"env": {"VLLM_TARGET_DEVICE": "cpu"}})
    checklist_image.test_image_starts(host, image, e, lambda m: None)
    assert "VLLM_TARGET_DEVICE=cpu " in host.commands[-1] and "LD_LIBRARY_PATH=" in host.commands[-1]
    broken = {
        "entrypoint": {"program": "/opt/k3/venv/bin/vllm", "error": "`vllm serve --help` exited 1: ImportError"},
        "scripts": {"/opt/k3/venv/bin/x": {"value": "x.cli:main", "dist": "x 1", "error": "ModuleNotFoundError: x"}},
    }
    with pytest.raises(AssertionError) as info:
        checklist_image.test_image_starts(_Host({"starts": broken}), image, e, lambda m: None)
    assert "/opt/k3/venv/bin/vllm: `vllm serve --help` exited 1" in str(info.value)
    assert "/opt/k3/venv/bin/x: x.cli:main (x 1): ModuleNotFoundError" in str(info.value)


def test_an_import_s_side_effects_are_reported_not_failed(tmp_path):
    import shutil
    import tempfile

    site = tmp_path / "site"
    (site / "noisy").mkdir(parents=True)
    outside = Path(tempfile.mkdtemp(prefix="k3-side-effect-", dir="/var/tmp"))  # writes under /tmp are fine
    out = outside / "state.txt"
    (site / "noisy/__init__.py").write_text(
        f"import subprocess\nopen({str(out)!r}, 'w').write('x')\nsubprocess.run(['true'])\n"
    )
    found = run(
        "loaded",
        {"argv": ["python", "-m", "noisy"], "package": "", "roots": [], "env": {}},
        {"PYTHONPATH": str(site)},
        scan_root=tmp_path,
    )
    assert found["imports"] == {"noisy": None}
    shutil.rmtree(outside)
    kinds = {kind: what for kind, what in found["side_effects"]}
    assert kinds["write"] == str(out) and "true" in kinds["subprocess"]
