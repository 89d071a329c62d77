#!/usr/bin/env python3
"""The adversary's rehearsal: inject each fault into a smoke build on the real engine and
registry, then score three things, as the attack that opened issue 13 did.

    .venv/bin/python ci/attack.py [--only NAME ...] [--keep]

- survived: the tool exited with the code docs/guarantees.md maps the fault to, in one line without a
  traceback, left no buildx process or check container behind, and the next ordinary run works;
- consistent: afterwards the record set passes offline `build verify` (the old set or the new
  one, never a mix) and no journal or temporary file is left under locks/;
- secret hits: planted secret values (a multi-line file secret, credential-named environment
  variables, a registry password) found in any output, artifact, evidence archive or image blob.

Every scenario works on its own copy of one smoke workspace (made with `build smoke-init`, built
once); the smoke's registry repository and the extra registries are removed at the end. Takes
about 10 minutes on 2 cores. Not part of `.ci/run`: each defect it covers is an integration test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from builder.config.contract import CONTAINER_LABEL  # noqa: E402  (after sys.path)
from tests.integration.conftest import LocalRegistry, Run, Smoke, delete_repository  # noqa: E402  (the suite's own)

BUILD = str(REPO / ".venv" / "bin" / "build")
REGISTRY = "127.0.0.1:5000"
PLANTED: list[str] = []  # every secret value the attack hands the tool
OUTPUTS: list[str] = []  # everything the tool printed, for the secret scan


def cli(*args: str, env: dict | None = None, timeout: float = 600) -> Run:
    proc = subprocess.run([BUILD, *args], capture_output=True, text=True, env=env, timeout=timeout)
    OUTPUTS.append(proc.stdout + proc.stderr)
    return Run(proc.returncode, proc.stdout, proc.stderr)


class Started:
    """A tool run in the background whose stderr is read as it comes (to time a fault)."""

    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.proc = subprocess.Popen([BUILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.err: list[str] = []
        self._reader = threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    def wait_for(self, pattern: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, "".join(self.err), re.M):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the run ended before {pattern!r}: {''.join(self.err)[-1500:]}")
            time.sleep(0.01)
        raise RuntimeError(f"no {pattern!r} within {timeout}s")

    def finish(self, timeout: float = 300) -> Run:
        out = self.proc.stdout.read()
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        err = "".join(self.err)
        OUTPUTS.append(out + err)
        return Run(self.proc.returncode, out, err)


@dataclass
class Work(Smoke):
    """A smoke checkout (the suite's `Smoke`: root, matrix, record, copy) the attack runs builds in."""

    def build(self, *extra: str, env: dict | None = None) -> Run:
        return cli("--matrix", str(self.matrix), "--target", "smoke", *extra, env=env)

    def start(self, *extra: str, env: dict | None = None) -> Started:
        return Started("--matrix", str(self.matrix), "--target", "smoke", "--force", "--no-cache", *extra, env=env)

    def edit(self, old: str, new: str) -> None:
        text = self.matrix.read_text()
        assert old in text, old
        self.matrix.write_text(text.replace(old, new, 1))
        assert cli("--matrix", str(self.matrix), "render").code == 0


@dataclass
class Outcome:
    name: str
    survived: bool
    consistent: bool
    notes: list[str] = field(default_factory=list)


class Verdict:
    """Collects the reasons a scenario did not survive; a scenario is a list of expectations."""

    def __init__(self, name: str, work: Work) -> None:
        self.name, self.work, self.notes = name, work, []

    def expect(self, ok: bool, why: str) -> None:
        if not ok:
            self.notes.append(why)

    def exited(self, run: Run, code: int, what: str) -> None:
        self.expect(run.code == code, f"{what}: exit {run.code}, expected {code}: {run.err.strip()[-300:]}")
        self.expect("Traceback" not in run.err, f"{what}: a traceback")
        last = [line for line in run.err.strip().splitlines() if line.strip()][-1:] or [""]
        if code not in (0, -9):
            self.expect(last[0].startswith("error: "), f"{what}: the last line is not the error: {last[0][:200]}")

    def recovers(self, env: dict | None = None) -> None:
        again = self.work.build(env=env)
        self.expect(again.code == 0, f"the next ordinary run failed: exit {again.code}: {again.err.strip()[-300:]}")

    def outcome(self) -> Outcome:
        leftovers = [
            str(p)
            for p in (self.work.root / "locks").rglob("*")
            if p.name.endswith((".tmp", ".pending")) or "journal" in p.name
        ]
        checked = cli("--matrix", str(self.work.matrix), "verify", "--target", "smoke")
        consistent = checked.code == 0 and not leftovers
        notes = list(self.notes)
        if checked.code != 0:
            notes.append(f"offline verify: exit {checked.code}: {checked.err.strip()[-300:]}")
        if leftovers:
            notes.append(f"left over: {leftovers}")
        strays = _stray_processes(self.work)
        return Outcome(self.name, not self.notes and not strays, consistent, notes + strays)


def _stray_processes(work: Work) -> list[str]:
    marker = str(work.root).encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in argv and b"attack.py" not in argv:
            found.append(f"process {entry.name} still running: {argv[:120]!r}")
    containers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={CONTAINER_LABEL}"], capture_output=True, text=True
    ).stdout.split()
    return found + [f"check container left: {c}" for c in containers]


