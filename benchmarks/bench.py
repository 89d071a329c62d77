#!/usr/bin/env python3
"""Benchmarks on the smoke target, printed side by side (a script, not a timed test).

    .venv/bin/python benchmarks/bench.py [--rounds 3]

1. cold build through the tool vs the same rendered Dockerfile and context with raw
   `docker buildx build` (both --no-cache after pruning the engine's build cache): ratio, goal <= 1.05;
2. the no-op build (unchanged inputs, image served): time;
3. the rebuild after an expiry change: RUN steps that ran, time;
4. `render --check` + `plan` for every target: time.
Needs what ci/setup.sh sets up (engine, registry); makes its own smoke target in a temp dir.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from builder import buildlog  # noqa: E402

BUILD = str(REPO / ".venv" / "bin" / "build")


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw)


def timed(*cmd: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = sh(*cmd)
    return time.perf_counter() - start, proc


def prune() -> None:
    sh("docker", "buildx", "prune", "-af")


def latest_build(root: Path) -> Path:
    return sorted(p for p in (root / "artifacts" / "smoke").iterdir() if (p / "build.log").exists())[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="k3-bench-"))
    matrix = Path(sh(BUILD, "smoke-init", "--out", str(work), "--repository", "k3/bench").stdout.strip())
    sh(BUILD, "--matrix", str(matrix), "render")
    sh(BUILD, "--matrix", str(matrix), "lock", "--target", "smoke")
    tool, engine_step, raw = [], [], []
    for _ in range(args.rounds):
        prune()
        t, proc = timed(BUILD, "--matrix", str(matrix), "--target", "smoke", "--force", "--no-cache", "--no-checks")
        tool.append(t)
        engine_step.append(float(re.search(r"done: smoke: buildx build and push .*\(([\d.]+)s\)$", proc.stderr,
                                           re.M).group(1)))
        b = latest_build(work)
        meta = json.loads((b / "metadata.json").read_text())
        log = (b / "build.log").read_text()
        build_args = dict(re.findall(r"^\[k3-builder\] (MAX_JOBS)=(\d+)", log, re.M))
        epoch = re.search(r"SOURCE_DATE_EPOCH=(\d+)", log).group(1)
        lock_sha = sh("sha256sum", str(work / "locks/smoke/requirements.txt")).stdout.split()[0]
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))
        prune()
        cmd = ["docker", "buildx", "build", "--progress", "plain", "--no-cache", "--push",
               "-t", meta["image.name"].rsplit(":", 1)[0] + ":raw", "-f", str(work / "dockerfiles/smoke/Dockerfile"),
               "--build-context", f"source={b / 'source'}", "--build-arg", f"SOURCE_DATE_EPOCH={epoch}",
               "--build-arg", f"MAX_JOBS={build_args.get('MAX_JOBS', '2')}", "--build-arg", "NVCC_THREADS=1",
               "--build-arg", f"K3_CREATED={created}", "--build-arg", f"K3_LOCK_SHA256={lock_sha}",
               str(b / "context")]
        t, _ = timed(*cmd)
        raw.append(t)
    noop = [timed(BUILD, "--matrix", str(matrix), "--target", "smoke")[0] for _ in range(5)]
    text = matrix.read_text()
    old = re.search(r"expires: '?(\d{4}-\d{2}-\d{2})'?", text).group(1)
    matrix.write_text(text.replace(old, old[:-2] + ("01" if old[-2:] != "01" else "02")))
    sh(BUILD, "--matrix", str(matrix), "render")
    t_expiry, _ = timed(BUILD, "--matrix", str(matrix), "--target", "smoke", "--no-checks")
    log = (latest_build(work) / "build.log").read_text()
    ran = len(buildlog.ran(log))
    total_runs = len([s for s in buildlog.steps(log) if s.instruction == "RUN"])
    rp = []
    for _ in range(5):
        t1, _ = timed(BUILD, "render", "--check")
        t2, _ = timed(BUILD, "plan", "--target", "cu129")
        t3, _ = timed(BUILD, "--matrix", str(matrix), "plan", "--target", "smoke")
        rp.append(t1 + t2 + t3)
    med = statistics.median
    print(f"machine: {platform.node()} {platform.machine()}, {sh('nproc').stdout.strip()} cores, "
          f"docker {sh('docker', 'version', '--format', '{{.Server.Version}}').stdout.strip()}, "
          f"{sh('docker', 'buildx', 'version').stdout.split()[1]}, rounds {args.rounds}")
    print(f"{'measure':<44}{'value':>12}  note")
    print(f"{'cold build via tool (median s)':<44}{med(tool):>12.2f}  {', '.join(f'{x:.2f}' for x in tool)}")
    print(f"{'cold build raw buildx (median s)':<44}{med(raw):>12.2f}  {', '.join(f'{x:.2f}' for x in raw)}")
    print(f"{'ratio tool / raw (whole command)':<44}{med(tool) / med(raw):>12.3f}  goal <= 1.05; "
          f"fixed overhead {med(tool) - med(raw):.2f} s (start-up, preflight, registry checks, SBOM, provenance)")
    print(f"{'engine step inside the tool (median s)':<44}{med(engine_step):>12.2f}  "
          f"ratio to raw {med(engine_step) / med(raw):.3f}")
    print(f"{'no-op build (median s)':<44}{med(noop):>12.2f}  goal well under 2 s")
    print(f"{'rebuild after expiry change (s)':<44}{t_expiry:>12.2f}  RUN steps ran: {ran} of {total_runs}")
    print(f"{'render --check + plan, all targets (median s)':<44}{med(rp):>12.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
