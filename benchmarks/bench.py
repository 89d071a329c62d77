#!/usr/bin/env python3
"""Benchmarks on the smoke target, printed side by side from one run (a script, not a timed test).

    .venv/bin/python benchmarks/bench.py [--rounds 3] [--only NAME ...]

Measures (NAME):
  tool-vs-raw    cold build through the tool vs the same Dockerfile and contexts with raw
                 `docker buildx build` (both --no-cache after pruning the build cache); goal <= 1.05
  noop           the build with unchanged inputs (image served): goal < 0.3 s
  expiry         the rebuild after an expiry change: RUN steps that ran
  render-plan    `render --check` + `plan` for every target: goal < 1 s
  delta          bytes of the layers a source-only bump changes / bytes of all layers above the base,
                 on the smoke; and the projected cu129 share from the rehearsed lock's wheel sizes
  compile-cache  Debian's redis-server on the engine's bridge as sccache's backend: the smoke with
                 heavy compile units built twice on an emptied builder; hit rate and compile step
                 time cold vs warm
Needs what ci/setup.sh sets up (engine, registry; redis-server for compile-cache); makes its own
smoke target in a temp dir and removes it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from builder import buildlog  # noqa: E402

BUILD = str(REPO / ".venv" / "bin" / "build")
MEASURES = ("tool-vs-raw", "noop", "expiry", "render-plan", "delta", "compile-cache")
med = statistics.median


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw)


def timed(*cmd: str, **kw) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = sh(*cmd, **kw)
    return time.perf_counter() - start, proc


def prune() -> None:
    sh("docker", "buildx", "prune", "-af")


def latest_build(root: Path) -> Path:
    return sorted(p for p in (root / "artifacts" / "smoke").iterdir() if (p / "build.log").exists())[-1]


def step_seconds(stderr: str, step: str) -> float:
    return float(re.search(rf"done: smoke: {step}.*\(([\d.]+)s\)$", stderr, re.M).group(1))


class Smoke:
    def __init__(self, work: Path, repository: str) -> None:
        self.work = work
        self.matrix = Path(sh(BUILD, "smoke-init", "--out", str(work), "--repository", repository).stdout.strip())
        self.edit(lambda text: text)

    def edit(self, change) -> None:
        self.matrix.write_text(change(self.matrix.read_text()))
        sh(BUILD, "--matrix", str(self.matrix), "render")
        sh(BUILD, "--matrix", str(self.matrix), "lock", "--target", "smoke")

    def build(self, *args: str) -> tuple[float, subprocess.CompletedProcess]:
        return timed(BUILD, "--matrix", str(self.matrix), "--target", "smoke", *args)


def tool_vs_raw(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    tool, engine_step, raw = [], [], []
    for _ in range(rounds):
        prune()
        t, proc = smoke.build("--force", "--no-cache", "--no-checks", "--keep-context")
        tool.append(t)
        engine_step.append(step_seconds(proc.stderr, "buildx build and push"))
        b = latest_build(smoke.work)
        meta = json.loads((b / "metadata.json").read_text())
        log = (b / "build.log").read_text()
        epoch = re.search(r"SOURCE_DATE_EPOCH=(\d+)", log).group(1)
        lock_sha = sh("sha256sum", str(smoke.work / "locks/smoke/requirements.txt")).stdout.split()[0]
        contexts = [f"source={b / 'source'}"] + [f"tp-{p.name}={p}" for p in sorted((b / "third_party").iterdir())]
        prune()
        cmd = ["docker", "buildx", "build", "--progress", "plain", "--no-cache", "--push",
               "-t", meta["image.name"].rsplit(":", 1)[0] + ":raw", "-f", str(smoke.work / "dockerfiles/smoke/Dockerfile"),
               *[a for c in contexts for a in ("--build-context", c)],
               "--build-arg", f"SOURCE_DATE_EPOCH={epoch}", "--build-arg", "MAX_JOBS=2", "--build-arg", "NVCC_THREADS=1",
               "--build-arg", f"K3_CREATED={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(int(epoch)))}",
               "--build-arg", f"K3_LOCK_SHA256={lock_sha}", str(b / "context")]
        raw.append(timed(*cmd, env=dict(os.environ, SOURCE_DATE_EPOCH=epoch))[0])
    return [("cold build via tool (median s)", f"{med(tool):.2f}", ", ".join(f"{x:.2f}" for x in tool)),
            ("cold build raw buildx (median s)", f"{med(raw):.2f}", ", ".join(f"{x:.2f}" for x in raw)),
            ("ratio tool / raw (whole command)", f"{med(tool) / med(raw):.3f}",
             f"goal <= 1.05; fixed overhead {med(tool) - med(raw):.2f} s"),
            ("engine step inside the tool (median s)", f"{med(engine_step):.2f}",
             f"ratio to raw {med(engine_step) / med(raw):.3f}")]


def noop(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    smoke.build()
    times = [smoke.build()[0] for _ in range(max(5, rounds))]
    return [("no-op build (median s)", f"{med(times):.2f}", "goal < 0.3 s")]


def expiry(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    smoke.build("--no-checks")
    old = re.search(r"expires: '?(\d{4}-\d{2}-\d{2})'?", smoke.matrix.read_text()).group(1)
    smoke.edit(lambda text: text.replace(old, old[:-2] + ("01" if old[-2:] != "01" else "02")))
    t, _ = smoke.build("--no-checks")
    log = (latest_build(smoke.work) / "build.log").read_text()
    ran = len(buildlog.ran(log))
    total = len([s for s in buildlog.steps(log) if s.instruction == "RUN"])
    return [("rebuild after expiry change (s)", f"{t:.2f}", f"RUN steps ran: {ran} of {total}")]


def render_plan(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    times = []
    for _ in range(5):
        t1, _ = timed(BUILD, "render", "--check", cwd=REPO)
        t2, _ = timed(BUILD, "plan", cwd=REPO)
        t3, _ = timed(BUILD, "--matrix", str(smoke.matrix), "plan")
        times.append(t1 + t2 + t3)
    return [("render --check + plan, all targets (median s)", f"{med(times):.2f}", "goal < 1 s")]


def _layers(ref: str) -> list[tuple[str, int]]:
    doc = json.loads(sh("docker", "buildx", "imagetools", "inspect", "--raw", ref).stdout)
    return [(layer["digest"], int(layer["size"])) for layer in doc["layers"]]


def _bump_source(smoke: Smoke) -> None:
    """A source-only change: a new commit on the smoke branch (a comment in a Python file)."""
    src = smoke.work / "k3smoke-src"
    (src / "k3smoke" / "__main__.py").write_text((src / "k3smoke" / "__main__.py").read_text() + "# bumped\n")
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@e.org", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@e.org", GIT_COMMITTER_DATE="2026-11-02T00:00:00+00:00")
    sh("git", "-C", str(src), "commit", "-qam", "bump", env=env)
    commit = sh("git", "-C", str(src), "rev-parse", "HEAD").stdout.strip()
    smoke.edit(lambda text: re.sub(r"(\n      commit: )[0-9a-f]{40}", rf"\g<1>{commit}", text, count=1))


def _cu129_projection() -> str:
    """From the rehearsed cu129 runtime lock: bytes of the app layer (vLLM's wheel, PyPI's as a
    stand-in) / bytes of all the layers the lock fills, by the matrix's grouping."""
    sys.path.insert(0, str(REPO))
    from builder import matrix as matrix_mod
    from builder.buildcontext import layer_of

    target = matrix_mod.load(REPO / "matrix.yaml").target("cu129")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(REPO / "matrix.yaml", Path(tmp) / "matrix.yaml")
        sh(BUILD, "--matrix", str(Path(tmp) / "matrix.yaml"), "lock", "--target", "cu129", "--rehearse")
        lock = (Path(tmp) / "artifacts/cu129/rehearsal/runtime.lock.txt").read_text()
    sizes: dict[str, int] = {}
    for name, version in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", lock, re.M):
        sizes[layer_of(target, name)] = sizes.get(layer_of(target, name), 0) + _wheel_size(name, version)
    app = _wheel_size("vllm", target.source.version)
    total = sum(sizes.values()) + app
    per = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in sorted(sizes.items()))
    return f"cu129 projected: app {app / 1e9:.2f} GB of {total / 1e9:.2f} GB = {app / total:.3f} ({per})"


