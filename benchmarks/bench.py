#!/usr/bin/env python3
"""Benchmarks on the smoke target, printed side by side from one run (a script, not a timed test).

    .venv/bin/python benchmarks/bench.py [--rounds 3] [--only NAME] [--only NAME ...]

Measures (NAME):
  tool-vs-raw    cold build through the tool vs the same Dockerfile and contexts with raw
                 `docker buildx build` (both --no-cache after pruning the build cache); goal <= 1.05
  noop           the build with unchanged inputs (image served): goal < 0.3 s
  expiry         the rebuild after an expiry change: RUN steps that ran
  render-plan    `render --check` + `plan` for every target: goal < 1 s
  delta          bytes of the layers a Python-only bump and a C-only bump change / bytes of all
                 layers above the base, on the smoke; the cu129 projection: PyPI's vllm wheel
                 (`pip download`, cached) installed, split by ELF magic and compiled as the image
                 does, each part's gzipped tar against the rehearsed lock's wheel sizes
  import-time    `import k3smoke` in the smoke image with its bytecode / with the image's own .pyc
                 files deleted (the image before bytecode), median of cold interpreter starts
  overhead       the tool's fixed seconds (whole command minus the engine step) on a build whose
                 engine steps are all cached, by step, and the tool's own imports (-X importtime)
  doctor-parse   `build doctor`'s nvidia-smi reader on hostile captures: a GPU row of 900k spaces
                 against one of 90k (time ratio: ~10 linear, ~100 quadratic) and an 18,000-GPU
                 `-q -x` XML (s); no engine needed
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

from builder.engine import buildlog  # noqa: E402  (after sys.path: run as a script from the checkout)

BUILD = str(REPO / ".venv" / "bin" / "build")
MEASURES = (
    "tool-vs-raw",
    "noop",
    "expiry",
    "render-plan",
    "delta",
    "import-time",
    "overhead",
    "compile-cache",
    "doctor-parse",
)
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
        # the engine's part: the build into the local store, then the push (no secret: no scan between)
        engine_step.append(step_seconds(proc.stderr, "buildx build ") + step_seconds(proc.stderr, "push "))
        b = latest_build(smoke.work)
        meta = json.loads((b / "metadata.json").read_text())
        log = (b / "build.log").read_text()
        epoch = re.search(r"SOURCE_DATE_EPOCH=(\d+)", log).group(1)
        lock_sha = sh("sha256sum", str(smoke.work / "locks/smoke/requirements.txt")).stdout.split()[0]
        contexts = [f"source={b / 'source'}"] + [f"tp-{p.name}={p}" for p in sorted((b / "third_party").iterdir())]
        prune()
        cmd = [
            "docker",
            "buildx",
            "build",
            "--progress",
            "plain",
            "--no-cache",
            "--push",
            "-t",
            meta["image.name"].rsplit(":", 1)[0] + ":raw",
            "-f",
            str(smoke.work / "dockerfiles/smoke/Dockerfile"),
            *[a for c in contexts for a in ("--build-context", c)],
            "--build-arg",
            f"SOURCE_DATE_EPOCH={epoch}",
            "--build-arg",
            "MAX_JOBS=2",
            "--build-arg",
            "NVCC_THREADS=1",
            "--build-arg",
            f"K3_CREATED={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(int(epoch)))}",
            "--build-arg",
            f"K3_LOCK_SHA256={lock_sha}",
            str(b / "context"),
        ]
        raw.append(timed(*cmd, env=dict(os.environ, SOURCE_DATE_EPOCH=epoch))[0])
    return [
        ("cold build via tool (median s)", f"{med(tool):.2f}", ", ".join(f"{x:.2f}" for x in tool)),
        ("cold build raw buildx (median s)", f"{med(raw):.2f}", ", ".join(f"{x:.2f}" for x in raw)),
        (
            "ratio tool / raw (whole command)",
            f"{med(tool) / med(raw):.3f}",
            f"goal <= 1.05; fixed overhead {med(tool) - med(raw):.2f} s",
        ),
        (
            "engine step inside the tool (median s)",
            f"{med(engine_step):.2f}",
            f"ratio to raw {med(engine_step) / med(raw):.3f}",
        ),
    ]


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
    # --no-source: the plan from the matrix and local files (a plain plan also reads the source at
    # the pin for the kernel plan: cu129's from GitHub, which this machine may not reach).
    times, kernel = [], []
    for _ in range(5):
        t1, _ = timed(BUILD, "render", "--check", cwd=REPO)
        t2, _ = timed(BUILD, "plan", "--no-source", cwd=REPO)
        t3, _ = timed(BUILD, "--matrix", str(smoke.matrix), "plan", "--no-source")
        times.append(t1 + t2 + t3)
    timed(BUILD, "--matrix", str(smoke.matrix), "plan")  # the mirror holds the pin from here on
    for _ in range(5):
        kernel.append(timed(BUILD, "--matrix", str(smoke.matrix), "plan")[0])
    return [
        ("render --check + plan --no-source, all targets (median s)", f"{med(times):.2f}", "goal < 1 s"),
        ("plan with the kernel plan, smoke, warm mirror (median s)", f"{med(kernel):.2f}", "no network; cmake -P"),
    ]


def _layers(ref: str) -> list[tuple[str, int]]:
    doc = json.loads(sh("docker", "buildx", "imagetools", "inspect", "--raw", ref).stdout)
    return [(layer["digest"], int(layer["size"])) for layer in doc["layers"]]


def _bump(smoke: Smoke, path: str, change, when: str) -> None:
    """A new commit on the smoke branch that changes one file of the source."""
    src = smoke.work / "k3smoke-src" / path
    src.write_text(change(src.read_text()))
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="b",
        GIT_AUTHOR_EMAIL="b@e.org",
        GIT_COMMITTER_NAME="b",
        GIT_COMMITTER_EMAIL="b@e.org",
        GIT_COMMITTER_DATE=when,
    )
    sh("git", "-C", str(smoke.work / "k3smoke-src"), "commit", "-qam", "bump", env=env)
    commit = sh("git", "-C", str(smoke.work / "k3smoke-src"), "rev-parse", "HEAD").stdout.strip()
    smoke.edit(lambda text: re.sub(r"(\n      commit: )[0-9a-f]{40}", rf"\g<1>{commit}", text, count=1))


def _moved(smoke: Smoke, before: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    smoke.build("--no-checks")
    after = _layers(smoke.matrix.read_text().split("registry: ")[1].split()[0] + "/" + smoke.repository + ":smoke")
    base = len(_layers(re.search(r"runtime: (\S+)", smoke.matrix.read_text()).group(1)))
    return after, [(d, n) for d, n in after[base:] if (d, n) not in before]


def _rehearsed_layer_bytes() -> dict[str, int]:
    """From the rehearsed cu129 runtime lock: wheel bytes per matrix layer group (PyPI sizes)."""
    from builder.config import matrix as matrix_mod
    from builder.deps.buildcontext import layer_of

    target = matrix_mod.load(REPO / "matrix.yaml").target("cu129")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(REPO / "matrix.yaml", Path(tmp) / "matrix.yaml")
        sh(BUILD, "--matrix", str(Path(tmp) / "matrix.yaml"), "lock", "--target", "cu129", "--rehearse")
        lock = (Path(tmp) / "artifacts/cu129/rehearsal/runtime.lock.txt").read_text()
    sizes: dict[str, int] = {}
    for name, version in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", lock, re.M):
        if name != target.source.package:
            sizes[layer_of(target, name)] = sizes.get(layer_of(target, name), 0) + _wheel_size(name, version)
    return sizes


def _vllm_wheel() -> Path:
    """PyPI's vllm wheel at the cu129 pin (the +cu129 one is built, not downloaded), cached."""
    from builder.config import matrix as matrix_mod

    version = matrix_mod.load(REPO / "matrix.yaml").target("cu129").source.version
    dest = Path(os.environ.get("K3_CACHE_DIR") or Path.home() / ".cache" / "k3-builder") / "bench"
    sh(
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        f"vllm=={version}",
        "-d",
        str(dest),
        env=dict(os.environ, PIP_CONFIG_FILE="/dev/null"),
    )
    return sorted(dest.glob(f"vllm-{version}-*.whl"))[-1]