# --- the scenarios ------------------------------------------------------------------------------


def daemon_down(v: Verdict) -> None:
    env = dict(os.environ, DOCKER_HOST=f"unix://{v.work.root}/no-docker.sock")
    v.exited(v.work.build("--force", env=env), 3, "build with no daemon")
    v.recovers()


def registry_down_at_start(v: Verdict, extra: LocalRegistry) -> None:
    _move_to(v, extra)
    extra.stop()
    v.exited(v.work.build("--force", "--no-checks"), 3, "build with the registry down")
    extra.start()
    v.recovers()


def registry_killed_during_push(v: Verdict, extra: LocalRegistry) -> None:
    _registry_killed(v, extra, r"\[runtime \d+/\d+\] COPY", "the push")


def registry_killed_during_attach(v: Verdict, extra: LocalRegistry) -> None:
    _registry_killed(v, extra, r"==> smoke: SBOM and provenance", "the attach")


def _registry_killed(v: Verdict, extra: LocalRegistry, when: str, what: str) -> None:
    _move_to(v, extra)
    run = v.work.start("--no-checks")
    run.wait_for(when)
    extra.stop()
    r = run.finish()
    v.exited(r, 3, f"registry killed during {what}")
    v.expect("build.log" in r.err, "the error does not name the build log")
    extra.start()
    v.recovers()


def _move_to(v: Verdict, extra: LocalRegistry) -> None:
    v.work.edit(f"registry: {REGISTRY}", f"registry: {extra.address}")
    first = v.work.build()
    v.expect(first.code == 0, f"the first build to {extra.address} failed: {first.err[-300:]}")


def signal_during_build(v: Verdict) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        run = v.work.start("--no-checks")
        run.wait_for(r"\[build \d+/\d+\] RUN")
        run.proc.send_signal(sig)
        v.exited(run.finish(), 130, f"{sig.name} during buildx")
    v.recovers()


def sigkill_during_build(v: Verdict) -> None:
    run = v.work.start("--no-checks")
    run.wait_for(r"\[build \d+/\d+\] RUN")
    run.proc.kill()
    run.finish()
    time.sleep(1)  # the orphaned buildx client notices its closed pipe
    v.recovers()


def signal_during_checks(v: Verdict) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        run = v.work.start()
        run.wait_for(r"==> smoke: image checks on")
        time.sleep(0.3)
        run.proc.send_signal(sig)
        v.exited(run.finish(), 130, f"{sig.name} during the checks")
    v.recovers()