def _wheel_size(name: str, version: str) -> int:
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as resp:
        files = json.load(resp)["releases"].get(version, [])
    wheels = [f for f in files if f["filename"].endswith(".whl")]
    best = [f for f in wheels if "x86_64" in f["filename"] and ("cp312" in f["filename"] or "abi3" in f["filename"])]
    pick = (best or [f for f in wheels if "none-any" in f["filename"]] or wheels or [{"size": 0}])[0]
    return int(pick["size"])


def delta(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    smoke.build("--no-checks")
    before = _layers(smoke.matrix.read_text().split("registry: ")[1].split()[0] + "/" + smoke.repository + ":smoke")
    _bump_source(smoke)
    smoke.build("--no-checks")
    after = _layers(smoke.matrix.read_text().split("registry: ")[1].split()[0] + "/" + smoke.repository + ":smoke")
    base = len(_layers(re.search(r"runtime: (\S+)", smoke.matrix.read_text()).group(1)))
    above = after[base:]
    new = [(d, n) for d, n in above if (d, n) not in before]
    share = sum(n for _, n in new) / sum(n for _, n in above)
    return [("layers above the base", str(len(above)), f"{len(new)} changed by a source-only bump"),
            ("delta: new bytes / bytes above the base", f"{share:.4f}",
             f"{sum(n for _, n in new)} of {sum(n for _, n in above)} bytes; {_cu129_projection()}")]


def compile_cache(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    host = re.search(r"inet (\d+\.\d+\.\d+\.\d+)", sh("ip", "-4", "addr", "show", "docker0").stdout).group(1)
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    redis = subprocess.Popen(["redis-server", "--bind", host, "--port", str(port), "--save", "",
                              "--appendonly", "no", "--protected-mode", "no"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        smoke.edit(lambda text: text.replace("K3SMOKE_CUDA_VERSION: 12.9.1",
                                             "K3SMOKE_CUDA_VERSION: 12.9.1\n        K3SMOKE_HEAVY_UNITS: '6'")
                   .replace("max_jobs: 2,", "max_jobs: 2, remote_cache: true,").replace("max_jobs: 2\n",
                                                                                          "max_jobs: 2\n      remote_cache: true\n"))
        results = []
        for attempt in ("cold", "warm"):
            prune()
            t, proc = smoke.build("--force", "--no-checks", "--compile-cache", f"redis://{host}:{port}")
            log = (latest_build(smoke.work) / "build.log").read_text()
            rate = re.search(r"compile cache: (\d+) hits, (\d+) misses, hit rate ([\d.]+)", log)
            compile_s = _compile_step_seconds(log)
            results.append((attempt, rate.groups() if rate else ("?", "?", "?"), compile_s, t))
    finally:
        redis.terminate()
        redis.wait(timeout=10)
    (_, (hits, misses, rate), warm_s, _), (_, _, cold_s, _) = results[1], results[0]
    return [("compile cache hit rate (fresh builder)", rate, f"{hits} hits, {misses} misses (redis on {host})"),
            ("compile step cold / warm (s)", f"{cold_s / warm_s:.2f}x",
             f"cold {cold_s:.1f} s, warm {warm_s:.1f} s; 6 heavy units + 7 smoke units, MAX_JOBS=2")]


def _compile_step_seconds(log: str) -> float:
    """The compile RUN step's duration, from buildx's plain progress (#N ... DONE Xs)."""
    for step in buildlog.steps(log):
        if step.instruction == "RUN" and "pip wheel" in step.command:
            return step.seconds
    raise ValueError("no compile step in the log")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", action="append", choices=MEASURES, help="run only this measure (repeatable)")
    args = ap.parse_args()
    chosen = args.only or list(MEASURES)
    rows = []
    for name in chosen:
        work = Path(tempfile.mkdtemp(prefix=f"k3-bench-{name}-"))
        try:
            smoke = Smoke(work, f"k3/bench-{name}")
            smoke.repository = f"k3/bench-{name}"
            rows += globals()[name.replace("-", "_")](smoke, args.rounds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"machine: {platform.node()} {platform.machine()}, {sh('nproc').stdout.strip()} cores, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // 2**30} GiB, "
          f"docker {sh('docker', 'version', '--format', '{{.Server.Version}}').stdout.strip()}, "
          f"buildx {sh('docker', 'buildx', 'version').stdout.split()[1]}, rounds {args.rounds}")
    print(f"{'measure':<46}{'value':>12}  note")
    for measure, value, note in rows:
        print(f"{measure:<46}{value:>12}  {note}")


if __name__ == "__main__":
    main()
