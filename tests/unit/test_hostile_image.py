"""The checks' trust boundary (issue 49, builder/checks/boundary.py): an image may not decide its own
verdict. The probes run isolated (a .pth of the image never runs), and the rows the host can read
are held to the host's reading of the image's files, whatever the image's interpreter printed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import venv

import pytest

from builder.checks import boundary, checklist, checklist_gpu, checklist_image, imagefiles, probes
from builder.engine.containers import Ran
from tests.unit.test_checks import _EXT, FakeHost, _correct, _facts, _image, _module
from tests.unit.test_probes import probe_script

RANDOM = bytes.fromhex("7ac26d8449f74b59") + os.urandom(56)  # a compiled module overwritten with random bytes


def _replaying_host(files: imagefiles.ImageFiles) -> FakeHost:
    """A host whose probes answer like a correct image (the replay), over ``files`` as the host reads them."""
    host = FakeHost(probe=_facts())
    host.files = files
    return host


def _broken() -> imagefiles.ImageFiles:
    files = _correct()[3].files
    files.entries[_EXT] = _module(_EXT, RANDOM)
    return files


def test_a_random_bytes_module_fails_every_row_that_loads_it_whatever_the_probes_say():
    f, e, image, _ = _correct()
    host = _replaying_host(_broken())
    with pytest.raises(AssertionError, match="vllm._C_stable_libtorch: .* is not a loadable ELF shared object"):
        checklist.test_compiled_modules(f, e, host.files)
    with pytest.raises(AssertionError, match=r"not an ELF file: its bytes start 7ac26d8449f74b59 \(read on the host"):
        checklist.test_shared_libraries(host, image, e, lambda m: None, host.files)
    found = checklist_gpu.gpu_found.__wrapped__(host, image, e, host.files)
    with pytest.raises(AssertionError, match="not an ELF file"):
        checklist_gpu.test_gpu_code(found, e, image, lambda m: None, lambda k, v: None, host.files)
    with pytest.raises(AssertionError, match="not a loadable ELF shared object"):
        checklist_gpu.test_gpu_coverage(found, e, lambda m: None, lambda k, v: None, host.files)
    loads = {"gaps": [], "failed": [], "extensions": 1, "shared": 0, "covered": 0, "count": 0}
    host.probes["loads"] = loads
    with pytest.raises(AssertionError, match=f"{_EXT}: not an ELF file"):
        checklist_image.test_everything_loads(_LoadsHost(loads), e, lambda m: None, host.files)
    # the same answers over the correct image's files pass
    good = _correct()[3].files
    checklist.test_compiled_modules(f, e, good)
    checklist.test_shared_libraries(host, image, e, lambda m: None, good)
    checklist_image.test_everything_loads(_LoadsHost(loads), e, lambda m: None, good)


class _LoadsHost:
    def __init__(self, answer: dict) -> None:
        self.answer = answer

    def run(self, command, *args):
        assert args[0] == probes.script("loads") and f"{probes.PYTHON} -c" in command
        return Ran(0, probes.MARKER + json.dumps(self.answer) + "\n", "")


def test_a_required_module_with_no_file_under_the_prefix_never_imports():
    f, e, _, host = _correct()
    del host.files.entries[_EXT]
    with pytest.raises(AssertionError, match="vllm._C_stable_libtorch: no shared object for it under /opt/k3 "):
        checklist.test_compiled_modules(f, e, host.files)


def test_the_host_reads_the_user_and_set_id_files_itself():
    f, e, _, host = _correct()
    host.files.texts["/etc/passwd"] = b"vllm:x:0:0::/:/bin/sh\n"  # a name that is root
    with pytest.raises(AssertionError, match="found vllm, uid 0 in the image's /etc/passwd"):
        checklist.test_non_root(_image(user="vllm"), _facts(uid=2000), host.files)
    shell = "/opt/k3/venv/bin/rootsh"
    host.files.entries[shell] = imagefiles.Entry(shell, "file", 0o4755, 0, 0, 1000)
    clean = {"setid": [], "caches": {}, "writable": [], "uid": 1000, "gids": [1000], "scanned": 3, "count": 0}

    class Host:
        def run(self, command, *args):
            return Ran(0, probes.MARKER + json.dumps(clean) + "\n", "")

    with pytest.raises(AssertionError, match=f"{shell}: set-id mode 0o4755"):
        checklist_image.test_least_privilege(Host(), e, lambda m: None, host.files)


def test_the_elf_reading():
    so = bytes(_module("x").head)
    assert imagefiles.elf_problem(so, 62) is None and imagefiles.elf_problem(so, None) is None
    assert imagefiles.elf_problem(so, 183) == "an ELF file of machine 62, not the image's (183)"
    exe = so[:16] + b"\x02\x00" + so[18:]
    assert imagefiles.elf_problem(exe, None) == "not an ELF shared object (e_type 2)"
    assert imagefiles.elf_problem(b"", None) == "not an ELF file: its bytes start (empty)"
    assert imagefiles.elf_problem(b"\x7fELF\x09" + bytes(30), None) == "not a valid ELF file (class 9, data 0)"


def _tar(*members: tarfile.TarInfo, data: bytes = b"") -> io.BytesIO:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(data) if m.isreg() else None)
    raw.seek(0)
    return raw


def test_the_exported_stream_is_read_as_untrusted():
    bad = tarfile.TarInfo("opt/../../etc/passwd")
    with pytest.raises(imagefiles.UnreadableImage, match="a member named 'opt/../../etc/passwd'"):
        imagefiles.read(_tar(bad), ("/opt",))
    with pytest.raises(imagefiles.UnreadableImage, match="not a readable tar"):
        imagefiles.read(io.BytesIO(b"not a tar at all" * 100), ("/opt",))
    so = tarfile.TarInfo("./opt/lib/x.so.1")
    so.size = 100
    view = imagefiles.read(_tar(so, data=b"\x7fELF" + bytes(96)), ("/opt",))
    assert view.entries["/opt/lib/x.so.1"].head == (b"\x7fELF" + bytes(96))[: imagefiles.HEAD]
    outside = tarfile.TarInfo("usr/lib/y.so")
    outside.size = 100
    assert imagefiles.read(_tar(outside, data=bytes(100)), ("/opt",)).entries["/usr/lib/y.so"].head == b""


def test_too_many_members_are_refused(monkeypatch):
    monkeypatch.setattr(imagefiles, "MAX_MEMBERS", 2)
    with pytest.raises(imagefiles.UnreadableImage, match="more than 2 files"):
        imagefiles.read(_tar(*(tarfile.TarInfo(f"f{i}") for i in range(3))), ())


def test_a_probe_runs_isolated_no_pth_of_the_environment_runs(tmp_path):
    """A real venv with a .pth that would replay answers: the probe as the checks run it (-I -S)
    never runs it, yet imports from the venv's site-packages."""
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    site = next(env.glob("lib/python3*/site-packages"))
    (site / "replay.pth").write_text(f"import sys; sys.stdout.write({probes.MARKER!r} + '{{}}\\n')\n")
    (site / "sitecustomize.py").write_text("raise SystemExit('sitecustomize ran')\n")
    (site / "k3mod").mkdir()
    (site / "k3mod/__init__.py").write_text("")
    python = str(env / "bin" / "python")
    plain = subprocess.run([python, "-c", "print('plain')"], capture_output=True, text=True)
    assert plain.returncode != 0 and "sitecustomize ran" in plain.stderr  # the hooks are live without -I -S
    script = probe_script("facts", scan_root=tmp_path)
    request = {"modules": ["k3mod"], "ops": [], "absent": []}
    out = subprocess.run(
        [python, *probes.PYTHON.split()[1:], "-c", script, json.dumps(request)], capture_output=True, text=True
    )
    assert "sitecustomize ran" not in out.stderr
    assert out.stdout.count(probes.MARKER) == 1  # the .pth printed nothing
    found = probes.parse(out.stdout)
    assert found is not None and found["modules"] == {"k3mod": None}, out.stderr[-2000:]


