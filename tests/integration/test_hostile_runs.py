"""Runs attacked the way an adversary would (issue: records that cannot lie, interrupts that leave
nothing behind), on the real engine and registry: a signal while the checks run, a stale check
container, two checkouts racing on an empty cache, a record edited to lie, a build without checks,
and each command's exit code when something is out of reach or malformed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.integration.conftest import BUILD, cli

LABEL = "io.k3-cu129.container-of-pid"


def _our_containers() -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL}"], capture_output=True, text=True)
    return out.stdout.split()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_checks_exits_130_and_leaves_no_container(built, tmp_path, sig):
    smoke, _ = built
    work = smoke.copy(tmp_path / "sig")
    before = work.record.read_bytes()
    err = (tmp_path / "err").open("w")
    proc = subprocess.Popen(
        [BUILD, "--matrix", str(work.matrix), "--target", "smoke", "--force"], stdout=subprocess.DEVNULL, stderr=err
    )
    deadline = time.monotonic() + 1800  # against a hang only: on a loaded machine the build takes long
    while "image checks on" not in (tmp_path / "err").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()[-2000:]
        time.sleep(0.05)
    time.sleep(0.3)  # inside the checks: the container is starting or running
    proc.send_signal(sig)
    code = proc.wait(timeout=120)
    assert code == 130, (tmp_path / "err").read_text()[-2000:]
    assert not [
        c
        for c in _our_containers()
        if subprocess.run(
            ["docker", "inspect", "-f", f'{{{{index .Config.Labels "{LABEL}"}}}}', c], capture_output=True, text=True
        ).stdout.strip()
        == str(proc.pid)
    ]
    assert work.record.read_bytes() == before


def test_a_check_container_a_killed_run_left_is_removed_at_the_next_run(built):
    smoke, ref = built
    stale = subprocess.run(
        ["docker", "run", "-d", "--label", f"{LABEL}=999999999", "--entrypoint", "sleep", ref, "infinity"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke")
        assert r.code == 0, r.err[-2000:]
        assert stale not in " ".join(_our_containers()) and stale[:12] not in " ".join(_our_containers())
    finally:
        subprocess.run(["docker", "rm", "-f", stale], capture_output=True)


def test_two_checkouts_sharing_an_empty_cache_both_build(built, tmp_path):
    smoke, _ = built
    env = dict(os.environ, K3_CACHE_DIR=str(tmp_path / "empty-cache"))
    procs = []
    for name in ("one", "two"):
        work = smoke.variant(tmp_path / name, f"race-{name}")
        procs.append(
            subprocess.Popen(
                [BUILD, "--matrix", str(work.matrix), "--target", "smoke", "--no-checks"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        assert "Traceback" not in err
    entries = list((tmp_path / "empty-cache" / "wheelhouse").iterdir())
    assert not [e for e in entries if e.name.endswith(".partial")]


def test_a_record_whose_digest_was_edited_is_refused_not_rebuilt_over(built, tmp_path):
    smoke, _ = built
    work = smoke.copy(tmp_path / "lie")
    doc = json.loads(work.record.read_text())
    doc["digest"] = "sha256:" + "1" * 64
    doc["image"] = doc["image"].split("@")[0] + "@" + doc["digest"]
    work.record.write_text(json.dumps(doc, indent=2) + "\n")
    edited = work.record.read_bytes()
    r = cli("--matrix", str(work.matrix), "--target", "smoke")
    assert r.code == 2 and "the record set does not hold" in r.err and "describes" in r.err
    assert work.record.read_bytes() == edited  # the evidence stays
    v = cli("--matrix", str(work.matrix), "verify", "--target", "smoke")
    assert v.code == 1 and "image.json <-> audit files" in v.err


def test_a_build_without_checks_says_so_and_verify_fails_it(built, tmp_path):
    smoke, _ = built
    work = smoke.variant(tmp_path / "unchecked", "unchecked")
    r = cli("--matrix", str(work.matrix), "--target", "smoke", "--force", "--no-checks")
    assert r.code == 0, r.err[-2000:]
    assert json.loads(work.record.read_text())["checks"] == "skipped"
    v = cli("--matrix", str(work.matrix), "verify", "--target", "smoke")
    assert v.code == 1 and "the image was never checked" in v.err


def test_exit_codes_when_out_of_reach_or_malformed(built, tmp_path):
    smoke, ref = built
    no_daemon = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no.sock")
    cases = [
        (("doctor", "--image", "not a reference!", "--nvidia-smi-file", "/dev/null"), None, 2),
        (("doctor", "--image", "127.0.0.1:9/k3/x:y"), None, 3),  # registry out of reach
        (("doctor", "--image", "k3-local-only:tag"), no_daemon, 3),  # engine out of reach
        (("compare", "--image", ref, "--against", "127.0.0.1:9/k3/x:y"), None, 3),
        (("doctor", "--image", f"127.0.0.1:5000/{smoke.repository}:no-such-tag"), None, 2),
    ]
    for args, env, want in cases:
        r = cli("--matrix", str(smoke.matrix), *args, env=env)
        assert r.code == want, (args, r.code, r.err[-500:])
        assert "Traceback" not in r.err and len(r.err.strip().splitlines()) >= 1
        assert r.err.strip().splitlines()[-1].startswith("error: "), (args, r.err[-300:])
