"""The spine on the real engine and registry: matrix -> Dockerfile -> lock -> build -> push -> record."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import git

from tests.conftest import REPO
from tests.integration.conftest import REGISTRY, cli, registry_digest


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_build_records_the_digest_the_registry_serves(built):
    smoke, ref = built
    assert re.fullmatch(rf"{REGISTRY}/{smoke.repository}@sha256:[0-9a-f]{{64}}", ref)
    record = json.loads(smoke.record.read_text())
    digest = ref.split("@")[1]
    assert record["image"] == ref and record["digest"] == digest
    assert registry_digest(smoke.repository, digest) == digest  # served by digest
    assert registry_digest(smoke.repository, "smoke") == digest  # and the tag points at it
    assert (
        record["lock_sha256"] == hashlib.sha256((smoke.root / "locks/smoke/requirements.txt").read_bytes()).hexdigest()
    )
    assert (
        record["dockerfile_sha256"]
        == hashlib.sha256((smoke.root / "dockerfiles/smoke/Dockerfile").read_bytes()).hexdigest()
    )
    assert record["source"]["commit"] == git.Repo(smoke.root / "k3smoke-src").head.commit.hexsha
    assert record["source_date_epoch"] == git.Repo(smoke.root / "k3smoke-src").head.commit.committed_date
    assert record["bases"]["runtime"]["digest"].startswith("sha256:")
    log = smoke.root / "artifacts" / "smoke" / record["build"]["id"] / "build.log"
    assert f"pushed {REGISTRY}/{smoke.repository}:smoke as {REGISTRY}/{smoke.repository}@{digest}" in log.read_text()


def test_image_runs_as_non_root_with_a_cuda_12_9_runtime(built):
    _, ref = built
    probe = (
        "import ctypes, glob, os, k3smoke;"
        "lib = glob.glob('/opt/k3/venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12')[0];"
        "v = ctypes.c_int(); ctypes.CDLL(lib).cudaRuntimeGetVersion(ctypes.byref(v));"
        "print(v.value, os.getuid(), k3smoke.rms([3, 4]))"
    )
    out = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "-e",
            "LD_LIBRARY_PATH=/usr/local/cuda/compat",
            "--entrypoint",
            "python",
            ref,
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == "12090" and out[1] == "2000" and abs(float(out[2]) - 3.5355) < 1e-3


def test_image_labels_carry_pins_and_expiry(built):
    smoke, ref = built
    cfg = json.loads(
        subprocess.run(
            ["docker", "buildx", "imagetools", "inspect", "--format", "{{json .Image}}", ref],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    labels = cfg["config"]["Labels"]
    record = json.loads(smoke.record.read_text())
    assert labels["org.opencontainers.image.revision"] == record["source"]["commit"]
    assert labels["org.opencontainers.image.base.digest"] == record["bases"]["runtime"]["digest"]
    assert labels["io.k3-cu129.lock-sha256"] == record["lock_sha256"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", labels["io.k3-cu129.expires"])
    assert labels["org.opencontainers.image.created"].startswith("2026-11-01T00:00:00")


def test_rebuild_with_nothing_changed_only_changes_build_fields(built):
    smoke, ref = built
    before = json.loads(smoke.record.read_text())
    r = cli("--matrix", str(smoke.matrix), "--target", "smoke", "--no-cache")
    assert r.code == 0, r.err[-2000:]
    after = json.loads(smoke.record.read_text())
    assert after["build"]["id"] != before["build"]["id"]
    before.pop("build"), after.pop("build")
    assert after == before  # same digest even without the layer cache
    assert r.out.strip().splitlines()[-1] == ref


def test_hand_edited_dockerfile_is_caught(smoke, tmp_path):
    work = smoke.copy(tmp_path / "edited")
    df = work.root / "dockerfiles" / "smoke" / "Dockerfile"
    df.write_text(df.read_text().replace("USER 2000:2000", "USER 0:0"))
    check = cli("--matrix", str(work.matrix), "render", "--check")
    assert check.code == 1 and "differs from what the matrix renders" in check.err
    before = _tree(work.root)
    b = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert b.code == 1 and "run `build render" in b.err
    assert _tree(work.root) == before


def test_bad_input_is_exit_2_with_one_line_and_nothing_written(smoke, tmp_path):
    work = smoke.copy(tmp_path / "bad")
    good = work.matrix.read_text()
    base_ref = re.search(r"build: (\S+)@sha256:[0-9a-f]{64}", good)
    cases = {
        "tag without digest": (
            good.replace(base_ref.group(0), f"build: {base_ref.group(1)}"),
            "targets.smoke.bases.build: must be pinned by digest",
        ),
        "injected newline": (
            good.replace("version: 0.1.0", 'version: "0.1.0\\nRUN id"'),
            "targets.smoke.source.version: must be a PEP 440 version",
        ),
    }
    before = _tree(work.root)
    for name, (text, expected) in cases.items():
        work.matrix.write_text(text)
        for args in (("render",), ("--target", "smoke"), ("lock", "--target", "smoke")):
            r = cli("--matrix", str(work.matrix), *args)
            lines = r.err.strip().splitlines()
            assert r.code == 2, (name, args, r.err)
            assert len(lines) == 1 and expected in lines[0] and str(work.matrix) in lines[0], (name, lines)
    work.matrix.write_text(good)
    r = cli("--matrix", str(work.matrix), "--target", "smokey")
    assert r.code == 2 and "unknown target 'smokey' (did you mean 'smoke'?)" in r.err
    assert _tree(work.root) == before


def test_failed_run_step_keeps_the_log_and_the_previous_record(built, tmp_path):
    smoke, _ = built
    work = smoke.copy(tmp_path / "broken")
    # A new commit on the smoke branch whose kernel does not compile.
    src = git.Repo(smoke.root / "k3smoke-src")
    clone = git.Repo.clone_from(src.working_dir, tmp_path / "broken-src", branch="k3-smoke")
    kernel = Path(clone.working_dir) / "csrc" / "module.c"
    kernel.write_text(kernel.read_text() + "\nthis is not C;\n")
    clone.git.add(A=True)
    with clone.git.custom_environment(
        GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e.org", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e.org"
    ):
        clone.git.commit("-q", "-m", "break the kernel")
    text = work.matrix.read_text()
    text = re.sub(r"url: file://\S+", f"url: file://{clone.working_dir}", text, count=1)  # the source's
    text = re.sub(r"commit: [0-9a-f]{40}", f"commit: {clone.head.commit.hexsha}", text, count=1)  # the source's
    work.matrix.write_text(text)
    assert cli("--matrix", str(work.matrix), "render").code == 0  # the revision label moved
    record_before = work.record.read_bytes()
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 1, r.err[-2000:]
    assert "buildx build failed" in r.err
    logs = list((work.root / "artifacts" / "smoke").glob("*/build.log"))
    assert len(logs) == 1
    log = logs[0].read_text()
    assert "this is not C" in log and "buildx exited with code" in log
    assert str(logs[0]) in r.err  # the error names the kept log
    assert work.record.read_bytes() == record_before


def test_lock_ignores_the_machines_pip_configuration(smoke, tmp_path):
    work = smoke.copy(tmp_path / "lock")
    lock = work.root / "locks" / "smoke" / "requirements.txt"
    before = lock.read_text()
    hostile = dict(
        os.environ,
        PIP_INDEX_URL="http://127.0.0.1:9/simple",
        PIP_FIND_LINKS="/nonexistent",
        PIP_EXTRA_INDEX_URL="http://127.0.0.1:9/extra",
        PIP_CONFIG_FILE="/nonexistent.conf",
    )
    r = cli("--matrix", str(work.matrix), "lock", "--target", "smoke", env=hostile)
    assert r.code == 0, r.err
    text = lock.read_text()
    assert text == before  # same resolution from the matrix's indexes alone
    for forbidden in ("--index-url", "--extra-index-url", "--find-links", "-i ", "127.0.0.1", "file://"):
        assert forbidden not in text
    entries = re.findall(r"^(\S+)==(\S+) \\$", text, re.M)
    names = {n for n, _ in entries}
    assert {"nvidia-cuda-runtime-cu12", "packaging"} <= names
    assert ("nvidia-cuda-runtime-cu12", "12.9.79") in entries
    assert text.count("--hash=sha256:") >= len(entries)


def test_setup_is_idempotent():
    proc = subprocess.run(["bash", str(REPO / "ci" / "setup.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stderr and "starting" not in proc.stderr
