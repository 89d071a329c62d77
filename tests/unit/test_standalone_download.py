"""python.standalone's CPython tarball (builder/deps/buildcontext.py): downloaded once into the cache
by its sha256, no further than contract.STANDALONE_MAX_BYTES, and nothing kept of a refused one."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from builder.config import contract, matrix
from builder.deps import buildcontext
from builder.errors import LockError, Unreachable

REPO = Path(__file__).resolve().parents[2]


class _Stream(io.BytesIO):
    """What urlopen returns: bytes to read, a context manager; counts what was read."""

    def __init__(self, data: bytes = b"", endless: bool = False):
        super().__init__(data)
        self.endless, self.served = endless, 0

    def read(self, n: int = -1) -> bytes:
        # "endless": 16 times the cap (4096 in these tests), so a download with no cap ends, and fails
        data = b"\0" * min(n if n > 0 else 1 << 20, 16 * 4096 - self.served) if self.endless else super().read(n)
        self.served += len(data)
        return data


def _target(sha256: str):
    cu129 = matrix.load(REPO / "matrix.yaml").target("cu129")
    assert cu129.python.provider == "standalone" and cu129.python.standalone is not None
    spec = cu129.python.standalone.model_copy(update={"sha256": sha256})
    return cu129.model_copy(update={"python": cu129.python.model_copy(update={"standalone": spec})})


def _left(tmp_path: Path) -> list[str]:
    where = tmp_path / "cache" / "python"
    return sorted(p.name for p in where.iterdir() if not p.name.endswith(".lock")) if where.exists() else []


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(contract, "STANDALONE_MAX_BYTES", 4096)
    streams: list[_Stream] = []

    def serve(what: _Stream):
        streams.append(what)
        monkeypatch.setattr(buildcontext.urllib.request, "urlopen", lambda url, timeout: what)
        return what

    return serve


def test_an_oversize_tarball_is_stopped_at_the_cap_and_refused_unwritten(tmp_path, served):
    endless = served(_Stream(endless=True))  # a hostile host or a broken proxy: it never ends
    with pytest.raises(
        LockError,
        match=r"cu129: python\.standalone\.url: the CPython tarball from https://\S+ is "
        r"longer than the 4096 bytes a CPython tarball may have",
    ) as info:
        buildcontext._standalone_python(_target("a" * 64))
    assert info.value.exit_code == 2 and endless.served == 4097
    assert _left(tmp_path) == []


def test_a_tarball_within_the_cap_is_cached_by_its_sha256_and_a_mismatch_refused(tmp_path, served):
    data = b"\x1f\x8b a tarball" * 100
    digest = hashlib.sha256(data).hexdigest()
    served(_Stream(data))
    got = buildcontext._standalone_python(_target(digest))
    assert got == tmp_path / "cache" / "python" / f"{digest}.tar.gz" and got.read_bytes() == data
    served(_Stream(b"not it"))
    assert buildcontext._standalone_python(_target(digest)).read_bytes() == data  # the cache, no download
    with pytest.raises(LockError, match=r"has sha256 [0-9a-f]{16}\.\.\., the matrix says b{16}"):
        buildcontext._standalone_python(_target("b" * 64))
    assert _left(tmp_path) == [f"{digest}.tar.gz"]


def test_a_host_out_of_reach_is_exit_3_and_leaves_nothing(tmp_path, served, monkeypatch):
    def refuse(url, timeout):
        raise OSError("connection refused")

    monkeypatch.setattr(buildcontext.urllib.request, "urlopen", refuse)
    with pytest.raises(Unreachable, match="cannot download the CPython tarball"):
        buildcontext._standalone_python(_target("c" * 64))
    assert _left(tmp_path) == []