def test_pip_check_runs_isolated_from_the_copy(tmp_path):
    pip_dir = tmp_path / "pip-path"
    pip_dir.mkdir()
    (pip_dir / "pip").mkdir()
    (pip_dir / "pip/__init__.py").write_text("")
    (pip_dir / "pip/__main__.py").write_text("import sys; print('pip', sys.argv[1:])\n")
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probes.pip_script(), str(pip_dir), "check", "--no-color"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "pip ['check', '--no-color']", out.stderr


def test_a_command_that_outlives_its_timeout_fails_its_check():
    class Seam:
        def exec(self, container_id, argv, timeout):
            assert argv[:2] == ["/bin/sh", "-c"] and argv[2] == "python -I -S -c 'a b' '{}'" and timeout == 7
            return Ran(None, "", "")

    host = boundary.ContainerHost(Seam(), "c", 7)  # type: ignore[arg-type]
    with pytest.raises(pytest.fail.Exception, match="to finish within 7 s, found it still running: killed"):
        host.run("python -I -S -c %s %s", "a b", "{}")


def test_the_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(boundary.TIMEOUT_ENV, "12.5")
    assert boundary.timeout() == 12.5
    for bad in ("", "x", "-3", "0"):
        monkeypatch.setenv(boundary.TIMEOUT_ENV, bad)
        assert boundary.timeout() == boundary.DEFAULT_TIMEOUT


