"""Lock helpers: hermetic pip environment, index lines dropped, overrides, strict parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.deps import lock
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
LOCK = (
    "# Lock for target t (runtime), made by `build lock`; do not edit.\n# k3-lock-inputs-sha256: abc\n"
    f"{lock.BODY_HEADER}{sha256_bytes(BODY.encode())}\n" + BODY
)


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
    data = (
        b"-r common.txt\n--extra-index-url https://flashinfer.ai/whl/\n-i https://x/simple\n"
        b"nvidia-cutlass-dsl[cu13]==4.7.1\nhumming-kernels[cu13]==0.1.12 ; sys_platform == 'linux'\n"
    )
    out = lock._transform(
        data, {"nvidia-cutlass-dsl[cu13]": "nvidia-cutlass-dsl", "humming-kernels[cu13]": "humming-kernels[cu12]"}
    ).decode()
    assert "-r common.txt" in out
    assert "\n--extra-index-url" not in out and "\n-i " not in out
    assert "# dropped by build lock" in out
    assert "\nnvidia-cutlass-dsl==4.7.1\n" in out
    assert "\nhumming-kernels[cu12]==0.1.12 ; sys_platform == 'linux'\n" in out


def test_an_override_is_read_from_uvs_annotation():
    body = BODY.replace("    # via torch\n", "    # via torch, --override overrides.txt\n")
    _, entries = lock.parse_lock(body, Path("x"))
    assert [(e.name, e.override) for e in entries] == [("nvidia-nccl-cu12", True), ("torch", False)]
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


@pytest.mark.parametrize(
    "bad,message",
    [
        ("requests>=2\n", "not a pinned requirement line"),
        ("requests==2.0\n", "has no --hash"),
        ("    --hash=sha256:1\n", "hash line without a requirement"),
        ("requests==2.0 \\\n    --hash=sha256:abcd\n", "not a sha256"),
    ],
)
def test_parse_lock_refuses_unpinned_or_unhashed(bad, message):
    with pytest.raises(LockError, match=message):
        lock.parse_lock(bad, Path("x"))


def test_missing_lock_says_how_to_make_one(tmp_path):
    with pytest.raises(LockError, match="run `build lock --target t` first"):
        lock.read_entries(tmp_path / "t" / "requirements.txt")


# --- the +cu129 torch rule (lock.check_torch_build) ------------------------------------------------


def _cu129():
    from builder.config import matrix
    from tests.conftest import REPO

    return matrix.load(REPO / "matrix.yaml").target("cu129")


def _entries(**versions):
    return [lock.LockEntry(name, version, (H1,)) for name, version in versions.items()]


CU129_FAMILY = {"torch": "2.13.0+cu129", "torchvision": "0.28.0+cu129", "torchaudio": "2.11.0+cu129"}


def test_a_correct_cu129_torch_family_passes():
    t = _cu129()
    assert t.torch.version == "2.13.0+cu129" and t.cuda.short == "cu129"
    lock.check_torch_build(t, _entries(**CU129_FAMILY, numpy="2.2.0"), Path("x"))
    lock.check_torch_build(t, _entries(torch="2.13.0+cu129"), Path("x"))  # vision and audio are optional
    lock.check_torch_build(t, _entries(Torch="2.13.0+cu129", TorchVision="0.28.0+cu129"), Path("x"))


@pytest.mark.parametrize(
    "family,named",
    [
        ({"torch": "2.13.0"}, "torch 2.13.0"),  # PyPI's bare build: CUDA 13
        ({"torch": "2.13.0+cu130"}, "torch 2.13.0+cu130"),
        ({"torch": "2.13.0+cu128"}, "torch 2.13.0+cu128"),
        ({"torch": "2.13.0+cpu"}, "torch 2.13.0+cpu"),
        ({"torch": "2.13.0+cu1290"}, "torch 2.13.0+cu1290"),
        ({"torch": "2.13.0+xcu129"}, "torch 2.13.0+xcu129"),  # the whole local label, not its tail
        ({"Torch": "2.13.0"}, "torch 2.13.0"),  # names are normalized
        ({**CU129_FAMILY, "torchvision": "0.28.0"}, "torchvision 0.28.0"),
        ({**CU129_FAMILY, "torchaudio": "2.11.0+cu130"}, "torchaudio 2.11.0+cu130"),
        ({**CU129_FAMILY, "torch_audio": "2.11.0"}, None),  # not a member of the family
    ],
)
def test_a_torch_family_member_of_another_build_is_refused(family, named):
    t = _cu129()
    if named is None:
        lock.check_torch_build(t, _entries(**family), Path("x"))
        return
    with pytest.raises(LockError) as info:
        lock.check_torch_build(t, _entries(**family), Path("locks/cu129/requirements.txt"))
    message = info.value.message
    assert message.startswith(
        f"locks/cu129/requirements.txt: the torch family must be +cu129 builds for this target, the lock has {named}; "
    )
    assert "Re-lock with the cu129 index." in message


def test_every_wrong_member_is_named_in_order():
    with pytest.raises(LockError, match=r"the lock has torchaudio 2\.11\.0, torchvision 0\.28\.0\+cu130;"):
        lock.check_torch_build(
            _cu129(), _entries(torch="2.13.0+cu129", torchvision="0.28.0+cu130", torchaudio="2.11.0"), Path("x")
        )


def test_a_lock_without_torch_is_refused_for_a_torch_target():
    t = _cu129()
    for entries in (_entries(numpy="2.2.0"), _entries(torchvision="0.28.0+cu129"), []):
        with pytest.raises(
            LockError,
            match=r"^x: no torch in the lock, but the target pins torch 2\.13\.0\+cu129; "
            r"re-lock with the cu129 index$",
        ):
            lock.check_torch_build(t, entries, Path("x"))


def test_a_target_without_a_torch_pin_takes_any_lock():
    t = _cu129().model_copy(update={"torch": None})
    lock.check_torch_build(t, _entries(torch="2.13.0+cu130"), Path("x"))
    lock.check_torch_build(t, [], Path("x"))


def test_the_rule_follows_the_targets_cuda():
    t = _cu129()
    cu128 = t.model_copy(update={"cuda": t.cuda.model_copy(update={"version": "12.8.1"})})
    lock.check_torch_build(cu128, _entries(torch="2.13.0+cu128"), Path("x"))
    with pytest.raises(LockError, match=r"must be \+cu128 builds"):
        lock.check_torch_build(cu128, _entries(torch="2.13.0+cu129"), Path("x"))


# --- the body-hash header -------------------------------------------------------------------------


def test_a_committed_lock_must_carry_its_body_hash_header(tmp_path):
    path = tmp_path / "t" / "requirements.txt"
    path.parent.mkdir()
    path.write_text(LOCK)
    assert [e.name for e in lock.read_entries(path)] == ["nvidia-nccl-cu12", "torch"]
    headerless = "".join(ln for ln in LOCK.splitlines(keepends=True) if not ln.startswith(lock.BODY_HEADER))
    assert lock.parse_lock(headerless, path)[1]  # parses...
    path.write_text(headerless)
    with pytest.raises(LockError, match=r"requirements.txt: no '# k3-lock-body-sha256:' header; re-run `build lock`"):
        lock.read_entries(path)  # ...but a committed lock without it is refused


def test_the_body_hash_covers_the_body_exactly():
    lock.parse_lock(LOCK, Path("x"))
    for edited in (LOCK.replace("2.27.3", "2.27.4"), LOCK + "\n", LOCK.replace("# via torch", "# via vllm")):
        with pytest.raises(LockError) as info:
            lock.parse_lock(edited, Path("x"))
        assert info.value.message == (
            "x: the lock's body does not match its # k3-lock-body-sha256: header "
            "(truncated or edited by hand); restore it from git or re-run `build lock`"
        )
    # A comment line in the header block is not part of the body.
    lock.parse_lock("# another header line\n" + LOCK, Path("x"))


def test_a_lock_with_no_entries_is_refused(tmp_path):
    empty = f"# k3-lock-inputs-sha256: abc\n{lock.BODY_HEADER}{sha256_bytes(b'')}\n"
    assert lock.parse_lock(empty, Path("x")) == ("abc", [])
    with pytest.raises(LockError, match="the lock has no entries"):
        lock.entries_of(empty, Path("x"))


def test_an_unreadable_lock_is_a_lock_error(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(LockError, match="unreadable lock"):
        lock.read_entries(path)


def test_parse_lock_reads_hashes_and_names_the_line_of_a_problem():
    _, entries = lock.parse_lock(LOCK, Path("x"))
    assert entries[0] == lock.LockEntry("nvidia-nccl-cu12", "2.27.3", (H1, H2), False)
    assert entries[1] == lock.LockEntry("torch", "2.13.0+cu129", (H3,), False)
    with pytest.raises(LockError, match=r"^x:3: hash line without a requirement$"):
        lock.parse_lock("# c\n\n    --hash=sha256:" + H1 + "\n", Path("x"))
    with pytest.raises(LockError, match=r"^x:3: not a pinned requirement line: 'numpy'$"):
        lock.parse_lock(f"torch==1 \\\n    --hash=sha256:{H1}\nnumpy\n", Path("x"))
    with pytest.raises(LockError, match=r"^x: torch==1 has no --hash; re-run `build lock`$"):
        lock.parse_lock("torch==1\n", Path("x"))
    with pytest.raises(LockError, match=r"^x:3: not a sha256"):
        lock.parse_lock(f"torch==1 \\\n    --hash=sha256:{'a' * 64}\n    --hash=sha256:{'A' * 64}\n", Path("x"))


def test_an_override_annotation_marks_only_its_own_entry():
    body = BODY.replace("    # via -r matrix.in\n", "    # via -r matrix.in, --override overrides.txt\n")
    _, entries = lock.parse_lock(body, Path("x"))
    assert [(e.name, e.override) for e in entries] == [("nvidia-nccl-cu12", False), ("torch", True)]
    # A plain comment that mentions --override is not uv's annotation.
    other = BODY.replace("    # via torch\n", "    # pinned with --override by hand\n")
    assert not any(e.override for e in lock.parse_lock(other, Path("x"))[1])


def test_check_current_needs_the_inputs_header_and_the_same_inputs(tmp_path):
    inputs = lock.LockInputs(
        kind="runtime",
        files={"matrix.in": b"torch==2.13.0+cu129\n"},
        top=("matrix.in",),
        indexes=("https://pypi.org/simple",),
        python="3.12",
        platform="x86_64-manylinux_2_35",
    )
    path = tmp_path / "t" / "requirements.txt"
    path.parent.mkdir()
    path.write_text(LOCK.replace("# k3-lock-inputs-sha256: abc", f"{lock.INPUT_HEADER}{inputs.sha256}"))
    lock.check_current(path, inputs)
    other = lock.LockInputs(**{**inputs.__dict__, "python": "3.11"})
    with pytest.raises(LockError, match=r"stale: made from other inputs .* run `build lock --target t`"):
        lock.check_current(path, other)
    path.write_text(LOCK.replace("# k3-lock-inputs-sha256: abc\n", ""))
    with pytest.raises(LockError, match="no '# k3-lock-inputs-sha256:' header"):
        lock.check_current(path, inputs)


def test_entries_of_names_the_lock_in_every_error():
    body = "torch==1\n"
    text = f"{lock.BODY_HEADER}{sha256_bytes(body.encode())}\n{body}"
    with pytest.raises(LockError, match=r"^locks/t/requirements.txt: torch==1 has no --hash"):
        lock.entries_of(text, Path("locks/t/requirements.txt"))


def test_a_version_loses_a_trailing_continuation_or_semicolon():
    for line in ("torch==2.13.0+cu129\\", "torch==2.13.0+cu129;", "torch==2.13.0+cu129 \\"):
        _, entries = lock.parse_lock(f"{line}\n    --hash=sha256:{H1}\n", Path("x"))
        assert entries[0].version == "2.13.0+cu129", line


def test_long_bad_lines_are_cut_in_the_message():
    name = "x" * 100
    with pytest.raises(LockError) as info:
        lock.parse_lock(f"{name}\n", Path("x"))
    assert info.value.message == f"x:1: not a pinned requirement line: {'x' * 60!r}"
    digest = "z" * 100
    with pytest.raises(LockError) as info:
        lock.parse_lock(f"torch==1 \\\n    --hash=sha256:{digest}\n", Path("x"))
    assert info.value.message == f"x:2: not a sha256 (64 hex characters): {'z' * 70!r}"


def test_a_hash_with_another_colon_is_not_a_sha256():
    with pytest.raises(LockError, match="not a sha256"):
        lock.parse_lock(f"torch==1 \\\n    --hash=sha256:md5:{H1}\n", Path("x"))


def test_a_requirement_line_is_dropped_over_all_its_continuation_lines():
    data = b"--extra-index-url \\\n  https://flashinfer.ai/whl/\nfoo==1\n"
    out = lock._transform(data, {}).decode().splitlines()
    assert out[0].startswith("# dropped") and out[1].startswith("# dropped") and out[2] == "foo==1"


def test_the_resolvers_stderr_never_quotes_an_input_file(tmp_path, monkeypatch):
    """uv quotes the offending line of a file it cannot parse: `-r /proc/self/environ` put the
    whole environment into the error (issue 21). Run the real uv on exactly that file."""
    import subprocess

    from builder import log
    from builder.deps.hermetic import uv_binary

    monkeypatch.setenv("K3_TEST_SECRET_VALUE", "hunter2-environ-canary")
    (tmp_path / "r.txt").write_text("foo==1\n--requirement=/proc/self/environ\n")
    proc = subprocess.run(
        [uv_binary(), "pip", "compile", "--no-config", "--offline", "r.txt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert "hunter2-environ-canary" in proc.stderr  # what uv prints: the host's environment
    monkeypatch.setattr(log, "_secrets", {"s3cr3t-registered"})
    reason = lock.resolver_reason(proc.stderr + "\nerror: token s3cr3t-registered\n", tmp_path)
    assert "hunter2-environ-canary" not in reason and "s3cr3t-registered" not in reason
    assert "Couldn't parse requirement" in reason and "\n" not in reason
    assert str(tmp_path) not in lock.resolver_reason(f"error: cannot read `{tmp_path}/source/x.txt`", tmp_path)


def test_torchcodec_is_in_the_family_unless_the_matrix_states_an_exception():
    """PyPI's torchcodec 0.17.0 is a CUDA 13 build (it needs libcudart.so.13) with no +cu marker:
    the lock must carry the +cu129 one, or cuda.other_major must say why not; torch itself is
    never exempt."""
    t = _cu129()
    lock.check_torch_build(t, _entries(**CU129_FAMILY, torchcodec="0.17.0+cu129"), Path("x"))
    with pytest.raises(LockError, match="the lock has torchcodec 0.17.0; "):
        lock.check_torch_build(t, _entries(**CU129_FAMILY, torchcodec="0.17.0"), Path("x"))
    other = {**t.cuda.other_major, "torchcodec": "a stated exception", "torch": "not honoured"}
    excused = t.model_copy(update={"cuda": t.cuda.model_copy(update={"other_major": other})})
    lock.check_torch_build(excused, _entries(**CU129_FAMILY, torchcodec="0.17.0"), Path("x"))
    with pytest.raises(LockError, match="the lock has torch 2.13.0; "):
        lock.check_torch_build(excused, _entries(**{**CU129_FAMILY, "torch": "2.13.0"}), Path("x"))


def test_a_dropped_requirement_is_commented_out_over_its_continuation_lines_by_normalized_name():
    data = b'torch==2.13.0\ntokenspeed-mla==0.1.8; platform_system == "Linux"\nfoo[x]>=1 \\\n  --hash=sha256:aa\nfoobar==1\n'
    out = lock._transform(data, {}, "r.txt", {"Tokenspeed_MLA", "foo"})
    assert out.decode().splitlines() == [
        "torch==2.13.0",
        '# dropped by the matrix (source.drop): tokenspeed-mla==0.1.8; platform_system == "Linux"',
        "# dropped by the matrix (source.drop): foo[x]>=1 \\",
        "# dropped by the matrix (source.drop): --hash=sha256:aa",
        "foobar==1",
    ]
    assert lock.dropped_names({"r.txt": out}) == {"tokenspeed-mla", "foo"}
    assert lock._transform(data, {}, "r.txt") == lock._transform(data, {}, "r.txt", ())  # nothing dropped


class _Tree:
    commit = "c" * 40

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def read(self, path: str) -> bytes | None:
        return self.files.get(path)


def _cu129_dropping(tmp_path, drop: dict[str, str]):
    import yaml

    from builder.config import matrix
    from tests.conftest import REPO

    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    doc["targets"]["cu129"]["source"]["drop"] = drop
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(doc))
    return matrix.load(tmp_path / "matrix.yaml").target("cu129")


def test_the_runtime_lock_inputs_drop_what_the_matrix_drops_and_a_stale_drop_is_bad_input(tmp_path):
    from builder.errors import ConfigError

    tree = _Tree({"requirements/cuda.txt": b"tokenspeed-mla==0.1.8\nnumba==0.61\n"})
    target = _cu129_dropping(tmp_path, {"tokenspeed-mla": "not on r575"})
    runtime = lock.inputs(target, tree, "runtime").files["source/requirements/cuda.txt"].decode()
    assert "# dropped by the matrix (source.drop): tokenspeed-mla==0.1.8" in runtime and "\nnumba==0.61\n" in runtime
    stale = _cu129_dropping(tmp_path, {"not-there": "gone upstream"})
    with pytest.raises(ConfigError, match=r"source\.drop\.not-there: no requirement of that name"):
        lock.inputs(stale, tree, "runtime")
