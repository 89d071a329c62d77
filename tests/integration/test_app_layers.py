"""The source's wheel in two layers: a Python-only bump moves only app-python, a C-only bump only
app-native, and the image is still reproducible with its bytecode.

Each build reruns every step (--no-cache) and compiles through a remote compile cache (Redis)
with nothing else to hit: what a fresh builder sees. Bumps are new commits with new committer
times, so SOURCE_DATE_EPOCH moves with each of them.

The same builds show the compile cache shared across builders (test_compile_cache.py owns the
backend): the first fills it, the Python-only bump reruns the compile step and hits it for every
unit, and the backend's password never leaves the BuildKit secret. One chain of builds for both
claims, not two (each --no-cache build of the smoke costs minutes of a 2-core CI machine)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import io
import json
import re
import subprocess
import tarfile
import urllib.request
from pathlib import Path

from builder.config import contract
from tests.integration.conftest import REGISTRY, cli
from tests.integration.test_compile_cache import (  # noqa: F401 (redis: a fixture)
    PASSWORD,
    _build,
    _dbsize,
    _remote_target,
    redis,
)

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "PATH": "/usr/bin:/bin",
}


def _commit(clone: Path, path: str, addition: str, when: str) -> str:
    file = clone / path
    file.write_text(file.read_text() + addition)
    subprocess.run(
        ["git", "-C", str(clone), "commit", "-qam", f"bump {path}"],
        check=True,
        env={**GIT_ENV, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when},
    )
    return subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _pin(work, commit: str) -> None:
    text = re.sub(r"(\n      commit: )[0-9a-f]{40}", rf"\g<1>{commit}", work.matrix.read_text(), count=1)
    work.matrix.write_text(text)
    for args in (("render",), ("lock", "--target", "smoke")):
        assert cli("--matrix", str(work.matrix), *args).code == 0


def _layers(work, image: str) -> dict[str, str]:
    """Layer name -> digest for the layers above the runtime base, in the order the image has them."""

    def raw(ref):
        return json.loads(
            subprocess.run(
                ["docker", "buildx", "imagetools", "inspect", "--raw", ref], capture_output=True, text=True, check=True
            ).stdout
        )["layers"]

    base = re.search(r"runtime: (\S+)", work.matrix.read_text()).group(1)
    above = raw(image)[len(raw(base)) :]
    # The OS layer (os_packages) comes first above the runtime base, when the target has one.
    os_layer = ["os"] if "\n    os_packages:\n" in work.matrix.read_text() else []
    names = [*os_layer, "base", "cuda", "torch", "flashinfer", "deps", *contract.APP_LAYERS]
    assert len(above) == len(names), (len(above), names)
    return dict(zip(names, (layer["digest"] for layer in above), strict=False))


def _changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [name for name in before if before[name] != after[name]]


def _blob(repository: str, digest: str) -> dict[str, bytes | None]:
    """A layer's regular files (bytes) and symlinks/directories (None), by path."""
    with urllib.request.urlopen(f"http://{REGISTRY}/v2/{repository}/blobs/{digest}", timeout=60) as resp:
        data = gzip.decompress(resp.read())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() if m.isfile() else None for m in tar.getmembers()}


def _assert_split(native: dict, python: dict) -> None:
    """ELF files in app-native only, with their RECORD lines; bytecode for every .py in app-python."""
    native_files = {p: b for p, b in native.items() if b is not None}
    elf = {p for p, b in native_files.items() if b[:4] == b"\x7fELF"}
    assert elf and set(native_files) - elf == {p for p in native_files if p.endswith(contract.NATIVE_RECORD_NAME)}
    assert not [p for p, b in python.items() if b is not None and b[:4] == b"\x7fELF"]
    record_native = next(b for p, b in native_files.items() if p.endswith(contract.NATIVE_RECORD_NAME)).decode()
    record = next(b for p, b in python.items() if p.endswith(".dist-info/RECORD")).decode()
    for path in elf:
        name = path.rsplit("site-packages/", 1)[1]
        digest = hashlib.sha256(native_files[path]).digest()
        want = "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        assert f"{name},{want},{len(native_files[path])}" in record_native.splitlines()
        assert f"{name},," in record.splitlines()  # path kept, hash left to RECORD.native
    sources = [p for p, b in python.items() if p.endswith(".py") and b is not None and "site-packages/" in p]
    assert sources
    for path in sources:
        head, name = path.rsplit("/", 1)
        pattern = re.compile(re.escape(f"{head}/__pycache__/{name[:-3]}.") + r"cpython-\d+\.pyc")
        found = [b for p, b in python.items() if b is not None and pattern.fullmatch(p)]
        assert len(found) == 1, f"{path}: bytecode {len(found)} files, want one (one optimization level)"
        flags = int.from_bytes(found[0][4:8], "little")
        assert flags == 0b11, f"{path}: pyc flags {flags:#b}, want checked hash-based (0b11)"
        if found[0][:4] == importlib.util.MAGIC_NUMBER:  # source_hash is keyed by the interpreter's magic
            assert found[0][8:16] == importlib.util.source_hash(python[path])


