"""The runtime's view of the image (issue 51; builder/checks/checklist_runtime.py and its rules in
runtimeview.py, startup.py, imageowners.py, layers.py), each rule at its edges, on file systems and
saved images written here as the engine writes them (tar streams with PAX records), read back by the
tool's own readers."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from builder.checks import checklist_runtime, imagefiles, imageowners, layers, runtimeview, startup
from builder.config.gpu import GpuCode
from builder.engine.buildx import ImageConfig
from tests.unit.test_checks_image import _expect

CAP = "\x01\x00\x00\x02\x00\x20\x00\x00"  # a vfs_cap_data v2 granting cap_net_bind_service (bit 10? any bits)
FLOOR = runtimeview.Driver("575.51.03", (12, 9))
# nvidia/cuda:12.9.1-runtime-ubuntu22.04's value (its Dockerfile on gitlab.com/nvidia/container-images/cuda)
CUDA_129 = (
    "cuda>=12.9 brand=unknown,driver>=535,driver<536 brand=grid,driver>=535,driver<536 "
    "brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536"
)


def _tar(members: list[tuple], out: io.BytesIO | None = None) -> io.BytesIO:
    """A tar of (path, kind, mode, uid, gid, data-or-link, pax) members, as an engine writes one."""
    out = out or io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, kind, mode, uid, gid, data, *pax in members:
            info = tarfile.TarInfo(path)
            info.mode, info.uid, info.gid = mode, uid, gid
            info.pax_headers = pax[0] if pax else {}
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


BASE = [
    ("/", "dir", 0o755, 0, 0, b""),
    ("/etc", "dir", 0o755, 0, 0, b""),
    ("/usr", "dir", 0o755, 0, 0, b""),
    ("/usr/bin", "dir", 0o755, 0, 0, b""),
    ("/tmp", "dir", 0o1777, 0, 0, b""),
    ("/home", "dir", 0o755, 0, 0, b""),
    ("/home/vllm", "dir", 0o755, 1000, 1000, b""),
    ("/etc/passwd", "file", 0o644, 0, 0, b"root:x:0:0:root:/root:/bin/sh\nvllm:x:1000:1000::/home/vllm:/bin/sh\n"),
    ("/etc/group", "file", 0o644, 0, 0, b"root:x:0:\nvllm:x:1000:\n"),
]


def _files(*extra: tuple) -> imagefiles.ImageFiles:
    return imagefiles.read(_tar([*BASE, *extra]), ("/opt/k3",))


# --- the NVIDIA container runtime's requirements ------------------------------------------------------


def test_the_cuda_base_s_requirement_holds_on_the_floor_and_newer():
    assert runtimeview.requirement(CUDA_129, FLOOR)[0] is True
    assert runtimeview.requirement_findings({"NVIDIA_REQUIRE_CUDA": CUDA_129}, FLOOR) == []


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("cuda>=12.9", True),  # equal holds
        ("cuda>12.9", False),
        ("cuda>=12.9.0", True),  # trailing zeros compare equal, as dsl_compare_version does
        ("cuda>=13.0", False),
        ("driver>=575.51.03", True),
        ("driver>=575.51.04", False),
        ("cuda>=13.0 driver>=575", True),  # a later alternative that holds satisfies it
        ("cuda>=12.0,driver>=580", False),  # every term of an alternative must hold
        ("cuda>=13.0 brand=tesla,driver>=575", None),  # only on Tesla-branded GPUs
        ("cuda>=13.0 arch>=9.0,driver>=575", None),
        ("CUDA>=12.9", True),  # names compare case-insensitively
        ("cuda=>12.9", False),  # no such operator: invalid expression
        ("foo>=1", False),
        ("cuda>=twelve", False),
        ("brand>=tesla", False),
        ("cuda>=13.0,foo>=1 cuda>=12.0", True),  # a false term ends its alternative: foo is never read
        ("cuda>=12.0,foo>=1", False),  # reached: invalid expression
        ("", True),
        # review: dsl.c's strsep and strcspn/strspn parsing at the edges
        (",", True),  # an alternative of no terms, first: ret is still its initial true
        ("cuda>=13.0 ,", False),  # after a false alternative it keeps that false: unsatisfied
        ("cuda>=13.0 brand=tesla ,", None),  # on Tesla GPUs the brand alternative holds first
        ("brand==tesla cuda>=12.0", False),  # '==' is no operator: invalid expression, not a brand term
        ("cuda>=.5", False),  # strtoumax reads no number at '.': invalid expression
        ("cuda<=18446744073709551615", False),  # UINTMAX_MAX: invalid expression
        ("brand==", False),  # '==' and no value, not brand '=' '='
        ("cuda>=12.0,", True),  # an empty term is skipped
        ("cuda>=", False),  # no value
        (">=12.0", False),  # no name
    ],
)
def test_requirements_are_alternatives_of_conjunctions_as_libnvidia_container_reads_them(text, ok):
    assert runtimeview.requirement(text, FLOOR)[0] is ok


def test_a_cuda_13_requirement_in_a_cu129_image_refuses_r575_hosts():
    found = runtimeview.requirement_findings({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0 " + CUDA_129.split(" ", 1)[1]}, FLOOR)
    assert [p for p, _ in found] == ["/config/Env/NVIDIA_REQUIRE_CUDA"]
    assert "refuses the driver floor 575.51.03 (CUDA 12.9)" in found[0][1]


def test_every_nvidia_require_variable_counts_and_an_upper_bound_refuses_newer_drivers():
    env = {"NVIDIA_REQUIRE_ARCH": "arch>=8.0", "NVIDIA_REQUIRE_DRIVER": "driver<580", "NVIDIA_REQUIRE_JETPACK": "x"}
    found = dict(runtimeview.requirement_findings(env, FLOOR))
    assert "accepts only some GPUs" in found["/config/Env/NVIDIA_REQUIRE_ARCH"]
    assert "refuses drivers newer than the floor" in found["/config/Env/NVIDIA_REQUIRE_DRIVER"]
    assert "/config/Env/NVIDIA_REQUIRE_JETPACK" not in found  # the toolkit does not hand it over
    # nor any variable that starts with its name (strings.HasPrefix)
    assert runtimeview.requirement_findings({"NVIDIA_REQUIRE_JETPACK_L4T": "cuda>=13.0"}, FLOOR) == []


def test_disable_require_and_legacy_images():
    assert (
        runtimeview.requirement_findings({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0", "NVIDIA_DISABLE_REQUIRE": "true"}, FLOOR)
        == []
    )
    found = runtimeview.requirement_findings(
        {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0", "NVIDIA_DISABLE_REQUIRE": "yes"}, FLOOR
    )
    assert {p for p, _ in found} == {"/config/Env/NVIDIA_REQUIRE_CUDA", "/config/Env/NVIDIA_DISABLE_REQUIRE"}
    # CUDA_VERSION without NVIDIA_REQUIRE_CUDA: the toolkit requires cuda>=MAJOR.MINOR
    assert runtimeview.requirement_findings({"CUDA_VERSION": "12.9.1"}, FLOOR) == []
    found = runtimeview.requirement_findings({"CUDA_VERSION": "13.0.1"}, FLOOR)
    assert found and "legacy" in found[0][1] and found[0][0] == "/config/Env/CUDA_VERSION"
    # Masterminds semver's NewVersion: a missing minor is 0 (cuda>=12.0); trailing junk is no version
    assert runtimeview.requirements({"CUDA_VERSION": "12"})["CUDA_VERSION"] == "cuda>=12.0"
    assert runtimeview.requirements({"CUDA_VERSION": "v12.9.1-rc1+b2"})["CUDA_VERSION"] == "cuda>=12.9"
    assert runtimeview.requirement_findings({"CUDA_VERSION": "12.9abc"}, FLOOR)


@pytest.mark.parametrize(
    ("value", "fails"),
    [
        (None, False),
        ("", False),
        ("all", False),
        ("compute,utility", False),
        ("utility,compute,video", False),
        ("utility", True),
        ("compute", True),
        ("graphics,video", True),
        # review: a word the toolkit does not support makes its hook panic (container_config.go
        # getDriverCapabilities: "unsupported capabilities found"), unless the list holds all
        ("compute,utility,foo", True),
        ("compute,utility,none", True),
        (" compute , utility ", False),
        ("all,foo", False),
        (" , ", True),  # set and not empty: no capability at all, not the default
    ],
)
def test_driver_capabilities_must_grant_compute_and_utility(value, fails):
    env = {} if value is None else {"NVIDIA_DRIVER_CAPABILITIES": value}
    assert bool(runtimeview.capability_findings(env)) is fails


@pytest.mark.parametrize(
    ("value", "fails"),
    [
        (None, False),
        ("all", False),
        ("0,1", False),
        ("GPU-4f1c0e0a-1b2c-4d5e-8f90-123456789abc", False),
        ("0:1", False),
        ("void", True),
        ("", True),
        ("none", True),
        ("0,void", True),
        ("gpu0;rm", True),
        ("nvidia.com/gpu=all", False),  # a CDI device name, which the toolkit takes (parser.IsQualifiedName)
        ("nvidia.com/gpu=0,nvidia.com/gpu=GPU-4f1c0e0a", False),
    ],
)
def test_visible_devices_must_name_gpus_where_the_config_sets_them(value, fails):
    env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    assert bool(runtimeview.visible_devices_findings(env)) is fails


def test_ld_library_path_never_puts_compat_or_another_cuda_first():
    files = _files(
        ("/usr/local", "dir", 0o755, 0, 0, b""),
        ("/usr/local/cuda-12.9", "dir", 0o755, 0, 0, b""),
        ("/usr/local/cuda-12.9/compat", "dir", 0o755, 0, 0, b""),
        ("/usr/local/cuda-12.9/lib64", "dir", 0o755, 0, 0, b""),
        ("/usr/local/cuda-12.9/lib64/libcudart.so.12", "file", 0o644, 0, 0, b"\x7fELF"),
        ("/usr/local/cuda", "link", 0o777, 0, 0, "cuda-12.9"),
        ("/usr/local/cuda-13.0", "dir", 0o755, 0, 0, b""),
        ("/usr/local/cuda-13.0/lib64", "dir", 0o755, 0, 0, b""),
        ("/opt/x", "dir", 0o755, 0, 0, b""),
        ("/opt/x/libcudart.so.13", "file", 0o644, 0, 0, b"\x7fELF"),
        ("/opt/fwd", "link", 0o777, 0, 0, "/usr/local/cuda/compat"),
    )

    def judge(value: str) -> list[str]:
        return [
            p
            for p, _ in runtimeview.library_path_findings(
                {"LD_LIBRARY_PATH": value}, files, "12.9", "/usr/local/cuda/compat"
            )
        ]

    assert judge("/usr/local/cuda/lib64:/usr/local/nvidia/lib64") == []
    assert judge("/usr/local/cuda/compat:/usr/local/cuda/lib64") == ["/usr/local/cuda/compat"]
    assert judge("/usr/local/cuda/compat/") == ["/usr/local/cuda/compat/"]
    assert judge("/opt/fwd") == ["/opt/fwd"]  # a link to the compat directory is the compat directory
    assert judge("/usr/local/cuda-13.0/lib64") == ["/usr/local/cuda-13.0/lib64"]
    assert judge("/opt/x") == ["/opt/x"]  # holds CUDA 13's libcudart
    assert judge("/opt/vendor/compat") == ["/opt/vendor/compat"]  # any directory named compat
    assert judge("/opt/vendor/compat/lib") == ["/opt/vendor/compat/lib"]


# --- interpreter options -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "value", "fails"),
    [
        ("PYTHONSTARTUP", "/opt/s.py", True),
        ("PYTHONINSPECT", "1", True),
        ("PYTHONHOME", "/opt/py", True),
        ("PYTHONUSERBASE", "/tmp/u", True),
        ("LD_PRELOAD", "/opt/libhook.so", True),
        ("LD_AUDIT", "/opt/libaudit.so", True),
        ("PYTHONWARNINGS", "error", True),
        ("PYTHONWARNINGS", "ignore,error::DeprecationWarning", True),
        ("PYTHONWARNINGS", "ignore::DeprecationWarning", False),
        ("PYTHONOPTIMIZE", "2", True),
        ("PYTHONDONTWRITEBYTECODE", "1", False),
        ("PYTHONUNBUFFERED", "1", False),
        ("PYTHONPATH", "/opt/extra", False),  # judged by loaded_libraries
        # review: CPython reads an empty variable as unset (_Py_GetEnv), and its integer flags by value
        ("PYTHONSTARTUP", "", False),
        ("LD_PRELOAD", "", False),
        ("PYTHONOPTIMIZE", "0", False),
        ("PYTHONINSPECT", "0", True),  # main.c pymain_repl: any non-empty value, read again at exit
        ("PYTHONOPTIMIZE", "-1", True),  # a negative or non-integer flag is 1
        ("PYTHONOPTIMIZE", "yes", True),
        ("PYTHONDEVMODE", "0", True),  # any non-empty value turns development mode on
    ],
)
def test_interpreter_options_that_change_what_runs_fail(var, value, fails):
    failed, shown = runtimeview.interpreter_findings({var: value}, imagefiles.ImageFiles())
    assert bool(failed) is fails
    assert failed or any(line.startswith(var) for line in shown)


def test_a_non_empty_ld_so_preload_fails_and_a_comment_does_not():
    comment = _files(("/etc/ld.so.preload", "file", 0o644, 0, 0, b"# nothing\n\n"))
    assert runtimeview.interpreter_findings({}, comment)[0] == []
    hooked = _files(("/etc/ld.so.preload", "file", 0o644, 0, 0, b"/usr/lib/libhook.so\n"))
    assert runtimeview.interpreter_findings({}, hooked)[0] == [
        ("/etc/ld.so.preload", "names /usr/lib/libhook.so: loaded into every process of the image")
    ]


# --- start-up hooks ------------------------------------------------------------------------------------

SITE = "/opt/k3/venv/lib/python3.12/site-packages"
SITE_DIRS = [
    ("/opt/k3", "dir", 0o755, 0, 0, b""),
    ("/opt/k3/venv/lib/python3.12", "dir", 0o755, 0, 0, b""),
    (SITE, "dir", 0o755, 0, 0, b""),
]


def test_pth_lines_starting_with_import_and_a_blank_are_hooks():
    assert startup.executable_lines(b"import os\nimport\tsys\n#import x\nimportlib\n /abs\nsub\n") == [
        "import os",
        "import\tsys",
    ]
    assert startup.executable_lines(b"\xef\xbb\xbfimport os\n") == ["import os"]  # a BOM is read past
    files = _files(
        *SITE_DIRS,
        (f"{SITE}/paths.pth", "file", 0o644, 0, 0, b"sub\n# import x\n"),
        (f"{SITE}/hook.pth", "file", 0o644, 0, 0, b"sub\nimport k3replay\n"),
        ("/srv/not-a-site-dir/x.pth", "file", 0o644, 0, 0, b"import os\n"),
    )
    found = startup.hooks(files)
    assert [(h.path, h.code) for h in found] == [(f"{SITE}/hook.pth", "import k3replay")]


def test_sitecustomize_and_usercustomize_on_sys_path_are_hooks():
    files = _files(
        *SITE_DIRS,
        (f"{SITE}/sitecustomize.py", "file", 0o644, 0, 0, b"print(1)\n"),
        (f"{SITE}/usercustomize", "dir", 0o755, 0, 0, b""),
        (f"{SITE}/usercustomize/__init__.py", "file", 0o644, 0, 0, b""),
        ("/opt/k3/venv/lib/python3.12/sitecustomize.cpython-312-x86_64-linux-gnu.so", "file", 0o644, 0, 0, b"\x7fELF"),
        ("/srv/extra", "dir", 0o755, 0, 0, b""),
        ("/srv/extra/sitecustomize.pyc", "file", 0o644, 0, 0, b"pyc"),
        ("/srv/other/sitecustomize.py", "file", 0o644, 0, 0, b"not on sys.path"),
        (f"{SITE}/pkg", "dir", 0o755, 0, 0, b""),
        (f"{SITE}/pkg/sitecustomize.py", "file", 0o644, 0, 0, b"a submodule, never imported as sitecustomize"),
    )
    paths = sorted(h.path for h in startup.hooks(files, "/srv/extra"))
    assert paths == sorted(
        [
            "/opt/k3/venv/lib/python3.12/sitecustomize.cpython-312-x86_64-linux-gnu.so",
            f"{SITE}/sitecustomize.py",
            f"{SITE}/usercustomize/__init__.py",
            "/srv/extra/sitecustomize.pyc",
        ]
    )


def test_a_hook_in_lib_dynload_counts_and_a_dangling_link_imports_nothing():
    files = _files(
        *SITE_DIRS,
        ("/opt/k3/venv/lib/python3.12/lib-dynload", "dir", 0o755, 0, 0, b""),
        ("/opt/k3/venv/lib/python3.12/lib-dynload/usercustomize.so", "file", 0o644, 0, 0, b"\x7fELF"),
        (f"{SITE}/sitecustomize.py", "link", 0o777, 0, 0, "/nowhere/sitecustomize.py"),
    )
    assert [h.path for h in startup.hooks(files)] == ["/opt/k3/venv/lib/python3.12/lib-dynload/usercustomize.so"]


# An OS package's hook, held to the pinned base's layers: tests/unit/test_startup_hooks.py.


# --- the runtime user ---------------------------------------------------------------------------------


def _user(user: str, env: dict[str, str], *extra: tuple) -> list[tuple[str, str]]:
    return imageowners.user_findings(_files(*extra), user, env)[0]


def test_the_runtime_user_resolves_with_a_writable_home_and_tmp():
    assert _user("vllm", {}) == []
    assert _user("1000:1000", {"HOME": "/home/vllm"}) == []
    assert _user("vllm:vllm", {}) == []
    assert [p for p, _ in _user("nobody", {})] == ["/etc/passwd"]  # runc: unable to find user
    assert [p for p, _ in _user("vllm:nogroup", {})] == ["/etc/group"]
    # The Env's HOME is the process's home (runc sets passwd's only when the Env has none): a writable
    # one that differs from passwd is shown, never failed; a root variant with HOME=/tmp passes this row.
    assert _user("vllm", {"HOME": "/tmp"}) == []
    notes = imageowners.user_findings(_files(), "vllm", {"HOME": "/tmp"})[1]
    assert any("HOME='/tmp'" in n and "/etc/passwd home" in n for n in notes)
    assert [p for p, _ in _user("vllm", {"HOME": "/nonexistent"})] == ["/nonexistent"]
    # a numeric uid without an entry: getpass and ~ need the Env (cu129: USER, LOGNAME, HOME=/tmp)
    assert _user("2000:2000", {"USER": "vllm", "HOME": "/tmp"}) == []
    # no USER/LOGNAME: getpass raises; no HOME: runc sets "/", which uid 2000 cannot write
    assert [p for p, _ in _user("2000:2000", {})] == ["/etc/passwd", "/"]
    no_root_entry = imagefiles.read(_tar(BASE[1:]), ("/opt/k3",))  # docker export writes no "/" member
    found = imageowners.user_findings(no_root_entry, "2000", {"USER": "u"})[0]
    assert found == [("/", "the home of uid 2000 is the root directory, not shown writable by it")]
    assert [p for p, _ in _user("2000", {"LOGNAME": "x", "HOME": "/home/vllm"})] == ["/home/vllm"]  # not its home


def test_root_writes_a_home_it_does_not_own():
    assert _user("root", {}, ("/root", "dir", 0o500, 1000, 1000, b"")) == []


def test_a_home_or_tmp_the_user_cannot_write_fails():
    locked = ("/tmp", "dir", 0o755, 0, 0, b"")  # overrides BASE's /tmp
    found = _user("vllm", {}, locked)
    assert [p for p, _ in found] == ["/tmp"] and "mode 0o755, owner 0:0" in found[0][1]
    assert [
        p
        for p, _ in _user(
            "vllm", {"HOME": "/etc"}, ("/etc/passwd", "file", 0o644, 0, 0, b"vllm:x:1000:1000::/etc:/bin/sh\n")
        )
    ] == ["/etc"]
    group_writable = ("/srv/home", "dir", 0o775, 0, 1000, b"")
    assert _user("2000:1000", {"USER": "u", "HOME": "/srv/home"}, group_writable) == []
    assert _user("0", {"HOME": "/root"}, ("/root", "dir", 0o700, 0, 0, b"")) == []  # root writes anywhere


# --- file capabilities and owners ----------------------------------------------------------------------


def test_file_capabilities_and_system_directories_not_owned_by_root_are_found():
    files = _files(
        ("/usr/bin/ping", "file", 0o755, 0, 0, b"x", {imagefiles.CAPABILITY_XATTR: CAP}),
        ("/usr/bin/tool", "file", 0o755, 1000, 0, b"x"),
        ("/usr/bin/link", "link", 0o777, 1000, 0, "tool"),
        ("/usr/lib", "dir", 0o755, 1000, 1000, b""),
        ("/usr/lib/x.so", "file", 0o644, 1000, 0, b"x"),  # only the directory itself is judged under lib
    )
    assert imageowners.capability_findings(files) == [
        (
            "/usr/bin/ping",
            "carries a file capability (security.capability " + CAP.encode("utf-8", "surrogateescape").hex() + ")",
        )
    ]
    assert imageowners.ownership_findings(files) == [
        ("/usr/lib", "owned by uid 1000, not root"),
        ("/usr/bin/tool", "owned by uid 1000, not root"),
    ]
    # the multiarch library directories (libc and most system libraries), the loader's configuration
    for lib in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/etc/ld.so.conf.d"):
        found = imageowners.ownership_findings(_files((lib, "dir", 0o755, 1000, 0, b"")))
        assert found == [(lib, "owned by uid 1000, not root")], lib


# --- layers: whiteouts and capabilities ------------------------------------------------------------------


def _saved(*layer_members: list[tuple], reverse: bool = False, oci_only: bool = False) -> io.BytesIO:
    """A `docker save` stream of layers (bottom first); blobs written in reverse when asked (the reader
    takes the manifest's order, not the stream's)."""
    blobs = [_tar(m).getvalue() for m in layer_members]
    names = ["blobs/sha256/" + hashlib.sha256(b).hexdigest() for b in blobs]
    config = json.dumps({"rootfs": {"diff_ids": []}}).encode()
    manifest = json.dumps({"layers": [{"digest": "sha256:" + n.rsplit("/", 1)[1]} for n in names]}).encode()
    mdigest = hashlib.sha256(manifest).hexdigest()
    docs = {"blobs/sha256/" + mdigest: manifest, "blobs/sha256/cfg": config}
    docs["index.json"] = json.dumps({"manifests": [{"digest": "sha256:" + mdigest}]}).encode()
    if not oci_only:
        docs["manifest.json"] = json.dumps([{"Config": "blobs/sha256/cfg", "Layers": names}]).encode()
    items = list(zip(names, blobs, strict=True))
    items = items[::-1] if reverse else items
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in [*items, *docs.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


LOWER = [
    ("bin", "dir", 0o755, 0, 0, b""),
    ("bin/ls", "file", 0o755, 0, 0, b"ls"),
    ("bin/ping", "file", 0o755, 0, 0, b"ping", {imagefiles.CAPABILITY_XATTR: CAP}),
    ("etc", "dir", 0o755, 0, 0, b""),
    ("etc/app", "dir", 0o755, 0, 0, b""),
    ("etc/app/a.conf", "file", 0o644, 0, 0, b"a"),
    ("var/lib/dpkg/info/coreutils:amd64.list", "file", 0o644, 0, 0, b"/.\n/bin\n/bin/ls\n"),
]


@pytest.mark.parametrize(("reverse", "oci_only"), [(False, False), (True, False), (True, True)])
def test_a_whiteout_of_an_os_package_s_file_is_named_with_its_package(reverse, oci_only):
    upper = [
        ("bin/.wh.ls", "file", 0o644, 0, 0, b""),
        ("etc/app/.wh..wh..opq", "file", 0o644, 0, 0, b""),
        ("etc/app/b.conf", "file", 0o644, 0, 0, b"b"),
        ("opt/.wh.never-there", "file", 0o644, 0, 0, b""),
    ]
    saved = layers.read(_saved(LOWER, upper, reverse=reverse, oci_only=oci_only))
    removed = saved.removed_base_files()
    assert [(p, pkg) for p, _, pkg in removed] == [("/bin/ls", "coreutils"), ("/etc/app/a.conf", "")]
    assert removed[0][1] == saved.ordered[1].digest


def test_a_merged_usr_root_s_package_files_are_matched_through_its_links():
    merged = [
        ("usr/bin", "dir", 0o755, 0, 0, b""),
        ("usr/bin/ls", "file", 0o755, 0, 0, b"ls"),
        ("bin", "link", 0o777, 0, 0, "usr/bin"),
        ("var/lib/dpkg/info/coreutils.list", "file", 0o644, 0, 0, b"/bin\n/bin/ls\n"),
    ]
    removed = layers.read(_saved(merged, [("usr/bin/.wh.ls", "file", 0o644, 0, 0, b"")])).removed_base_files()
    assert [(p, pkg) for p, _, pkg in removed] == [("/usr/bin/ls", "coreutils")]


def test_the_whiteouts_check_fails_for_package_files_and_shows_the_rest():
    upper = [("etc/app/.wh.a.conf", "file", 0o644, 0, 0, b"")]
    shown: list[str] = []
    checklist_runtime.test_base_whiteouts(_expect(), shown.append, layers.read(_saved(LOWER, upper)))
    assert shown and shown[0].startswith("base_whiteouts: /etc/app/a.conf: removed by layer sha256:")
    upper = [("bin/.wh.ls", "file", 0o644, 0, 0, b"")]
    with pytest.raises(AssertionError, match=r"/bin/ls: a file of the OS package coreutils"):
        checklist_runtime.test_base_whiteouts(_expect(), print, layers.read(_saved(LOWER, upper)))
    w = {"base_whiteouts": {"/bin/ls": "replaced by busybox on purpose"}}
    checklist_runtime.test_base_whiteouts(_expect(waivers=w), print, layers.read(_saved(LOWER, upper)))


def test_a_capability_in_any_layer_counts_unless_a_later_layer_replaces_or_removes_the_file():
    assert set(layers.read(_saved(LOWER)).capabilities()) == {"/bin/ping"}
    replaced = [("bin/ping", "file", 0o755, 0, 0, b"ping")]
    assert layers.read(_saved(LOWER, replaced)).capabilities() == {}
    removed = [("bin/.wh.ping", "file", 0o644, 0, 0, b"")]
    assert layers.read(_saved(LOWER, removed)).capabilities() == {}
    added = [("usr/bin/newcap", "file", 0o755, 0, 0, b"x", {imagefiles.CAPABILITY_XATTR: CAP})]
    assert set(layers.read(_saved(LOWER, added)).capabilities()) == {"/bin/ping", "/usr/bin/newcap"}


def test_a_saved_image_the_reader_cannot_trust_is_unreadable():
    with pytest.raises(imagefiles.UnreadableImage, match="a member named"):
        layers.read(_saved([("../escape", "file", 0o644, 0, 0, b"x")]))
    with pytest.raises(imagefiles.UnreadableImage):
        layers.read(io.BytesIO(b"not a tar at all" * 64))


def test_system_files_joins_the_exported_and_the_layer_reading():
    files = _files(("/usr/bin/tool", "file", 0o755, 1000, 0, b"x"))
    with pytest.raises(AssertionError) as info:
        checklist_runtime.test_system_files(_expect(), print, files, layers.read(_saved(LOWER)))
    assert "/bin/ping: carries a file capability" in str(info.value) and "/usr/bin/tool: owned by uid 1000" in str(
        info.value
    )


# --- the checks end to end on a config --------------------------------------------------------------------


def test_container_runtime_judges_the_config_against_the_matrix_floor():
    gpu = GpuCode.model_validate({"families": {"9.0": "H100"}, "driver_floor": "575.51.03"})
    env = {
        "NVIDIA_REQUIRE_CUDA": CUDA_129,
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    }
    image = ImageConfig("r", "i", {}, env, "1000", ())
    shown: list[str] = []
    checklist_runtime.test_container_runtime(image, _expect(gpu=gpu), shown.append, _files())
    assert any("NVIDIA_REQUIRE_CUDA" in s for s in shown)
    bad = ImageConfig("r", "i", {}, {**env, "NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}, "1000", ())
    with pytest.raises(
        AssertionError, match=r"/config/Env/NVIDIA_REQUIRE_CUDA: NVIDIA_REQUIRE_CUDA='cuda>=13.0' refuses"
    ):
        checklist_runtime.test_container_runtime(bad, _expect(gpu=gpu), print, _files())
    # an r580 floor (CUDA 13.0) accepts it; without a gpu block the floor is the CUDA's oldest driver
    later = GpuCode.model_validate({"families": {"9.0": "H100"}, "driver_floor": "580.65.06"})
    checklist_runtime.test_container_runtime(bad, _expect(gpu=later), print, _files())
    with pytest.raises(AssertionError):
        checklist_runtime.test_container_runtime(bad, _expect(), print, _files())
    waived = {"container_runtime": {"/config/Env/NVIDIA_REQUIRE_CUDA": "a CUDA 13 host only"}}
    checklist_runtime.test_container_runtime(bad, _expect(gpu=gpu, waivers=waived), print, _files())


def test_a_linked_pth_is_judged_by_its_target_s_bytes_and_an_unread_target_fails_closed():
    files = _files(
        *SITE_DIRS,
        ("/opt/k3/hooks", "dir", 0o755, 0, 0, b""),
        ("/opt/k3/hooks/real.pth", "file", 0o644, 0, 0, b"import os\n"),
        ("/opt/k3/hooks/data.txt", "file", 0o644, 0, 0, b"import os\n"),
        ("/opt/k3/hooks/paths.pth", "file", 0o644, 0, 0, b"/srv\n"),
        (f"{SITE}/a.pth", "link", 0o777, 0, 0, "/opt/k3/hooks/real.pth"),
        (f"{SITE}/b.pth", "link", 0o777, 0, 0, "/opt/k3/hooks/data.txt"),  # its text is not kept: fails closed
        (f"{SITE}/c.pth", "link", 0o777, 0, 0, "/opt/k3/hooks/paths.pth"),  # directories only: no hook
    )
    found = {h.path: h.code for h in startup.hooks(files)}
    assert found == {f"{SITE}/a.pth": "import os", f"{SITE}/b.pth": "(its target's bytes not read here)"}


def test_any_writer_s_form_of_the_capability_attribute_counts():
    files = _files(("/usr/bin/x", "file", 0o755, 0, 0, b"x", {"LIBARCHIVE.xattr.security.capability": "AQAAAg"}))
    assert [p for p, _ in imageowners.capability_findings(files)] == ["/usr/bin/x"]


def test_a_distroless_status_d_md5sums_names_its_package_s_files():
    lower = [
        ("usr/lib/libnuma.so.1", "file", 0o644, 0, 0, b"x"),
        ("var/lib/dpkg/status.d/libnuma1.md5sums", "file", 0o644, 0, 0, b"0" * 32 + b"  usr/lib/libnuma.so.1\n"),
    ]
    removed = layers.read(_saved(lower, [("usr/lib/.wh.libnuma.so.1", "file", 0o644, 0, 0, b"")])).removed_base_files()
    assert [(p, pkg) for p, _, pkg in removed] == [("/usr/lib/libnuma.so.1", "libnuma1")]


# --- hostile saved images (review): never a traceback, never unbounded ------------------------------------


def _outer(docs: dict[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in docs.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


@pytest.mark.parametrize(
    "docs",
    [
        {"manifest.json": json.dumps([{"Layers": [1, 2]}]).encode()},
        {"manifest.json": b"[" * 100_000 + b"]" * 100_000},
        {"index.json": json.dumps({"manifests": [{"digest": 5}]}).encode()},
        {
            "index.json": json.dumps({"manifests": [{"digest": "sha256:m"}]}).encode(),
            "blobs/sha256/m": json.dumps({"layers": [{"digest": 7}]}).encode(),
        },
    ],
)
def test_a_saved_image_whose_manifest_is_malformed_is_unreadable_not_a_crash(docs):
    with pytest.raises(imagefiles.UnreadableImage, match="layer order"):
        layers.read(_outer({"blobs/sha256/" + "a" * 64: _tar(LOWER).getvalue(), **docs}))


def _pax_member(name: str, pax_size: int) -> bytes:
    """A member preceded by a PAX header of ``pax_size`` bytes (one huge capability record)."""
    key = b" SCHILY.xattr.security.capability="
    body = b"a" * (pax_size - len(key) - 10)
    length = len(key) + len(body) + 1
    length += len(str(length + len(str(length))))
    record = str(length).encode() + key + body + b"\n"
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, len(record)
    member = tarfile.TarInfo(name)
    blocks = header.tobuf(tarfile.USTAR_FORMAT) + record + b"\0" * (-len(record) % 512)
    return blocks + member.tobuf(tarfile.USTAR_FORMAT) + b"\0" * 1024


def test_an_extended_header_past_the_bound_is_refused_before_it_is_read_whole():
    huge = _pax_member("bin/cap", imagefiles.MAX_HEADER + 1024)
    names = ["blobs/sha256/" + "b" * 64]
    stream = _outer({names[0]: huge, "manifest.json": json.dumps([{"Layers": names}]).encode()})
    with pytest.raises(imagefiles.UnreadableImage, match="extended header"):
        layers.read(stream)
    fine = _pax_member("bin/cap", 4096)
    stream = _outer({names[0]: fine, "manifest.json": json.dumps([{"Layers": names}]).encode()})
    assert list(layers.read(stream).capabilities()) == ["/bin/cap"]


def test_whiteouts_are_matched_by_ancestor_not_by_scanning_every_path():
    """A layer of many whiteouts over a base of many files: linear, not quadratic (20,000 x 20,000
    took 90 s); the same answers as the scan: a whiteout removes the path and what is under it, an
    opaque directory what is under it only, a name with '..' its parent."""
    many = [(f"d/f{i}", "file", 0o644, 0, 0, b"") for i in range(20_000)]
    whiteouts = [(f"e/.wh.g{i}", "file", 0o644, 0, 0, b"") for i in range(20_000)]
    whiteouts += [("d/.wh.f7", "file", 0o644, 0, 0, b"")]
    saved = layers.read(_saved(many, whiteouts))
    assert [p for p, _, _ in saved.removed_base_files()] == ["/d/f7"]
    lower = [("a", "dir", 0o755, 0, 0, b""), ("a/b", "dir", 0o755, 0, 0, b""), ("a/b/c", "file", 0o644, 0, 0, b"")]
    lower += [("x", "dir", 0o755, 0, 0, b""), ("x/y", "file", 0o644, 0, 0, b"")]
    opaque = [("a/.wh..wh..opq", "file", 0o644, 0, 0, b""), ("a/b", "dir", 0o755, 0, 0, b"")]
    assert [p for p, _, _ in layers.read(_saved(lower, opaque)).removed_base_files()] == ["/a/b/c"]
    parent = [("x/.wh...", "file", 0o644, 0, 0, b"")]
    assert [p for p, _, _ in layers.read(_saved(lower, parent)).removed_base_files()] == sorted(
        ["/a", "/a/b", "/a/b/c", "/x", "/x/y"]
    )
