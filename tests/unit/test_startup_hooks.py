"""Start-up hooks held to the pinned base (issue 51; builder/checks/startup.py, the layer reading in
layers.py, the base's layers in boundary.base_layers): an OS package's hook passes only when the
pinned runtime base's layers wrote it (and its bytecode), whatever the image's dpkg record says.

Each case is an image made here as the engine saves one: layer tars (bottom first), the saved
stream of them with its config's diff_ids, and the merged file system an export gives."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from builder.checks import boundary, checklist_runtime, imagefiles, layers, startup
from builder.engine.buildx import ImageConfig
from builder.errors import BuildError
from tests.unit.fakeengine import FakeEngine, two_platform_base
from tests.unit.test_checks_image import _expect
from tests.unit.test_runtime_view import _tar

HOOK = "usr/lib/python3.11/sitecustomize.py"
TARGET = "etc/python3.11/sitecustomize.py"
PYC = "usr/lib/python3.11/__pycache__/sitecustomize.cpython-311.pyc"
APPORT = (
    b"try:\n    import apport_python_hook\nexcept ImportError:\n    pass\nelse:\n    apport_python_hook.install()\n"
)
EVIL = b"import k3replay\n"
REGISTRY = "registry.test:5000"
IMAGE = ImageConfig("r", "i", {}, {}, "1000", ())


def _status(hook: bytes) -> bytes:
    md5 = hashlib.md5(hook).hexdigest()
    return f"Package: libpython3.11-minimal\nConffiles:\n /etc/python3.11/sitecustomize.py {md5}\n".encode()


BASE_LAYER = [
    ("etc", "dir", 0o755, 0, 0, b""),
    ("etc/python3.11", "dir", 0o755, 0, 0, b""),
    (TARGET, "file", 0o644, 0, 0, APPORT),
    ("usr", "dir", 0o755, 0, 0, b""),
    ("usr/lib", "dir", 0o755, 0, 0, b""),
    ("usr/lib/python3.11", "dir", 0o755, 0, 0, b""),
    (HOOK, "link", 0o777, 0, 0, "/etc/python3.11/sitecustomize.py"),
    ("var/lib/dpkg/status", "file", 0o644, 0, 0, _status(APPORT)),
]
APP_LAYER = [("opt", "dir", 0o755, 0, 0, b""), ("opt/k3", "dir", 0o755, 0, 0, b"")]
# What a later layer writes to plant a hook that dpkg's record vouches for: the hook and the md5.
REWRITE = [
    (TARGET, "file", 0o644, 0, 0, APPORT + EVIL),
    ("var/lib/dpkg/status", "file", 0o644, 0, 0, _status(APPORT + EVIL)),
]
PYCACHE = [("usr/lib/python3.11/__pycache__", "dir", 0o755, 0, 0, b"")]
PLANTED_PYC = [*PYCACHE, (PYC, "file", 0o644, 0, 0, b"\xa7\r\r\n\x01\0\0\0" + b"\0" * 8)]  # unchecked hash-based


class Image:
    """An image of ``stack`` (layer member lists, bottom first), the first ``base`` of them the pinned
    base's: its saved layers (gzip blobs, as a containerd store saves them: named by the compressed
    digest, the config's diff_ids naming the uncompressed), its exported files, the base record."""

    def __init__(self, *stack: list[tuple], base: int = 1) -> None:
        plain = [_tar(members).getvalue() for members in stack]
        self.diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in plain]
        blobs = [gzip.compress(b, mtime=0) for b in plain]
        names = ["blobs/sha256/" + hashlib.sha256(b).hexdigest() for b in blobs]
        config = json.dumps({"architecture": "amd64", "rootfs": {"type": "layers", "diff_ids": self.diff_ids}})
        docs = {"blobs/sha256/cfg": config.encode()}
        docs["manifest.json"] = json.dumps([{"Config": "blobs/sha256/cfg", "Layers": names}]).encode()
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for name, data in [*zip(names, blobs, strict=True), *docs.items()]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        out.seek(0)
        self.layers = layers.read(out)
        merged = {m[0]: m for members in stack for m in members}  # a later layer's entry replaces a lower one's
        self.files = imagefiles.read(_tar(list(merged.values())), ("/opt/k3",))
        self.base = layers.PinnedBase("reg/base@sha256:b", tuple(self.diff_ids[:base]))

    def check(self, waivers: dict | None = None, base: layers.PinnedBase | None = None) -> list[str]:
        shown: list[str] = []
        expect = _expect(waivers={"startup_hooks": waivers} if waivers else {})
        checklist_runtime.test_startup_hooks(IMAGE, expect, shown.append, self.files, self.layers, base or self.base)
        return shown