def test_every_check_says_who_answers_it():
    from builder.config import contract

    assert set(boundary.BASIS) <= set(contract.CHECKS)
    assert {boundary.basis(c) for c in contract.CHECKS} == set(boundary.Basis)
    assert boundary.basis("recipe_cli") is boundary.Basis.IMAGE and boundary.basis("non_root") is boundary.Basis.HOST


def test_a_deleted_cuda_runtime_never_reports_a_version():
    """The facts probe replayed says libcudart reports 12.9; the host reads no such file."""
    f, e, image, host = _correct()
    checklist.test_cuda_runtime(f, e, image, host.files)
    (path,) = [p for p in f["libs"] if "libcudart" in p]
    del host.files.entries[path]
    with pytest.raises(AssertionError, match=f"{path}: no such file in the image"):
        checklist.test_cuda_runtime(f, e, image, host.files)
    host.files.entries[path] = _module(path, RANDOM)
    with pytest.raises(AssertionError, match="not an ELF file"):
        checklist.test_cuda_runtime(f, e, image, host.files)


def test_links_are_followed_on_the_listing():
    lib = "/usr/local/cuda/lib64"
    files = imagefiles.ImageFiles(
        {
            "/usr/local/cuda": imagefiles.Entry("/usr/local/cuda", "link", 0o777, 0, 0, 0, link="cuda-12.9"),
            "/usr/local/cuda-12.9/lib64/libcudart.so.12": _module("/usr/local/cuda-12.9/lib64/libcudart.so.12"),
            "/usr/local/cuda-12.9/lib64/loop": imagefiles.Entry("x", "link", 0o777, 0, 0, 0, link="loop"),
            "/usr/local/cuda-12.9/lib64/up": imagefiles.Entry(
                "x", "link", 0o777, 0, 0, 0, link="../lib64/libcudart.so.12"
            ),
        }
    )
    assert files.runtime_problem(f"{lib}/libcudart.so.12", None) is None
    assert files.runtime_problem(f"{lib}/up", None) is None
    assert files.runtime_problem(f"{lib}/loop", None) == "no such file in the image (read on the host)"
    assert files.runtime_problem(f"{lib}/libcudart.so.13", None) == "no such file in the image (read on the host)"