def _gz_tar_bytes(root: Path) -> int:
    tar = subprocess.Popen(["tar", "-C", str(root), "--sort=name", "-c", "."], stdout=subprocess.PIPE)
    size = len(subprocess.run(["gzip", "-6", "-n"], stdin=tar.stdout, capture_output=True, check=True).stdout)
    tar.wait()
    return size


def _vllm_split() -> dict[str, int]:
    """The wheel installed as the image installs it, split and compiled by the image's own helper:
    bytes of its ELF and other entries in the wheel, and each layer as a gzipped tar."""
    import zipfile

    wheel = _vllm_wheel()
    out = {"zip_elf": 0, "zip_other": 0}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            with zf.open(info) as fh:
                out["zip_elf" if fh.read(4) == b"\x7fELF" else "zip_other"] += info.compress_size
    helper = REPO / "builder" / "dockerfile" / "templates" / "layer_files.py"
    with tempfile.TemporaryDirectory() as tmp:
        stage, native, py = (Path(tmp) / n for n in ("stage", "native", "python"))
        sh(
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            "--no-index",
            "--root",
            str(stage),
            str(wheel),
            env=dict(os.environ, PIP_CONFIG_FILE="/dev/null"),
        )
        sh(sys.executable, str(helper), "split", str(stage), str(native), str(py))
        out["native_gz"], out["python_gz_no_pyc"] = _gz_tar_bytes(native), _gz_tar_bytes(py)
        out["compiled"] = (
            sh(sys.executable, str(helper), "bytecode", str(py), env=dict(os.environ, PYTHONHASHSEED="0"))
            .stdout.strip()
            .split(": ", 1)[1]
        )
        out["python_gz"] = _gz_tar_bytes(py)
    return out