def test_the_base_s_own_hook_with_dpkg_s_md5_is_shown_not_failed():
    shown = Image(BASE_LAYER, APP_LAYER).check()
    assert shown == [
        "startup_hooks: /usr/lib/python3.11/sitecustomize.py -> /etc/python3.11/sitecustomize.py: an OS "
        "package's file, with dpkg's md5 (read on the host), written by the pinned base's layers"
    ]


def test_a_hook_and_its_md5_rewritten_by_a_later_layer_fails():
    """The review's gap: the md5 is the image's own record; the later layer rewrote both."""
    image = Image(BASE_LAYER, APP_LAYER, REWRITE)
    assert startup.from_os_package(image.files, startup.hooks(image.files)[0], startup.dpkg_md5(image.files))
    with pytest.raises(AssertionError) as failed:
        image.check()
    assert "/usr/lib/python3.11/sitecustomize.py: sitecustomize: dpkg's md5 matches (the image's own record), but " in (
        str(failed.value)
    )
    assert "/etc/python3.11/sitecustomize.py is written by layer 3 of 3 (" + image.diff_ids[2][:19] in str(failed.value)
    image.check(waivers={"/usr/lib/python3.11/sitecustomize.py": "ours, reviewed"})  # named: shown, passes


def test_the_link_to_the_hook_rewritten_by_a_later_layer_fails():
    """Both files the base's, each with dpkg's md5, but the link a later layer's: it chose what runs."""
    md5sums = hashlib.md5(APPORT).hexdigest().encode() + b"  opt/x/sitecustomize.py\n"
    base = [*BASE_LAYER, ("opt/x/sitecustomize.py", "file", 0o644, 0, 0, APPORT)]
    base.append(("var/lib/dpkg/info/x.md5sums", "file", 0o644, 0, 0, md5sums))
    relinked = [(HOOK, "link", 0o777, 0, 0, "/opt/x/sitecustomize.py")]
    with pytest.raises(AssertionError, match="/usr/lib/python3.11/sitecustomize.py is written by layer 2 of 2"):
        Image(base, relinked).check()
    assert Image(base, APP_LAYER).check()  # the same files, the link the base's: shown, passes


def test_bytecode_a_later_layer_writes_beside_the_base_s_hook_fails_like_the_hook():
    image = Image(BASE_LAYER, PLANTED_PYC)
    with pytest.raises(AssertionError) as failed:
        image.check()
    assert (
        f"/{PYC}: bytecode Python may run instead of /usr/lib/python3.11/sitecustomize.py: /{PYC} is written by layer 2 of 2"
        in str(failed.value)
    )
    # waiving the hook does not waive the bytecode: the pyc runs, not the source that was waived
    with pytest.raises(AssertionError, match="sitecustomize.cpython-311.pyc"):
        image.check(waivers={"/usr/lib/python3.11/sitecustomize.py": "the base's"})
    shown = Image([*BASE_LAYER, *PLANTED_PYC], APP_LAYER).check()  # the base's own bytecode: shown
    assert f"startup_hooks: /{PYC}: bytecode Python may run instead of /{HOOK}, the pinned base's" in shown