def sigkill_while_recording(v: Verdict) -> None:
    for delay in (0.0, 0.2, 0.5, 1.0):
        run = v.work.start()
        run.wait_for(r"==> smoke: SBOM and provenance")
        time.sleep(delay)
        run.proc.kill()
        run.finish()
        problems = cli("--matrix", str(v.work.matrix), "--target", "smoke", "--no-checks")  # rolls the journal
        v.expect(problems.code in (0, 2), f"after SIGKILL +{delay}s: exit {problems.code}: {problems.err[-300:]}")
    v.recovers()


def concurrent_builds(v: Verdict) -> None:
    first = v.work.start()
    first.wait_for(r"==> smoke: buildx build")
    second = v.work.build("--force", "--no-checks")
    v.exited(second, 75, "a second build of the same target")
    v.exited(first.finish(), 0, "the first build")


def corrupt_record(v: Verdict) -> None:
    good = v.work.record.read_bytes()
    for damaged in (good[: len(good) // 2], b"[]", good.replace(b'"sha256:', b'"sha256:0', 1)):
        v.work.record.write_bytes(damaged)
        r = v.work.build()
        v.exited(r, 2, "a damaged image.json")
        v.expect(v.work.record.read_bytes() == damaged, "the damaged record was written over")
    v.work.record.write_bytes(good)
    v.recovers()


def corrupt_cache(v: Verdict) -> None:
    env = dict(os.environ, K3_CACHE_DIR=str(v.work.root / "cache"))
    v.exited(v.work.build("--force", "--no-checks", env=env), 0, "the build that fills a private cache")
    wheels = sorted((v.work.root / "cache").rglob("*.whl"))
    v.expect(bool(wheels), "no wheel in the cache")
    for wheel in wheels[:3]:
        wheel.write_bytes(wheel.read_bytes()[:-100] + b"\0" * 100)
    v.exited(v.work.build("--force", env=env), 0, "a build over a corrupted cache")


def force_push(v: Verdict) -> None:
    original = v.work.matrix.read_text()
    src = _own_source(v)
    env = dict(
        os.environ,
        K3_ALLOW_FILE_URLS="1",
        GIT_AUTHOR_NAME="x",
        GIT_AUTHOR_EMAIL="x@e.org",
        GIT_COMMITTER_NAME="x",
        GIT_COMMITTER_EMAIL="x@e.org",
    )
    branch = re.search(r"branch: (\S+)", original).group(1)
    git = ["git", "-C", str(src)]
    subprocess.run([*git, "checkout", "-q", branch], check=True, env=env, capture_output=True)
    subprocess.run([*git, "checkout", "-q", "--orphan", "rewritten"], check=True, env=env)
    subprocess.run([*git, "commit", "-qm", "history rewritten"], check=True, env=env)
    subprocess.run([*git, "branch", "-qfM", "rewritten", branch], check=True, env=env)
    before = v.work.matrix.read_bytes()
    v.exited(cli("--matrix", str(v.work.matrix), "track", "--target", "smoke", env=env), 2, "track after a force-push")
    v.expect(v.work.matrix.read_bytes() == before, "track changed the matrix")
    record = v.work.record.read_bytes()
    v.exited(v.work.build("--force", env=env), 2, "a build whose branch no longer carries the pin")
    v.expect(v.work.record.read_bytes() == record, "the record changed")
    v.work.matrix.write_text(original)
    assert cli("--matrix", str(v.work.matrix), "render").code == 0
    v.recovers()


def _own_source(v: Verdict) -> Path:
    """A clone of the smoke's source repository for this scenario alone (the others share one)."""
    text = v.work.matrix.read_text()
    url = re.search(r"url: (file://\S+)", text).group(1)
    src = v.work.root / "source-copy"
    subprocess.run(["git", "clone", "-q", url.removeprefix("file://"), str(src)], check=True)
    v.work.edit(url, f"file://{src}")
    return src


def secrets_in_the_build(v: Verdict) -> None:
    sid = f"echo_netrc_{secrets.token_hex(3)}"
    value = (
        f"machine pypi.example.org\nlogin k3bot\npassword pw-{secrets.token_hex(12)}\n"
        f"token tok-{secrets.token_hex(12)}\n"
    )
    PLANTED.extend(line.split()[-1] for line in value.splitlines() if line.split()[0] in ("password", "token"))
    secret_file = v.work.root / "netrc"
    secret_file.write_text(value)
    v.work.edit("compile:\n", f"compile:\n      secrets:\n      - {sid}\n")
    r = v.work.build("--secret", f"id={sid},src={secret_file}")
    v.exited(r, 0, "a build with a multi-line secret")
    v.expect("***" in r.err, "the build step's print of the secret did not reach the output redacted")
    secret_file.unlink()
    leaked = f"env-{secrets.token_hex(10)}"
    PLANTED.append(leaked)
    misuse = v.work.build("--secret", f"id={sid},env={leaked}", "--json")
    v.exited(misuse, 2, "--secret env=<the value itself>")
    _scan_image(r.out.strip().splitlines()[-1] if r.out.strip() else "", v)


def _scan_image(ref: str, v: Verdict) -> None:
    """Every blob of the image and its attachments, from the registry's own API."""
    if "@" not in ref:
        v.expect(False, f"no image reference printed: {ref!r}")
        return
    name, digest = ref.split("@")
    host, repo = name.split("/", 1)
    accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
    req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/{digest}", headers={"Accept": accept})
    manifest = json.load(urllib.request.urlopen(req, timeout=30))
    for blob in [manifest["config"], *manifest["layers"]]:
        data = urllib.request.urlopen(f"http://{host}/v2/{repo}/blobs/{blob['digest']}", timeout=60).read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        OUTPUTS.append(data.decode("utf-8", errors="replace"))


def evidence_environment(v: Verdict) -> None:
    names = ("DOCKER_PASS", "GH_PAT", "CI_JOB_JWT", "HF_HUB_ACCESS", "NPM_AUTH", "SOME_API_KEY")
    env = dict(os.environ)
    for name in names:
        env[name] = f"{name.lower()}-{secrets.token_hex(10)}"
        PLANTED.append(env[name])
    ref = json.loads(v.work.record.read_text())["image"]
    out = v.work.root / "evidence"
    out.mkdir()
    r = cli("--matrix", str(v.work.matrix), "evidence", "--target", "smoke", "--image", ref, "--out", str(out), env=env)
    v.exited(r, 0, "evidence with credential-named variables set")
    for archive in out.glob("*.tar.gz"):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    OUTPUTS.append(tar.extractfile(member).read().decode("utf-8", errors="replace"))


def hostile_inputs(v: Verdict) -> None:
    v.exited(cli("--matrix", "/dev/zero", "plan", timeout=30), 2, "--matrix /dev/zero")
    v.exited(cli("--matrix", "/dev/urandom", "plan", timeout=30), 2, "--matrix /dev/urandom")
    fifo = v.work.root / "fifo"
    os.mkfifo(fifo)
    v.exited(
        cli("--matrix", str(v.work.matrix), "doctor", "--nvidia-smi-file", str(fifo), timeout=30),
        2,
        "--nvidia-smi-file FIFO",
    )
    v.exited(
        cli("--matrix", str(v.work.matrix), "--target", "smoke", "--secret", "id=x,src=/dev/zero", timeout=30),
        2,
        "--secret src=/dev/zero",
    )
    v.exited(v.work.build("--max-jobs", "-5"), 2, "--max-jobs -5")
    v.exited(cli("--matrix", str(v.work.matrix), "--target", "nosuch"), 2, "an unknown target")
    twice = cli("--matrix", str(v.work.matrix), "--target", "smoke", "--target", "smoke", "--jobs", "2")
    v.exited(twice, 0, "the same target twice")
    out = v.work.root / "file-not-dir"
    out.write_text("x")
    v.exited(cli("--matrix", str(v.work.matrix), "evidence", "--out", str(out)), 2, "evidence --out a file")
    v.exited(cli("--matrix", str(v.work.matrix), "verify", "--target", "smoke", "--json"), 0, "verify still passes")


def authenticated_registry(v: Verdict, root: Path) -> None:
    password = "k3-" + secrets.token_urlsafe(18)
    PLANTED.append(password)
    made = subprocess.run(
        ["htpasswd", "-iBn", "k3attacker"], input=password, capture_output=True, text=True, check=True
    )
    (root / "htpasswd").write_text(made.stdout)
    auth = LocalRegistry(root, htpasswd=root / "htpasswd")
    auth.start()
    try:
        v.work.edit(f"registry: {REGISTRY}", f"registry: {auth.address}")
        config = root / "docker-config"
        config.mkdir()
        (config / "config.json").write_text("{}")
        env = dict(os.environ, DOCKER_CONFIG=str(config))
        v.exited(v.work.build("--no-checks", env=env), 3, "a registry that needs credentials, none given")
        v.work.edit(f"registry: {auth.address}", f"registry: {REGISTRY}")
    finally:
        auth.stop()
    v.recovers()


# --- upstream is untrusted input (issue 21): hostile commits pushed to the smoke's own repos ----


def _doc(v: Verdict) -> dict:
    import yaml

    return yaml.safe_load(v.work.matrix.read_text())["targets"]["smoke"]


def _repin(v: Verdict, branch: str, commit: str, kernels: str | None = None) -> str:
    """Pin the workspace's matrix to a pushed commit; returns the original text (to restore)."""
    import yaml

    original = v.work.matrix.read_text()
    head, _, _ = original.partition("version: 1")
    doc = yaml.safe_load(original)
    src = doc["targets"]["smoke"]["source"]
    src["branch"], src["commit"] = branch, commit
    if kernels:
        src["third_party"]["k3kernels"].update(commit=kernels, ref=kernels)
    v.work.matrix.write_text(head + yaml.safe_dump(doc, sort_keys=False))
    assert cli("--matrix", str(v.work.matrix), "render").code == 0
    return original


def _restore(v: Verdict, original: str) -> None:
    v.work.matrix.write_text(original)
    assert cli("--matrix", str(v.work.matrix), "render").code == 0


def _hostile_source(v: Verdict, change) -> tuple[str, str]:
    from tests.integration.test_hostile_upstream import push_commit

    doc = _doc(v)
    branch = f"hostile-{secrets.token_hex(3)}"
    repo = Path(doc["source"]["url"].removeprefix("file://"))
    return branch, push_commit(repo, v.work.root / f"{branch}-src", branch, change, base=doc["source"]["commit"])


def hostile_submodule_url(v: Verdict) -> None:
    from tests.integration.test_hostile_upstream import _git, push_commit

    canary = v.work.root / "PWNED"
    doc = _doc(v)
    tp = doc["source"]["third_party"]["k3kernels"]
    branch = f"hostile-{secrets.token_hex(3)}"

    def gitmodules(tree: Path) -> None:
        with (tree / ".gitmodules").open("a") as fh:
            fh.write(f'[submodule "evil"]\n\tpath = third-party/evil\n\turl = --upload-pack=touch {canary}\n')
        _git(tree, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},third-party/evil")

    kernels = push_commit(Path(tp["url"].removeprefix("file://")), v.work.root / "k-src", branch, gitmodules)

    def names_it(tree: Path) -> None:
        cmake = tree / "CMakeLists.txt"
        cmake.write_text(cmake.read_text().replace(tp["commit"], kernels))

    src_branch, commit = _hostile_source(v, names_it)
    original = _repin(v, src_branch, commit, kernels)
    v.exited(v.work.build("--force"), 2, "a submodule URL that is a git option")
    v.expect(not canary.exists(), "the submodule URL ran a command on the host")
    _restore(v, original)
    v.recovers()


def hostile_requirements(v: Verdict) -> None:
    planted = f"environ-{secrets.token_hex(10)}"
    PLANTED.append(planted)

    def reads_environ(tree: Path) -> None:
        req = tree / "requirements.txt"
        req.write_text(req.read_text() + "--requirement=/proc/self/environ\n")

    branch, commit = _hostile_source(v, reads_environ)
    original = _repin(v, branch, commit)
    locks = {p.name: p.read_bytes() for p in (v.work.root / "locks" / "smoke").iterdir()}
    r = cli(
        "--json",
        "--matrix",
        str(v.work.matrix),
        "lock",
        "--target",
        "smoke",
        env=dict(os.environ, K3_ATTACK_PLANTED=planted),
    )
    v.exited(r, 2, "a requirements line naming /proc/self/environ")
    v.expect(
        locks == {p.name: p.read_bytes() for p in (v.work.root / "locks" / "smoke").iterdir()}, "the locks changed"
    )
    _restore(v, original)
    v.recovers()


def secret_copied_into_image(v: Verdict) -> None:
    sid = f"echo_leak_{secrets.token_hex(3)}"
    value = f"leak-{secrets.token_hex(12)}"
    PLANTED.append(value)

    def copies_secret(tree: Path) -> None:
        setup = tree / "setup.py"
        setup.write_text(
            setup.read_text().replace(
                "        echo_test_secrets()\n",
                (
                    "        echo_test_secrets()\n"
                    "        for p in sorted(Path('/run/secrets').glob('echo_*')):\n"
                    "            Path(self.build_lib, 'k3smoke', 'leak.txt').write_text(p.read_text())\n"
                ),
                1,
            )
        )

    branch, commit = _hostile_source(v, copies_secret)
    original = _repin(v, branch, commit)
    v.work.edit("compile:\n", f"compile:\n      secrets:\n      - {sid}\n")
    r = v.work.build("--secret", f"id={sid},env=K3_ATTACK_LEAK", env=dict(os.environ, K3_ATTACK_LEAK=value))
    v.exited(r, 1, "a setup.py that copies a build secret into the wheel")
    v.expect("a build secret is in layer" in r.err, "the layer scan did not name the leak")
    _restore(v, original)
    v.recovers()


def lock_during_build(v: Verdict) -> None:
    build = v.work.start()  # with its checks: the record it writes must verify
    build.wait_for(r"==> smoke: buildx build ")  # the engine has the build (then the scan, the push)
    v.exited(cli("--matrix", str(v.work.matrix), "lock", "--target", "smoke"), 75, "build lock during a build")
    v.exited(build.finish(), 0, "the build the lock raced")


def full_record_dir(v: Verdict) -> None:
    locks = v.work.root / "locks" / "smoke"
    saved = {p.name: p.read_bytes() for p in locks.iterdir() if p.is_file()}
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(locks)], capture_output=True).returncode:
        v.notes.append("scenario error: cannot mount a tmpfs here")
        return
    try:
        for name, data in saved.items():
            (locks / name).write_bytes(data)
        v.exited(v.work.build("--force"), 74, "locks/<target> nearly full")
        subprocess.run(["mount", "-o", "remount,ro", str(locks)], check=True)
        v.exited(v.work.build("--force"), 74, "locks/<target> read-only")
    finally:
        subprocess.run(["umount", str(locks)], capture_output=True)
    v.recovers()