def _cu129_projection() -> list[tuple[str, str, str]]:
    sizes, split = _rehearsed_layer_bytes(), _vllm_split()
    total = sum(sizes.values()) + split["native_gz"] + split["python_gz"]
    per = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in sorted(sizes.items()))
    return [
        (
            "cu129 projected: Python-only bump / above base",
            f"{split['python_gz'] / total:.4f}",
            f"app-python {split['python_gz'] / 1e6:.1f} MB of {total / 1e9:.2f} GB (without bytecode "
            f"{split['python_gz_no_pyc'] / 1e6:.1f} MB; {split['compiled']})",
        ),
        (
            "cu129 projected: C-only bump / above base",
            f"{split['native_gz'] / total:.4f}",
            f"app-native {split['native_gz'] / 1e9:.3f} GB; vllm wheel: ELF files {split['zip_elf'] / 1e6:.1f} MB, "
            f"other files {split['zip_other'] / 1e6:.1f} MB compressed; other layers: {per}",
        ),
    ]


def _wheel_size(name: str, version: str) -> int:
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as resp:
        files = json.load(resp)["releases"].get(version, [])
    wheels = [f for f in files if f["filename"].endswith(".whl")]
    best = [f for f in wheels if "x86_64" in f["filename"] and ("cp312" in f["filename"] or "abi3" in f["filename"])]
    pick = (best or [f for f in wheels if "none-any" in f["filename"]] or wheels or [{"size": 0}])[0]
    return int(pick["size"])


