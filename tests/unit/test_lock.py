"""Lock helpers: hermetic pip environment, index lines dropped, overrides, strict parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder import lock
from builder.errors import LockError
from builder.fsutil import sha256_bytes

H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64
BODY = f"""\
nvidia-nccl-cu12==2.27.3 \\
    --hash=sha256:{H1} \\
    --hash=sha256:{H2}
    # via torch
torch==2.13.0+cu129 \\
    --hash=sha256:{H3}
    # via -r matrix.in
"""
LOCK = ("# Lock for target t (runtime), made by `build lock`; do not edit.\n# k3-lock-inputs-sha256: abc\n"
        f"{lock.BODY_HEADER}{sha256_bytes(BODY.encode())}\n" + BODY)


def test_hermetic_env_drops_machine_pip_settings(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///opt/pypi/simple")
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/xdg/pip/constraints.txt")
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt")
    env = lock.hermetic_env()
    assert env["PIP_CONFIG_FILE"] == "/dev/null"
    assert "PIP_FIND_LINKS" not in env and "PIP_EXTRA_INDEX_URL" not in env and "PIP_CONSTRAINT" not in env
    assert env["PIP_CERT"] == "/etc/ssl/certs/ca-certificates.crt"  # trust, not an index


def test_source_requirement_files_lose_index_lines_and_get_rewrites():
    data = (b"-r common.txt\n--extra-index-url https://flashinfer.ai/whl/\n-i https://x/simple\n"
            b"nvidia-cutlass-dsl[cu13]==4.7.1\nhumming-kernels[cu13]==0.1.12 ; sys_platform == 'linux'\n")
    out = lock._transform(data, {"nvidia-cutlass-dsl[cu13]": "nvidia-cutlass-dsl",
                                 "humming-kernels[cu13]": "humming-kernels[cu12]"}).decode()
    assert "-r common.txt" in out
    assert "\n--extra-index-url" not in out and "\n-i " not in out
    assert "# dropped by build lock" in out
    assert "\nnvidia-cutlass-dsl==4.7.1\n" in out
    assert "\nhumming-kernels[cu12]==0.1.12 ; sys_platform == 'linux'\n" in out


def test_an_override_is_read_from_uvs_annotation():
    body = BODY.replace("    # via torch\n", "    # via torch, --override overrides.txt\n")
    _, entries = lock.parse_lock(body, Path("x"))
    assert [e.name for e in entries if e.override] == ["nvidia-nccl-cu12"]
    assert not any(e.override for e in lock.parse_lock(BODY, Path("x"))[1])


def test_hermetic_env_also_drops_uv_settings(monkeypatch):
    monkeypatch.setenv("UV_INDEX_URL", "https://evil.example/simple")
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", "https://evil.example/simple")
    env = lock.hermetic_env()
    assert "UV_INDEX_URL" not in env and "UV_EXTRA_INDEX_URL" not in env and env["UV_NO_CONFIG"] == "1"


def test_a_marker_after_the_version_is_not_part_of_it():
    body = f"setuptools==80.10.2 ; python_version > '3.11' \\\n    --hash=sha256:{H1}\n"
    assert [(e.name, e.version) for e in lock.parse_lock(body, Path("x"))[1]] == [("setuptools", "80.10.2")]


def test_parse_lock_reads_header_and_entries():
    sha, entries = lock.parse_lock(LOCK, Path("x"))
    assert sha == "abc"
    assert [(e.name, e.version) for e in entries] == [("nvidia-nccl-cu12", "2.27.3"), ("torch", "2.13.0+cu129")]


def test_a_truncated_lock_fails_its_body_hash_even_when_what_is_left_parses():
    cut = LOCK[: LOCK.index("torch==")]  # ends cleanly after a complete entry
    lock.parse_lock(cut.replace(lock.BODY_HEADER, "# other: "), Path("x"))  # parses without the header...
    with pytest.raises(LockError, match="does not match its"):
        lock.parse_lock(cut, Path("x"))  # ...but not with it


@pytest.mark.parametrize("bad,message", [
    ("requests>=2\n", "not a pinned requirement line"),
    ("requests==2.0\n", "has no --hash"),
    ("    --hash=sha256:1\n", "hash line without a requirement"),
    ("requests==2.0 \\\n    --hash=sha256:abcd\n", "not a sha256"),
])
def test_parse_lock_refuses_unpinned_or_unhashed(bad, message):
    with pytest.raises(LockError, match=message):
        lock.parse_lock(bad, Path("x"))


def test_missing_lock_says_how_to_make_one(tmp_path):
    with pytest.raises(LockError, match="run `build lock --target t` first"):
        lock.read_entries(tmp_path / "t" / "requirements.txt")