def test_bytecode_is_every_pyc_of_the_module_in_its_cache_and_through_a_cache_link():
    cached = [
        *PYCACHE,
        *[
            (f"usr/lib/python3.11/__pycache__/{n}", "file", 0o644, 0, 0, b"")
            for n in (
                "sitecustomize.cpython-311.pyc",
                "sitecustomize.cpython-311.opt-1.pyc",
                "sitecustomize.cpython-312.pyc",
                "usercustomize.cpython-311.pyc",
                "sitecustomize.py",
            )
        ],
    ]
    image = Image([*BASE_LAYER, *cached])
    hook = startup.hooks(image.files)[0]
    assert startup.bytecode(image.files, hook) == [
        "/usr/lib/python3.11/__pycache__/sitecustomize.cpython-311.opt-1.pyc",
        "/usr/lib/python3.11/__pycache__/sitecustomize.cpython-311.pyc",
        "/usr/lib/python3.11/__pycache__/sitecustomize.cpython-312.pyc",
    ]
    linked = [("usr/lib/python3.11/__pycache__", "link", 0o777, 0, 0, "/tmp/c"), ("tmp", "dir", 0o1777, 0, 0, b"")]
    linked += [("tmp/c", "dir", 0o777, 0, 0, b""), ("tmp/c/sitecustomize.cpython-311.pyc", "file", 0o644, 0, 0, b"")]
    image = Image(BASE_LAYER, linked)
    assert startup.bytecode(image.files, startup.hooks(image.files)[0]) == [
        "/usr/lib/python3.11/__pycache__",
        "/tmp/c/sitecustomize.cpython-311.pyc",
    ]
    with pytest.raises(AssertionError, match="/usr/lib/python3.11/__pycache__: bytecode"):
        image.check()


def test_an_unread_base_or_an_image_not_built_on_it_fails_the_os_package_s_hook_saying_why():
    image = Image(BASE_LAYER, APP_LAYER)
    unread = layers.PinnedBase("reg/base@sha256:b", unread="reg/base@sha256:b not read: registry out of reach")
    with pytest.raises(
        AssertionError, match=r"layers were not read \(reg/base@sha256:b not read: registry out of reach\)"
    ):
        image.check(base=unread)
    other = layers.PinnedBase("reg/other@sha256:o", ("sha256:" + "0" * 64,))
    with pytest.raises(
        AssertionError, match="are not the pinned runtime base reg/other@sha256:o's: it is not built on it"
    ):
        image.check(base=other)
    assert image.layers.base_count(image.base) == 1


def test_the_saved_config_s_diff_ids_name_the_layers_whatever_the_blobs_are_named():
    image = Image(BASE_LAYER, APP_LAYER)
    assert [layer.diff_id for layer in image.layers.ordered] == image.diff_ids
    assert all(layer.digest != layer.diff_id for layer in image.layers.ordered)  # gzip blobs
    assert image.layers.last_writer("/etc/python3.11/sitecustomize.py") == 0
    assert image.layers.last_writer("/opt/k3") == 1
    assert image.layers.last_writer("/nowhere") is None


def test_the_base_s_layers_come_from_its_registry_for_the_platform_or_say_why_not():
    engine = FakeEngine()
    name = f"{REGISTRY}/k3/base-index"
    digest = two_platform_base(engine, name)
    assert boundary.base_layers(engine, f"{name}@{digest}", "linux/arm64").diff_ids == ("sha256:arm64",)
    missing = boundary.base_layers(engine, f"{name}@sha256:{'0' * 64}", "linux/amd64")
    assert missing.diff_ids == () and "its registry has no" in missing.unread
    local = boundary.base_layers(engine, "nvidia/cuda@sha256:" + "1" * 64, "linux/amd64")
    assert local.diff_ids == () and local.unread.startswith("nvidia/cuda@sha256:111")
    assert "pins no runtime base" in boundary.base_layers(engine, "", "linux/amd64").unread


def test_a_changed_hook_whose_md5_was_left_fails_even_when_the_base_wrote_it():
    """dpkg's md5 stays a condition beside the layer: the base's own hook, edited, is no package's file."""
    edited = [(TARGET, "file", 0o644, 0, 0, APPORT + EVIL) if m[0] == TARGET else m for m in BASE_LAYER]
    with pytest.raises(AssertionError, match=r"/usr/lib/python3.11/sitecustomize.py: sitecustomize$"):
        Image(edited, APP_LAYER).check()