def delta(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    smoke.build("--no-checks")
    first = _layers(smoke.matrix.read_text().split("registry: ")[1].split()[0] + "/" + smoke.repository + ":smoke")
    _bump(smoke, "k3smoke/__main__.py", lambda text: text + "# bumped\n", "2026-11-02T00:00:00+00:00")
    after_py, moved_py = _moved(smoke, first)
    _bump(
        smoke,
        "csrc/driver.c",
        lambda text: text + 'const char k3_bump_note[] = "bumped";\n',
        "2026-11-03T00:00:00+00:00",
    )
    after_c, moved_c = _moved(smoke, after_py)
    base = len(_layers(re.search(r"runtime: (\S+)", smoke.matrix.read_text()).group(1)))
    above = sum(n for _, n in after_c[base:])
    rows = [
        (
            "layers above the base",
            str(len(after_c) - base),
            f"Python-only bump changed {len(moved_py)}, C-only bump changed {len(moved_c)}",
        )
    ]
    for kind, moved in (("Python-only", moved_py), ("C-only", moved_c)):
        rows.append(
            (
                f"delta: {kind} bump new bytes / above base",
                f"{sum(n for _, n in moved) / above:.4f}",
                f"{sum(n for _, n in moved)} of {above} bytes (smoke)",
            )
        )
    return rows + _cu129_projection()


# Runs inside the image as root: for each module, cold interpreter starts (one fresh python each)
# alternating between the image's bytecode and none (every .pyc under /opt/k3 renamed away,
# which the image's own user could not do), after one start of each to warm the page cache; prints
# the median cumulative import time (-X importtime, microseconds) with and without, per module.
_IMPORT_PROBE = """
import os, statistics, subprocess, sys
caches = [os.path.join(d, f) for d, _, files in os.walk("/opt/k3") for f in files if f.endswith(".pyc")]
def hide(away):  # files, not directories: overlayfs refuses to rename a lower layer's directory
    for c in caches:
        os.rename(c, c + ".off") if away else os.rename(c + ".off", c)
def once(module):
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import " + module],
                         capture_output=True, text=True, check=True).stderr
    return int([ln for ln in err.splitlines() if ln.split("|")[-1].strip() == module][-1].split("|")[1])
out = []
for module in sys.argv[2:]:
    times = {False: [], True: []}
    for i in range(2 * int(sys.argv[1]) + 2):
        off = bool(i % 2)
        if off:
            hide(True)
        t = once(module)
        if off:
            hide(False)
        if i >= 2:
            times[off].append(t)
    out += [statistics.median(times[False]), statistics.median(times[True])]
print(len(caches), " ".join(str(x) for x in out))
"""
IMPORT_MODULES = ("k3smoke", "packaging.requirements")  # the app's main module; a dependency's


def import_time(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    """The image with its bytecode against the image as it was before (no .pyc under /opt/k3; the
    base's standard library keeps its own), in one container, interleaved."""
    smoke.build("--no-checks")
    image = smoke.matrix.read_text().split("registry: ")[1].split()[0] + "/" + smoke.repository + ":smoke"
    starts = max(15, rounds * 5)
    script = (
        f"cat > /tmp/probe.py <<'EOF'\n{_IMPORT_PROBE}\nEOF\npython /tmp/probe.py {starts} {' '.join(IMPORT_MODULES)}\n"
    )
    # The driver library every extension links: the base's compat copy, as the checks load it.
    caches, *out = sh(
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "--user",
        "0",
        "-e",
        "LD_LIBRARY_PATH=/usr/local/cuda/compat",
        "--entrypoint",
        "sh",
        image,
        "-c",
        script,
    ).stdout.split()
    rows = []
    for i, module in enumerate(IMPORT_MODULES):
        with_pyc, without = int(out[2 * i]), int(out[2 * i + 1])
        rows.append(
            (
                f"import {module}: with / without bytecode",
                f"{with_pyc / without:.3f}",
                f"{with_pyc / 1000:.1f} ms / {without / 1000:.1f} ms, medians of {starts} cold starts "
                f"each, interleaved ({caches} .pyc files under /opt/k3)",
            )
        )
    return rows


def _import_seconds(stderr: str) -> tuple[float, list[tuple[str, float]]]:
    """Total self time of every import (-X importtime) and the slowest top-level packages."""
    total, top = 0, {}
    for m in re.finditer(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$", stderr, re.M):
        total += int(m.group(1))
        if len(m.group(3)) == 1:
            top[m.group(4)] = top.get(m.group(4), 0) + int(m.group(2))
    return total / 1e6, sorted(((k, v / 1e6) for k, v in top.items()), key=lambda kv: -kv[1])[:4]


def _step_name(line: str) -> str:
    """A step's name without what varies between runs (log paths, image references, digests)."""
    line = re.sub(r" \(log: [^)]*\)", "", line)
    return re.sub(r" (\S+@)?sha256:\S+| \S+/\S+:\S+| [0-9a-f]{12,}", "", line).strip()


def overhead(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    """The tool's fixed seconds on a build whose engine steps are all cached: whole command minus
    the engine step, by the tool's own step timings, plus its imports."""
    smoke.build("--no-checks")
    runs = []
    for _ in range(max(3, rounds)):
        t, proc = timed(
            BUILD,
            "--matrix",
            str(smoke.matrix),
            "--target",
            "smoke",
            "--force",
            "--no-checks",
            env=dict(os.environ, PYTHONPROFILEIMPORTTIME="1"),
        )
        steps = {
            _step_name(m.group(1)): float(m.group(2))
            for m in re.finditer(r"done: smoke: (.+) \(([\d.]+)s\)$", proc.stderr, re.M)
        }
        runs.append((t, steps, _import_seconds(proc.stderr)))
    wall = med(r[0] for r in runs)
    # the build into the local store, then the push (as _step_name leaves their names)
    engine_steps = ("buildx build", "push")
    engine = med(sum(v for k, v in r[1].items() if k.startswith(engine_steps)) for r in runs)
    names = [k for k in runs[0][1] if not k.startswith(engine_steps)]
    by_step = sorted(((k, med(r[1].get(k, 0.0) for r in runs)) for k in names), key=lambda kv: -kv[1])
    imports = med(r[2][0] for r in runs)
    rest = wall - engine - sum(v for _, v in by_step)
    return [
        (
            "fixed overhead: tool minus engine step (s)",
            f"{wall - engine:.2f}",
            f"whole command {wall:.2f} s, engine step {engine:.2f} s (all cached), median of {len(runs)}",
        ),
        ("  ... by step (s)", f"{sum(v for _, v in by_step):.2f}", "; ".join(f"{k} {v:.2f}" for k, v in by_step)),
        (
            "  ... outside any step (s)",
            f"{rest:.2f}",
            f"start-up and imports; all imports {imports:.2f} s (-X importtime, some inside steps), slowest: "
            + ", ".join(f"{k} {v:.2f}" for k, v in runs[0][2][1]),
        ),
    ]


def compile_cache(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    host = re.search(r"inet (\d+\.\d+\.\d+\.\d+)", sh("ip", "-4", "addr", "show", "docker0").stdout).group(1)
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    redis = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            host,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        smoke.edit(
            lambda text: (
                text.replace(
                    "K3SMOKE_CUDA_VERSION: 12.9.1", "K3SMOKE_CUDA_VERSION: 12.9.1\n        K3SMOKE_HEAVY_UNITS: '6'"
                )
                .replace("max_jobs: 2,", "max_jobs: 2, remote_cache: true,")
                .replace("max_jobs: 2\n", "max_jobs: 2\n      remote_cache: true\n")
            )
        )
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
    return [
        ("compile cache hit rate (fresh builder)", rate, f"{hits} hits, {misses} misses (redis on {host})"),
        (
            "compile step cold / warm (s)",
            f"{cold_s / warm_s:.2f}x",
            f"cold {cold_s:.1f} s, warm {warm_s:.1f} s; 6 heavy units + 7 smoke units, MAX_JOBS=2",
        ),
    ]


def _compile_step_seconds(log: str) -> float:
    """The compile RUN step's duration, from buildx's plain progress (#N ... DONE Xs)."""
    for step in buildlog.steps(log):
        if step.instruction == "RUN" and "pip wheel" in step.command:
            return step.seconds
    raise ValueError("no compile step in the log")


def doctor_parse(smoke: Smoke, rounds: int) -> list[tuple[str, str, str]]:
    from builder.config import contract
    from builder.host import compat, imagefacts, verdicts

    facts = imagefacts.from_labels({contract.LABEL_GPU_FAMILIES: "8.0 9.0 10.0 12.0"})

    def row(spaces: int) -> float:
        text = "Driver Version: 580.95.05  CUDA Version: 13.0\n|   0  NVIDIA H100" + " " * spaces + "x\n"
        return med(_seconds(lambda: compat.parse_smi(text)) for _ in range(max(rounds, 3)))

    gpu = "<gpu><product_name>NVIDIA H100 80GB HBM3</product_name><compute_cap>9.0</compute_cap></gpu>"
    xml = f"<nvidia_smi_log><driver_version>580.95.05</driver_version>{gpu * 18_000}</nvidia_smi_log>"
    many = med(_seconds(lambda: verdicts.gpu_findings(compat.parse_smi(xml), facts)) for _ in range(rounds))
    return [
        (
            "doctor: GPU row of 900k / 90k spaces (ratio)",
            f"{row(900_000) / row(90_000):.1f}",
            "~10 linear; ~100 quadratic",
        ),
        (
            "doctor: 18,000-GPU -q -x XML, read + GPU findings (s)",
            f"{many:.2f}",
            "reviewer: 18 s (whole doctor run) before identify was cached",
        ),
    ]


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


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
            found = globals()[name.replace("-", "_")](smoke, args.rounds)
            rows += found
            for measure, value, note in found:  # as they come: a later measure that fails loses nothing
                print(f"{name}: {measure}: {value}  {note}", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"machine: {platform.node()} {platform.machine()}, {sh('nproc').stdout.strip()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // 2**30} GiB, "
        f"docker {sh('docker', 'version', '--format', '{{.Server.Version}}').stdout.strip()}, "
        f"buildx {sh('docker', 'buildx', 'version').stdout.split()[1]}, rounds {args.rounds}"
    )
    print(f"{'measure':<46}{'value':>12}  note")
    for measure, value, note in rows:
        print(f"{measure:<46}{value:>12}  {note}")


if __name__ == "__main__":
    main()