# --- the run ------------------------------------------------------------------------------------

SCENARIOS = [
    "daemon_down",
    "registry_down_at_start",
    "registry_killed_during_push",
    "registry_killed_during_attach",
    "signal_during_build",
    "sigkill_during_build",
    "signal_during_checks",
    "sigkill_while_recording",
    "concurrent_builds",
    "corrupt_record",
    "corrupt_cache",
    "force_push",
    "secrets_in_the_build",
    "evidence_environment",
    "hostile_inputs",
    "authenticated_registry",
    "hostile_submodule_url",
    "hostile_requirements",
    "secret_copied_into_image",
    "lock_during_build",
    "full_record_dir",
]


def _base(root: Path) -> Work:
    repository = f"k3/attack-{secrets.token_hex(3)}"
    made = cli("smoke-init", "--out", str(root / "base"), "--registry", REGISTRY, "--repository", repository)
    if made.code != 0:
        sys.exit(f"smoke-init failed (run ci/setup.sh first): {made.err.strip()[-500:]}")
    work = Work(root / "base", root / "base" / "matrix.yaml", repository)
    for args in (("render",), ("lock", "--target", "smoke"), ("--target", "smoke")):
        r = cli("--matrix", str(work.matrix), *args)
        if r.code != 0:
            sys.exit(f"the base build failed: {r.err.strip()[-500:]}")
    return work