def test_a_hook_linked_to_another_module_an_os_package_owns_is_not_that_package_s_hook():
    """A sitecustomize that links to some other file dpkg lists with its md5 (a module with side effects
    at import) runs that module at every start: the md5 says the file is the package's, not that the
    package made it a hook. Only a link to a file of a hook's name passes (the host keeps only those
    files' bytes: imagefiles.HOOK_TEXT), so this one fails, even all in the base (a review's guard)."""
    other = b"import os\nos.environ['LD_PRELOAD'] = '/tmp/x.so'\n"
    sums = f"{hashlib.md5(other).hexdigest()}  usr/lib/python3/dist-packages/tool/setup_env.py\n".encode()
    site = "usr/lib/python3.11/site-packages"
    base = [("usr", "dir", 0o755, 0, 0, b""), ("usr/lib", "dir", 0o755, 0, 0, b""), (site, "dir", 0o755, 0, 0, b"")]
    base.append((f"{site}/sitecustomize.py", "link", 0o777, 0, 0, "/usr/lib/python3/dist-packages/tool/setup_env.py"))
    base.append(("usr/lib/python3/dist-packages/tool/setup_env.py", "file", 0o644, 0, 0, other))
    base.append(("var/lib/dpkg/info/tool.md5sums", "file", 0o644, 0, 0, sums))
    with pytest.raises(AssertionError, match=r"site-packages/sitecustomize.py: sitecustomize$"):
        Image(base).check()


class _Inspecting:
    """An engine whose local store holds one image, answered as `docker image inspect` prints it."""

    def __init__(self, arch: str) -> None:
        self.arch = arch

    def image_inspect(self, ref: str) -> str:
        if not ref.startswith("nvidia/cuda@"):
            raise BuildError(f"Error response from daemon: No such image: {ref}")
        return json.dumps(
            [{"Architecture": self.arch, "RootFS": {"Type": "layers", "Layers": ["sha256:a", "sha256:b"]}}]
        )


def test_a_base_named_without_a_registry_host_is_read_from_the_local_engine_never_pulled():
    ref = "nvidia/cuda@sha256:" + "1" * 64
    assert boundary.base_layers(_Inspecting("amd64"), ref, "linux/amd64").diff_ids == ("sha256:a", "sha256:b")
    other = boundary.base_layers(_Inspecting("arm64"), ref, "linux/amd64")
    assert other.diff_ids == () and other.unread == f"the local engine's {ref} is for linux/arm64, not linux/amd64"
    absent = boundary.base_layers(_Inspecting("amd64"), "ubuntu@sha256:" + "2" * 64, "linux/amd64")
    assert absent.diff_ids == () and "No such image" in absent.unread


def test_bytecode_a_later_layer_names_through_a_directory_link_fails_like_one_written_in_place():
    """A later layer's entry lib/python3.11/__pycache__/... of a merged-/usr base (/lib -> usr/lib)
    lands, in an applier that follows the lower layers' directory links, on the base's pyc under
    /usr/lib: the export shows the base's path, which no later entry names literally."""
    base = [("lib", "link", 0o777, 0, 0, "usr/lib"), *BASE_LAYER, *PLANTED_PYC]
    planted = [(PYC.replace("usr/lib/", "lib/", 1), "file", 0o644, 0, 0, PLANTED_PYC[-1][-1])]
    image = Image(base, planted)
    image.files = Image(base).files  # the merged file system: the pyc at /usr/lib/..., the link kept
    with pytest.raises(
        AssertionError, match=f"/{PYC}: bytecode Python may run instead of /{HOOK}: /{PYC} is written by layer 2 of 2"
    ):
        image.check()
    assert image.layers.last_writer(f"/{PYC}") == 1 and image.layers.last_writer(f"/{HOOK}") == 0


def test_a_hook_in_a_directory_reached_through_a_link_is_found_at_the_path_python_opens():
    """site.py reads the .pth files of a site directory that is a link, and imports sitecustomize
    from it or from a PYTHONPATH entry that is a link: the files sit where the link leads."""
    site = "usr/lib/python3.11/site-packages"
    members = [("usr", "dir", 0o755, 0, 0, b""), ("usr/lib", "dir", 0o755, 0, 0, b"")]
    members += [("usr/lib/python3.11", "dir", 0o755, 0, 0, b""), (site, "link", 0o777, 0, 0, "/opt/other")]
    members += [("opt", "dir", 0o755, 0, 0, b""), ("opt/other", "dir", 0o755, 0, 0, b"")]
    members += [("opt/other/k3.pth", "file", 0o644, 0, 0, b"import os\n")]
    members += [("opt/other/sitecustomize.py", "file", 0o644, 0, 0, b"import os\n")]
    members += [("opt/pp", "link", 0o777, 0, 0, "other2"), ("opt/other2", "dir", 0o755, 0, 0, b"")]
    members += [("opt/other2/usercustomize.py", "file", 0o644, 0, 0, b"import os\n")]
    members += [("opt/k3", "dir", 0o755, 0, 0, b""), ("opt/k3/site-packages", "link", 0o777, 0, 0, "/opt/other")]
    files = imagefiles.read(_tar(members), ("/opt/k3",))
    assert [h.path for h in startup.hooks(files, "/opt/pp")] == [
        "/opt/k3/site-packages/k3.pth",  # one directory under two names: searched once, by the first
        "/opt/k3/site-packages/sitecustomize.py",
        "/opt/pp/usercustomize.py",
    ]
    real = "usr/lib/python3.12/site-packages"  # a site directory of its own name, also reached by a link
    members += [("usr/lib/python3.12", "dir", 0o755, 0, 0, b""), (real, "dir", 0o755, 0, 0, b"")]
    members += [(f"{real}/d.pth", "file", 0o644, 0, 0, b"import d\n"), ("aa", "dir", 0o755, 0, 0, b"")]
    members += [("aa/site-packages", "link", 0o777, 0, 0, f"/{real}")]
    files = imagefiles.read(_tar(members), ("/opt/k3",))
    assert f"/{real}/d.pth" in [h.path for h in startup.hooks(files)]  # by its own name: a waiver of it holds