def test_python_only_and_c_only_bumps_each_move_one_app_layer(built, tmp_path, redis):  # noqa: F811
    smoke, _ = built
    host, port = redis
    url = f"redis://:{PASSWORD}@{host}:{port}/0"
    work = _remote_target(smoke, tmp_path / "app", "applayers")
    source_url = re.search(r"\n      url: file://(\S+)\n", work.matrix.read_text()).group(1)
    clone = tmp_path / "src"
    subprocess.run(["git", "clone", "-q", source_url, str(clone)], check=True)
    work.matrix.write_text(work.matrix.read_text().replace(f"url: file://{source_url}\n", f"url: file://{clone}\n", 1))
    _pin(
        work,
        subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip(),
    )
    first, _ = _build(work, url)  # fills the cache
    log = Path(first["log"]).read_text()
    assert "[compile-remote-cache " in log and "[compile-offline " not in log  # the stage with the cache ran
    assert first["compile_cache"]["misses"] > 0 and _dbsize(host, port) > 0

    # A Python-only bump reruns the compile step (--no-cache) on the same C sources: every unit hits.
    _pin(work, _commit(clone, "k3smoke/__main__.py", "# a Python-only bump\n", "2026-11-03T00:00:00+00:00"))
    py_bump, err = _build(work, url)
    stats = py_bump["compile_cache"]
    assert stats["misses"] == 0 and stats["hits"] == first["compile_cache"]["misses"]
    assert "compile cache" in err and f"{stats['hits']}/{stats['hits']} hits" in err
    assert _changed(_layers(work, first["image"]), _layers(work, py_bump["image"])) == ["app-python"]

    _pin(
        work,
        _commit(clone, "csrc/driver.c", 'const char k3_bump_note[] = "a C-only bump";\n', "2026-11-04T00:00:00+00:00"),
    )
    c_bump, _ = _build(work, url)
    assert c_bump["compile_cache"]["misses"] > 0
    layers = _layers(work, c_bump["image"])
    assert _changed(_layers(work, py_bump["image"]), layers) == ["app-native"]
    _assert_split(_blob(smoke.repository, layers["app-native"]), _blob(smoke.repository, layers["app-python"]))

    # The image's own user (uid 2000, PYTHONDONTWRITEBYTECODE=1) imports from that bytecode.
    run = ["docker", "run", "--rm", "--network", "none", "-e", "LD_LIBRARY_PATH=/usr/local/cuda/compat"]
    verbose = subprocess.run(
        [*run, "--entrypoint", "python", c_bump["image"], "-v", "-c", "import k3smoke"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    assert re.search(r"k3smoke/__pycache__/__init__\.cpython-\d+\.pyc matches .*k3smoke/__init__\.py", verbose)

    # The C-only bump's image, rebuilt from nothing (no cache, offline compile stage): same digest.
    r = cli("--matrix", str(work.matrix), "reproduce", "--target", "smoke")
    assert r.code == 0, r.err[-3000:]
    assert "reproduced: " in r.err

    # The password is in no record, log or report the builds wrote, nor in any image's config.
    leaked = [
        p
        for p in Path(work.root / "artifacts").rglob("*")
        if p.is_file() and p.stat().st_size < 50_000_000 and PASSWORD.encode() in p.read_bytes()
    ]
    assert not leaked
    for image in (first["image"], py_bump["image"], c_bump["image"]):
        config = subprocess.run(
            ["docker", "buildx", "imagetools", "inspect", "--format", "{{json .Image}}", image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert PASSWORD not in config