def test_a_cuda_runtime_anywhere_has_its_head_read():
    so = tarfile.TarInfo("usr/local/cuda-12.9/lib64/libcudart.so.12.9.79")
    so.size = 100
    other = tarfile.TarInfo("usr/lib/libz.so.1")
    other.size = 100
    view = imagefiles.read(_tar(so, other, data=b"\x7fELF" + bytes(96)), ("/opt",))
    assert view.entries["/usr/local/cuda-12.9/lib64/libcudart.so.12.9.79"].head.startswith(b"\x7fELF")
    assert view.entries["/usr/lib/libz.so.1"].head == b""  # outside the prefix: only runtimes are read


def _record_line(rel: str, data: bytes) -> str:
    import base64

    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}\n"


def _members(files: dict[str, bytes]) -> io.BytesIO:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw.seek(0)
    return raw


def test_every_record_hash_is_checked_again_on_the_host():
    site = "opt/k3/venv/lib/python3.12/site-packages"
    record = _record_line("pkg/__init__.py", b"x = 1\n") + _record_line("pkg/_c.so", b"\x7fELF good")
    record += (
        _record_line("pkg/gone.py", b"")
        + _record_line("../../../../../../usr/bin/tool", b"#!")
        + "pkg-1.0.dist-info/RECORD,,\n"
    )
    files = {
        f"{site}/pkg-1.0.dist-info/RECORD": record.encode(),
        f"{site}/pkg/__init__.py": b"x = 1\n",
        f"{site}/pkg/_c.so": b"\x7fELF patched",  # its RECORD line was not re-hashed
    }
    view = imagefiles.read(_members(files), ("/opt/k3/venv",))
    assert view.record_problems("/opt/k3/venv") == [
        (f"/{site}/pkg/_c.so", "sha256 differs from pkg-1.0.dist-info/RECORD (read on the host)"),
        (f"/{site}/pkg/gone.py", f"missing (listed in /{site}/pkg-1.0.dist-info/RECORD; read on the host)"),
    ]
    assert view.hashes[f"/{site}/pkg/__init__.py"] == hashlib.sha256(b"x = 1\n").hexdigest()
    # installed_files: the probe replayed clean, the host's reading fails it
    clean = {"problems": [], "dists": 1, "hashed": 3, "wheel_checked": 0, "dpkg_checked": 0, "count": 0}
    clean["pip_added"] = {"metadata": 0, "bytecode": 0, "outside": 0}

    class Host:
        def run(self, command, *args):
            return Ran(0, probes.MARKER + json.dumps(clean) + "\n", "")

    e = _correct()[1]
    with pytest.raises(AssertionError, match=r"found 2: .*_c\.so: sha256 differs .*read on the host"):
        checklist_image.test_installed_files(Host(), e, lambda m: None, view)


def test_gpu_code_the_host_could_not_read_fails_gpu_code_never_counts_as_none():
    """A file whose GPU code the host could not read (a truncated fatbin, over the spool cap, a hard
    link whose bytes were not read) has no derived floor: gpu_code names it and fails."""
    f, e, image, host = _correct()
    found = checklist_gpu.gpu_found.__wrapped__(host, image, e, host.files)
    checklist_gpu.test_gpu_code(found, e, image, lambda m: None, lambda k, v: None, host.files)
    host.files.gpu[_EXT] = "ValueError: fatbin entry runs past its section"
    found = checklist_gpu.gpu_found.__wrapped__(host, image, e, host.files)
    assert found["errors"] == {_EXT: "ValueError: fatbin entry runs past its section"}
    with pytest.raises(AssertionError, match=f"{_EXT}: GPU code unread on the host: ValueError: fatbin entry"):
        checklist_gpu.test_gpu_code(found, e, image, lambda m: None, lambda k, v: None, host.files)