# --- what the base's own hooks import (issue 51, review): the hook unchanged, its import planted ---
STDLIB_DIRS = [
    ("usr/lib/python3.11/lib-dynload", "dir", 0o755, 0, 0, b""),
    ("usr/lib/python3", "dir", 0o755, 0, 0, b""),
    ("usr/lib/python3/dist-packages", "dir", 0o755, 0, 0, b""),
]


@pytest.mark.parametrize(
    "planted",
    [
        "usr/lib/python3.11/apport_python_hook.py",  # the standard library directory
        "usr/lib/python3.11/lib-dynload/apport_python_hook.cpython-311-x86_64-linux-gnu.so",
        "usr/lib/python3/dist-packages/apport_python_hook.py",  # Debian's, on the system python's path
        "usr/lib/python3.11/encodings/k3.py",  # a package's module: imported by whoever imports it
    ],
)
def test_a_module_the_base_s_hook_imports_planted_by_a_later_layer_fails(planted):
    """Debian's sitecustomize, unchanged and the base's, imports apport_python_hook when it exists:
    a later layer that adds one runs it before every program of that interpreter."""
    extra = [("usr/lib/python3.11/encodings", "dir", 0o755, 0, 0, b"")] if "encodings" in planted else []
    image = Image([*BASE_LAYER, *STDLIB_DIRS, *extra], APP_LAYER, [(planted, "file", 0o644, 0, 0, EVIL)])
    with pytest.raises(AssertionError) as failed:
        image.check()
    assert f"/{planted}: a file the base's start-up hooks can import, written by a layer after the pinned base's 1" in (
        str(failed.value)
    )
    image.check(waivers={f"/{planted}": "ours, reviewed"})  # named: passes


def test_files_a_later_layer_writes_where_no_base_hook_imports_are_not_findings():
    """The build's own interpreter (a directory a later layer makes), its site-packages (held to
    RECORDs elsewhere), and an image whose base has no hook at all."""
    own = [
        ("opt/k3/python/lib/python3.11", "dir", 0o755, 0, 0, b""),
        ("opt/k3/python/lib/python3.11/os.py", "file", 0o644, 0, 0, b"# the build's CPython\n"),
        ("usr/lib/python3.11/site-packages", "dir", 0o755, 0, 0, b""),
        ("usr/lib/python3.11/site-packages/k3.py", "file", 0o644, 0, 0, b""),
    ]
    assert len(Image([*BASE_LAYER, *STDLIB_DIRS], APP_LAYER, own).check()) == 1  # the hook, shown
    no_hook = [m for m in BASE_LAYER if m[0] not in (HOOK, TARGET)]
    planted = [("usr/lib/python3.11/apport_python_hook.py", "file", 0o644, 0, 0, EVIL)]
    assert Image([*no_hook, *STDLIB_DIRS], APP_LAYER, planted).check() == []


LOCAL_DP = "usr/local/lib/python3.11/dist-packages"