def _copy(base: Work, dest: Path) -> Work:
    copy = base.copy(dest)
    return Work(copy.root, copy.matrix, copy.repository)


def run_one(name: str, base: Work, root: Path) -> Outcome:
    v = Verdict(name, _copy(base, root / name))
    fn = globals()[name]
    extra = LocalRegistry(root) if "registry_" in name and name != "authenticated_registry" else None
    try:
        if extra:
            extra.start()
            fn(v, extra)
        elif name == "authenticated_registry":
            fn(v, root / name)
        else:
            fn(v)
    except Exception as exc:  # the scenario itself could not run: counted as not survived
        v.notes.append(f"scenario error: {type(exc).__name__}: {exc}")
    finally:
        if extra:
            extra.stop()
    return v.outcome()


def secret_hits(root: Path) -> list[str]:
    """Where planted values were found. A canary file is planted too and must be found (and is
    then left out), so a scan that sees nothing cannot pass as a clean one."""
    canary = f"canary-{secrets.token_hex(8)}"
    PLANTED.append(canary)
    (root / "canary.gz").write_bytes(gzip.compress(canary.encode()))
    hits = [f"output #{i}" for i, text in enumerate(OUTPUTS) for value in PLANTED if value in text]
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 50_000_000:
            data = path.read_bytes()
            if path.suffix == ".gz":
                try:
                    data = gzip.decompress(data)
                except OSError:
                    pass
            hits += [str(path) for value in PLANTED if value.encode() in data and path.name != "netrc"]
    if str(root / "canary.gz") not in hits:
        raise RuntimeError("the secret scan did not find its canary: it would not find a leak either")
    return [hit for hit in hits if hit != str(root / "canary.gz")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=SCENARIOS, help="run only this scenario (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="k3-attack-"))
    base = _base(root)
    outcomes = []
    try:
        for name in args.only or SCENARIOS:
            started = time.monotonic()
            outcome = run_one(name, base, root)
            outcomes.append(outcome)
            print(
                f"{name:<32} survived={'yes' if outcome.survived else 'NO ':<3} "
                f"consistent={'yes' if outcome.consistent else 'NO'} ({time.monotonic() - started:.0f}s)",
                flush=True,
            )
            for note in outcome.notes:
                print(f"    {note}", flush=True)
        hits = secret_hits(root)
    finally:
        delete_repository(base.repository)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    n = len(outcomes)
    print(
        f"faults survived {sum(o.survived for o in outcomes)}/{n}, records consistent "
        f"{sum(o.consistent for o in outcomes)}/{n}, secret hits {len(hits)}"
    )
    for hit in hits[:20]:
        print(f"    secret found in {hit}")
    return 0 if all(o.survived and o.consistent for o in outcomes) and not hits else 1


if __name__ == "__main__":
    sys.exit(main())