@pytest.mark.parametrize(
    ("later", "named"),
    [
        # first on the base interpreter's sys.path, beside its standard library directory
        ([("usr/lib/python311.zip", "file", 0o644, 0, 0, b"PK\x05\x06" + b"\0" * 18)], ["/usr/lib/python311.zip"]),
        # a site directory Debian's site.py adds when it exists, whoever made it
        (
            [
                *[(d, "dir", 0o755, 0, 0, b"") for d in ("usr/local", "usr/local/lib", "usr/local/lib/python3.11")],
                (LOCAL_DP, "dir", 0o755, 0, 0, b""),
                (f"{LOCAL_DP}/apport_python_hook.py", "file", 0o644, 0, 0, EVIL),
            ],
            [f"/{LOCAL_DP}/apport_python_hook.py"],
        ),
        # the base's dist-packages replaced by a link to a directory of the later layer's own
        (
            [
                ("opt/dp", "dir", 0o755, 0, 0, b""),
                ("opt/dp/apport_python_hook.py", "file", 0o644, 0, 0, EVIL),
                ("usr/lib/python3/dist-packages", "link", 0o777, 0, 0, "/opt/dp"),
            ],
            ["/usr/lib/python3/dist-packages", "/usr/lib/python3/dist-packages/apport_python_hook.py"],
        ),
    ],
)
def test_the_base_interpreter_s_path_is_held_by_its_names_not_by_what_the_base_made(later, named):
    """The base's sys.path (Debian 12's python3.11: /usr/lib/python311.zip, /usr/lib/python3.11,
    lib-dynload, /usr/local/lib/python3.11/dist-packages, /usr/lib/python3/dist-packages) wherever
    what is there came from: a later layer that makes an entry of it, or links one elsewhere, plants
    what the base's sitecustomize imports."""
    image = Image([*BASE_LAYER, *STDLIB_DIRS], APP_LAYER, later)
    with pytest.raises(AssertionError) as failed:
        image.check()
    for path in named:
        assert f"{path}: a file the base's start-up hooks can import, written by a layer after" in str(failed.value)
    image.check(waivers=dict.fromkeys(named, "ours, reviewed"))  # named: passes


def _check_with_pythonpath(image: Image, pythonpath: str) -> list[str]:
    shown: list[str] = []
    config = ImageConfig("r", "i", {}, {"PYTHONPATH": pythonpath}, "1000", ())
    checklist_runtime.test_startup_hooks(config, _expect(), shown.append, image.files, image.layers, image.base)
    return shown


def test_a_module_the_base_s_hook_imports_planted_on_the_config_s_pythonpath_fails():
    """PYTHONPATH comes first on sys.path, the base's interpreter's too: the name its sitecustomize
    imports (read from the hook's source) fails there; the app's own modules beside it do not."""
    app = [("opt/k3/app", "dir", 0o755, 0, 0, b""), ("opt/k3/app/k3app.py", "file", 0o644, 0, 0, b"")]
    assert len(_check_with_pythonpath(Image([*BASE_LAYER, *STDLIB_DIRS], APP_LAYER, app), "/opt/k3/app")) == 1
    planted = [*app, ("opt/k3/app/apport_python_hook.py", "file", 0o644, 0, 0, EVIL)]
    with pytest.raises(AssertionError) as failed:
        _check_with_pythonpath(Image([*BASE_LAYER, *STDLIB_DIRS], APP_LAYER, planted), "/opt/k3/app")
    assert "/opt/k3/app/apport_python_hook.py: a file the base's start-up hooks can import" in str(failed.value)
    assert "k3app" not in str(failed.value)


def test_a_hook_that_imports_by_a_name_made_at_run_time_holds_every_pythonpath_module():
    dynamic = b"import importlib\nimportlib.import_module('apport' + '_python_hook')\n"
    base = [m if m[0] != TARGET else (TARGET, "file", 0o644, 0, 0, dynamic) for m in BASE_LAYER]
    base = [m if m[0] != "var/lib/dpkg/status" else (m[0], "file", 0o644, 0, 0, _status(dynamic)) for m in base]
    app = [("opt/k3/app", "dir", 0o755, 0, 0, b""), ("opt/k3/app/k3app.py", "file", 0o644, 0, 0, b"")]
    with pytest.raises(AssertionError) as failed:
        _check_with_pythonpath(Image([*base, *STDLIB_DIRS], APP_LAYER, app), "/opt/k3/app")
    assert "/opt/k3/app/k3app.py: a file the base's start-up hooks can import" in str(failed.value)
