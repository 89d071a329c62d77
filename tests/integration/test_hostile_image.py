"""A hostile image against `build vet` (issue 49): the image may not decide its own verdict.

The attack as it was found: the demo image broken (libcudart deleted, its compiled module
overwritten with random bytes, root as its user, a setuid shell, a world-writable directory), plus a
19-line ``.pth`` that replays a good image's probe answers, recorded here from a vet of the demo
image itself. Before the trust boundary it was "fit" (exit 0). Now the probes run isolated
(``python -I -S``: the .pth never runs) and the host's reading of the image's files decides the
rows it can: the verdict names each defect. Also: a check that never returns, and one that prints
without end, no longer hang vet or fill its memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder.checks import probes
from tests.integration.conftest import BUILD, cli

SITE = "/opt/k3/venv/lib/python3.11/site-packages"
MODULE = f"{SITE}/k3smoke/_C.cpython-311-x86_64-linux-gnu.so"
CUDART = f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12"

# The replay, as the attacker wrote it: every probe's facts line swapped for a good image's answer
# with the same keys, at whatever moment the image's interpreter prints it.
REPLAY = """import json, os, sys
ANSWERS = json.load(open(os.path.join(os.path.dirname(__file__), "k3answers.json")))
class Replay:
    def __init__(self, out):
        self.out = out
    def write(self, text):
        if text.startswith("K3-PROBE "):
            try:
                keys = ",".join(sorted(json.loads(text[9:])))
            except ValueError:
                keys = ""
            text = "K3-PROBE " + ANSWERS.get(keys, text[9:])
        return self.out.write(text)
    def flush(self):
        return self.out.flush()
    def __getattr__(self, name):
        return getattr(self.out, name)
sys.stdout = Replay(sys.stdout)
"""


def _good_answers(smoke, ref: str, monkeypatch, tmp: Path) -> dict[str, str]:
    """Every probe's facts from a vet of the demo image (in this process), keyed by their keys."""
    from builder.checks.vetrun import VetParams, vet_one
    from builder.config.matrix import load
    from builder.engine import containers
    from builder.engine.buildx import DockerEngine

    answers: dict[str, str] = {}
    real = containers.run_capped

    def recording(argv, timeout):
        ran = real(argv, timeout)
        for line in ran.stdout.splitlines():
            if line.startswith(probes.MARKER):
                answers[",".join(sorted(json.loads(line[len(probes.MARKER) :])))] = line[len(probes.MARKER) :]
        return ran

    monkeypatch.setattr(containers, "run_capped", recording)
    target = load(smoke.matrix).target("smoke")
    card = vet_one(DockerEngine(), tmp, target, ref, VetParams())
    assert card.fit, card.text()
    return answers


@pytest.fixture(scope="module")
def hostile(built, tmp_path_factory):
    smoke, ref = built
    context = tmp_path_factory.mktemp("hostile")
    with pytest.MonkeyPatch.context() as mp:
        answers = _good_answers(smoke, ref, mp, context)
    assert len(answers) >= 10, sorted(answers)
    (context / "k3answers.json").write_text(json.dumps(answers))
    (context / "k3replay.py").write_text(REPLAY)
    (context / "k3replay.pth").write_text("import k3replay\n")
    (context / "random.bin").write_bytes(os.urandom(200_000))
    (context / "Dockerfile").write_text(
        f"FROM {ref}\nUSER root\n"
        f"COPY k3replay.py k3replay.pth k3answers.json {SITE}/\n"
        f"COPY random.bin {MODULE}\n"
        f"RUN rm {CUDART} && cp /bin/sh /opt/k3/venv/bin/rootsh && chmod 4755 /opt/k3/venv/bin/rootsh "
        "&& mkdir -m 777 /srv/drop\n"
    )
    tag = f"k3-hostile-vet:{smoke.repository.rsplit('-', 1)[-1]}"
    subprocess.run(
        ["docker", "buildx", "build", "--load", "-q", "-t", tag, str(context)], check=True, capture_output=True
    )
    yield smoke, tag, answers
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def _vet(smoke, image: str, env: dict | None = None) -> tuple[int, dict, str]:
    r = cli("--matrix", str(smoke.matrix), "vet", "--target", "smoke", "--image", image, "--json", env=env)
    assert "Traceback" not in r.err, r.err[-3000:]
    return r.code, json.loads(r.out), r.err


def test_the_replay_is_live_in_the_images_own_python(hostile):
    """The attack works wherever the image's interpreter starts as usual: its .pth rewrites a facts line."""
    smoke, tag, answers = hostile
    keys, good = next(iter(answers.items()))
    fake = json.dumps(dict.fromkeys(keys.split(","), "broken"))
    script = f"print({probes.MARKER!r} + {fake!r})"
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", tag, "-c", script],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == probes.MARKER + good


def test_a_broken_image_replaying_good_answers_is_not_fit(hostile):
    smoke, tag, _ = hostile
    code, doc, err = _vet(smoke, tag)
    assert code == 1, err[-3000:]
    assert not doc["fit"]
    rows = {c["name"]: c for c in doc["checks"]}
    failed = {n for n, c in rows.items() if c["status"] == "fail"}
    # the random-bytes module: never imports, loads, resolves or carries GPU code
    for name in ("compiled_modules", "everything_loads", "shared_libraries", "gpu_code"):
        assert name in failed, (name, rows[name])
    assert "not an ELF file" in rows["everything_loads"]["finding"]
    assert "read on the host" in rows["shared_libraries"]["finding"]
    assert "cuda_runtime" in failed  # libcudart deleted
    # root, the setuid shell and the world-writable directory (advisory rows for a foreign image)
    assert "non_root" in failed and "/srv/drop" in rows["no_world_writable"]["finding"]
    assert "/opt/k3/venv/bin/rootsh: set-id mode 0o4755" in rows["least_privilege"]["finding"]
    # the scorecard says who answered each row
    assert rows["no_world_writable"]["basis"] == "host" and rows["everything_loads"]["basis"] == "cross-checked"
    assert rows["recipe_cli"]["basis"] == "image"
    # the replaying .pth itself, read on the host (issue 51): a start-up hook the matrix does not name
    assert rows["startup_hooks"]["status"] == "fail" and rows["startup_hooks"]["basis"] == "host"
    assert (
        f"{SITE}/k3replay.pth: a .pth file with 1 executable line(s): import k3replay"
        in rows["startup_hooks"]["finding"]
    )


# The next step of the attack: the interpreter itself replaced by one that installs the replay
# whatever its flags say (-I -S included). Isolation cannot stop that; the host's reading does.
INTERPRETER = f"""import sys
sys.path.insert(0, "{SITE}")
import k3replay
args = sys.argv[1:]
while args and args[0] in ("-I", "-S", "-E", "-s"):
    args.pop(0)
if args[:1] == ["-c"]:
    sys.argv = ["-c", *args[2:]]
    exec(compile(args[1], "<string>", "exec"), {{"__name__": "__main__"}})
"""


def test_a_replaced_interpreter_still_cannot_pass_the_rows_the_host_reads(hostile, tmp_path):
    smoke, tag, _ = hostile
    (tmp_path / "replayrun.py").write_text(INTERPRETER)
    (tmp_path / "python").write_text('#!/bin/sh\nexec /usr/bin/python3.11 /opt/k3/replayrun.py "$@"\n')
    (tmp_path / "python").chmod(0o755)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {tag}\nCOPY replayrun.py /opt/k3/replayrun.py\nRUN rm /opt/k3/venv/bin/python\n"
        "COPY python /opt/k3/venv/bin/python\n"
    )
    liar = tag.replace("k3-hostile-vet", "k3-hostile-python")
    subprocess.run(
        ["docker", "buildx", "build", "--load", "-q", "-t", liar, str(tmp_path)], check=True, capture_output=True
    )
    try:
        code, doc, err = _vet(smoke, liar)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", liar], capture_output=True)
    assert code == 1, err[-3000:]
    rows = {c["name"]: c for c in doc["checks"]}
    failed = {n for n, c in rows.items() if c["status"] == "fail"}
    host_read = {
        "cuda_runtime",
        "compiled_modules",
        "everything_loads",
        "shared_libraries",
        "gpu_code",
        "startup_hooks",
    }
    assert host_read <= failed, {n: rows[n] for n in host_read - failed}
    assert {"non_root", "no_world_writable", "least_privilege"} <= failed
    assert "read on the host" in rows["compiled_modules"]["finding"]


@pytest.fixture(scope="module")
def runaway(built, tmp_path_factory):
    """Two images whose C compiler (runtime_toolchain runs $CC) never returns, or prints 300 MB."""
    smoke, ref = built
    tags = {}
    # the flood goes to the check's own stdout (the script sends the compiler's output to a file)
    flood = "head -c 300000000 /dev/zero | tr '\\0' x > /proc/$PPID/fd/1"
    for name, body in {"hang": "exec sleep 100000", "flood": flood}.items():
        context = tmp_path_factory.mktemp(name)
        (context / "cc").write_text(f"#!/bin/sh\n{body}\n")
        (context / "cc").chmod(0o755)
        (context / "Dockerfile").write_text(f"FROM {ref}\nCOPY cc /usr/local/bin/k3cc\nENV CC=/usr/local/bin/k3cc\n")
        tags[name] = f"k3-hostile-{name}:{smoke.repository.rsplit('-', 1)[-1]}"
        subprocess.run(
            ["docker", "buildx", "build", "--load", "-q", "-t", tags[name], str(context)],
            check=True,
            capture_output=True,
        )
    yield smoke, tags
    for tag in tags.values():
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_a_check_that_never_returns_fails_at_its_timeout(runaway):
    smoke, tags = runaway
    code, doc, err = _vet(smoke, tags["hang"], env={**os.environ, "K3_CHECK_TIMEOUT": "20"})
    assert code == 1, err[-3000:]
    rows = {c["name"]: c for c in doc["checks"]}
    assert rows["runtime_toolchain"]["status"] == "fail"
    assert "to finish within 20 s, found it still running: killed" in rows["runtime_toolchain"]["finding"]


def test_a_check_that_prints_without_end_is_capped(runaway):
    smoke, tags = runaway
    # vet under a parent that reports its children's peak resident memory (vet's, or a docker CLI's)
    measure = (
        "import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(json.dumps([r.returncode, r.stdout, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))"
    )
    argv = [BUILD, "--matrix", str(smoke.matrix), "vet", "--target", "smoke", "--image", tags["flood"], "--json"]
    run = subprocess.run([sys.executable, "-c", measure, *argv], capture_output=True, text=True, check=True)
    code, out, peak_kib = json.loads(run.stdout)
    assert peak_kib < 200 * 1024, f"peak {peak_kib // 1024} MiB for 300 MB of output"
    rows = {c["name"]: c for c in json.loads(out)["checks"]}
    assert code == 1 and rows["runtime_toolchain"]["status"] == "fail", rows["runtime_toolchain"]


# --- the runtime's view (issue 51): one variant made at the OCI level, no build ---------------------
# The smoke's config edited and one layer written here appended, pushed under a repository of its own:
# each class of issue 51 part A is in it once, and `build test` and `build vet` name each on its row.
CAPABILITY = "\x01\x00\x00\x02\x00\x20\x00\x00" + "\x00" * 12  # vfs_cap_data v2: cap_net_raw, effective


def _broken_runtime_view(config: dict) -> None:
    env = dict(item.split("=", 1) for item in config["config"]["Env"])
    for var in ("USER", "LOGNAME", "HOME"):
        env.pop(var, None)  # uid 2000 has no passwd entry: getpass raises, runc's HOME=/ is not writable
    env["NVIDIA_REQUIRE_CUDA"] = "cuda>=13.0"  # a cu129 image refusing r575 hosts
    env["LD_LIBRARY_PATH"] = "/usr/local/cuda/compat:" + env.get("LD_LIBRARY_PATH", "")
    env["PYTHONWARNINGS"] = "error"
    config["config"]["Env"] = [f"{k}={v}" for k, v in env.items()]


PYC = "/usr/lib/python3.11/__pycache__/sitecustomize.cpython-311.pyc"  # beside the base's apport hook
APPORT = "/usr/lib/python3.11/apport_python_hook.py"


def _planted_hooks() -> list[tuple]:
    """Hooks a later layer plants with the image's own record vouching for them: a sitecustomize with
    its md5 in a dpkg md5sums file of this layer's, and an unchecked hash-based pyc (CPython runs it
    without reading the source) in place of the base's bytecode of Debian's sitecustomize."""
    from importlib._bootstrap_external import _code_to_hash_pyc  # the stdlib's own pyc writer

    hook = b"import os\n"
    sums = f"{hashlib.md5(hook).hexdigest()}  {SITE.lstrip('/')}/sitecustomize.py\n"
    pyc = bytes(_code_to_hash_pyc(compile("", "sitecustomize.py", "exec"), b"\0" * 8, checked=False))
    return [
        (SITE.lstrip("/") + "/sitecustomize.py", "file", 0o644, 0, hook, {}),
        ("var/lib/dpkg/info/k3hook.md5sums", "file", 0o644, 0, sums, {}),
        (PYC.lstrip("/"), "file", 0o644, 0, pyc, {}),
        # what Debian's sitecustomize (the base's, unchanged) imports when it exists
        (APPORT.lstrip("/"), "file", 0o644, 0, "import os\n", {}),
    ]


@pytest.fixture(scope="module")
def runtime_view(built):
    from tests.integration import ocivariant

    smoke, ref = built
    tar = ocivariant.layer(
        [
            (SITE.lstrip("/") + "/k3hook.pth", "file", 0o644, 0, "import os\n", {}),
            ("usr/bin/k3cap", "file", 0o755, 0, "#!/bin/sh\n", {"SCHILY.xattr.security.capability": CAPABILITY}),
            ("usr/bin/k3own", "file", 0o755, 1000, "#!/bin/sh\n", {}),
            ("etc/.wh.debian_version", "file", 0o644, 0, b"", {}),  # base-files' file, removed
            *_planted_hooks(),
        ]
    )
    repository, variant = ocivariant.push_variant(ref, _broken_runtime_view, (tar,))
    # pulled first: vet --json of an image the engine lacks gets docker's "Unable to find image" on stdout
    subprocess.run(["docker", "pull", "-q", variant], check=True, capture_output=True)
    yield smoke, ref, variant
    ocivariant.remove(repository, variant)


RUNTIME_ROWS = {
    "container_runtime": ("NVIDIA_REQUIRE_CUDA='cuda>=13.0' refuses the driver floor", "/usr/local/cuda/compat"),
    "interpreter_options": ("/config/Env/PYTHONWARNINGS",),
    "startup_hooks": (
        f"{SITE}/k3hook.pth: a .pth file with 1 executable line(s): import os",
        f"{SITE}/sitecustomize.py: sitecustomize: dpkg's md5 matches (the image's own record), but "
        f"{SITE}/sitecustomize.py is written by layer ",
        f"{PYC}: bytecode Python may run instead of /usr/lib/python3.11/sitecustomize.py: {PYC} is written by layer ",
        f"{APPORT}: a file the base's start-up hooks can import, written by a layer after the pinned base's ",
    ),
    "runtime_user": ("getpass.getuser() raises", "/: the home of uid 2000 is the root directory"),
    "system_files": ("/usr/bin/k3cap: carries a file capability", "/usr/bin/k3own: owned by uid 1000"),
    "base_whiteouts": ("/etc/debian_version: a file of the OS package base-files",),
}


def test_the_runtime_s_view_is_read_on_the_host_and_each_class_fails_its_row(runtime_view):
    smoke, ref, variant = runtime_view
    code, doc, err = _vet(smoke, variant)
    assert code == 1, err[-3000:]
    rows = {c["name"]: c for c in doc["checks"]}
    for name, texts in RUNTIME_ROWS.items():
        assert rows[name]["status"] == "fail" and rows[name]["basis"] == "host", rows[name]
        assert all(t in rows[name]["finding"] for t in texts), (name, rows[name]["finding"])
    r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke", "--image", variant)
    assert r.code == 1, r.err[-3000:]
    for name in RUNTIME_ROWS:
        assert re.search(rf"^\s+FAIL\s+{name}\s", r.err, re.M), r.err[-3000:]


def test_the_demo_image_passes_every_runtime_row(runtime_view):
    smoke, ref, _ = runtime_view
    code, doc, err = _vet(smoke, ref)
    rows = {c["name"]: c for c in doc["checks"]}
    assert all(rows[name]["status"] == "pass" for name in RUNTIME_ROWS), {n: rows[n] for n in RUNTIME_ROWS}
    assert rows["cpu_level"]["status"] == "pass", rows["cpu_level"]  # its loads run on x86-64-v2 (Nehalem)
    assert code == 0, err[-3000:]


# --- GPU code judged on the host (issue 49's last gap): one variant made at the OCI level, no build ---
# The image's interpreter replaced by one whose `os.walk` hides the files named k3hidden*, whatever
# its flags say, and a CUDA 13 fatbin of that name under the prefix (outside site-packages: no RECORD
# lists it). The gpucode probe, run in that interpreter, lists no GPU code there; the host reads it.
LIAR = """import os, sys
_walk = os.walk
def _hiding(top, *a, **k):
    for d, dirs, files in _walk(top, *a, **k):
        yield d, dirs, [f for f in files if not f.startswith("k3hidden")]
os.walk = _hiding
args = sys.argv[1:]
while args and args[0] in ("-I", "-S", "-E", "-s"):
    args.pop(0)
if args[:1] == ["-c"]:
    sys.argv = ["-c", *args[2:]]
    exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
else:
    os.execv("/usr/bin/python3.11", ["/usr/bin/python3.11", *args])
"""


@pytest.fixture(scope="module")
def gpu_liar(built, tmp_path_factory):
    from tests.integration import ocivariant
    from tests.unit import gpuassets

    smoke, ref = built
    work = tmp_path_factory.mktemp("gpuliar")
    fat = gpuassets.nvcc13(work / "k3.fatbin", "-fatbin", "-gencode", "arch=compute_90a,code=sm_90a")
    wrapper = '#!/bin/sh\nexec /usr/bin/python3.11 /opt/k3/k3liar.py "$@"\n'
    tar = ocivariant.layer(
        [
            ("opt/k3/k3hidden.fatbin", "file", 0o644, 0, fat.read_bytes(), {}),
            ("opt/k3/k3liar.py", "file", 0o644, 0, LIAR, {}),
            ("opt/k3/venv/bin/python", "file", 0o755, 0, wrapper, {}),
        ]
    )
    repository, variant = ocivariant.push_variant(ref, lambda config: None, (tar,))
    subprocess.run(["docker", "pull", "-q", variant], check=True, capture_output=True)
    yield smoke, variant
    ocivariant.remove(repository, variant)


def test_gpu_code_an_interpreter_hides_fails_by_the_host_s_reading(gpu_liar):
    """Before the host read GPU code itself, gpu_code passed this image: its probe saw nothing.
    `build test` (the prefix is the matrix's; under vet the lying interpreter would name it too)."""
    smoke, variant = gpu_liar
    r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke", "--image", variant)
    line = next((ln for ln in r.err.splitlines() if re.match(r"^\s+\w+\s+gpu_code\s", ln)), "")
    assert re.match(r"^\s+FAIL\s+gpu_code\s", line), r.err[-3000:]
    assert "/opt/k3/k3hidden.fatbin: SASS sm_90a built by CUDA 13.0 (tkinfo), not CUDA 12" in line, line
    assert "/opt/k3/k3hidden.fatbin: the image's interpreter reported no GPU code, its files hold" in line, line
    assert r.code == 1


# --- the CPU level (issue 51): a library above the claimed level, and a real wheel ----------------
# A library under the prefix whose constructor executes an AVX2 instruction, not dispatched (as
# libtorch_cpu.so's static initialisers of its AVX2 kernels once did: pytorch/pytorch#37577), written
# at the OCI level; the smoke claims x86-64-v2 (Nehalem), where it dies with SIGILL at load.
SIMD = "/opt/k3/venv/lib/libk3simd.so"
AVX2_INIT = (
    "__attribute__((constructor)) static void k3_simd_init(void) {\n"
    '  __asm__ volatile("vpaddd %%ymm0, %%ymm1, %%ymm2" ::: "xmm0", "xmm1", "xmm2");\n'
    "}\nint k3_simd(void) { return 1; }\n"
)
# A real third-party wheel: NumPy 2.4.6 for CPython 3.11 from PyPI, by sha256. It picks its SIMD
# kernels at run time up to AVX-512, yet on x86-64 (v1) its import dies with SIGILL (tried here
# under QEMU 7.2: on qemu64, SSE3 without SSSE3/SSE4/POPCNT, too); on x86-64-v2 it loads.
NUMPY = (
    "numpy==2.4.6 --hash=sha256:89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93",
    "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
)


def _simd_layer(into: Path) -> bytes:
    from tests.integration import ocivariant

    src = into / "simd.c"
    src.write_text(AVX2_INIT)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(into / "libk3simd.so"), str(src)], check=True)
    return ocivariant.layer([(SIMD.lstrip("/"), "file", 0o755, 0, (into / "libk3simd.so").read_bytes(), {})])


def _numpy_layer(into: Path) -> bytes:
    """NumPy's package files (no dist-info) under the smoke's site-packages."""
    import zipfile

    from builder.deps.hermetic import hermetic_env
    from tests.integration import ocivariant

    (into / "req.txt").write_text(NUMPY[0] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", "--only-binary",
         ":all:", "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "-r", str(into / "req.txt"),
         "-d", str(into)],
        check=True, env=hermetic_env(), capture_output=True,
    )  # fmt: skip
    members = []
    with zipfile.ZipFile(into / NUMPY[1]) as z:
        for info in z.infolist():
            if info.is_dir() or ".dist-info/" in info.filename or "/tests/" in info.filename:
                continue
            mode = 0o755 if info.filename.endswith(".so") or ".so." in info.filename else 0o644
            members.append((SITE.lstrip("/") + "/" + info.filename, "file", mode, 0, z.read(info), {}))
    return ocivariant.layer(members)


@pytest.fixture(scope="module")
def cpu_variants(built, tmp_path_factory):
    from tests.integration import ocivariant

    smoke, ref = built
    into = tmp_path_factory.mktemp("cpu")
    made = {name: ocivariant.push_variant(ref, layers=(make(into),)) for name, make in
            (("simd", _simd_layer), ("numpy", _numpy_layer))}  # fmt: skip
    for _, variant in made.values():
        subprocess.run(["docker", "pull", "-q", variant], check=True, capture_output=True)
    yield smoke, {name: variant for name, (_, variant) in made.items()}
    for repository, variant in made.values():
        ocivariant.remove(repository, variant)


def test_a_library_above_the_claimed_cpu_fails_cpu_level_in_test_and_vet(cpu_variants):
    smoke, variants = cpu_variants
    code, doc, err = _vet(smoke, variants["simd"])
    assert code == 1, err[-3000:]
    rows = {c["name"]: c for c in doc["checks"]}
    row = rows["cpu_level"]
    assert row["status"] == "fail" and row["basis"] == "image", row
    assert f"{SIMD}: killed by SIGILL (Illegal instruction) on x86-64-v2 (QEMU -cpu Nehalem-v1)" in row["finding"]
    assert {n for n, c in rows.items() if c["status"] == "fail"} == {"cpu_level"}, rows
    r = cli("--matrix", str(smoke.matrix), "test", "--target", "smoke", "--image", variants["simd"])
    assert r.code == 1, r.err[-3000:]
    failed = set(re.findall(r"^\s+FAIL\s+(\S+)\s", r.err, re.M))
    assert failed == {"cpu_level"}, r.err[-3000:]


def test_numpy_from_pypi_loads_on_x86_64_v2_and_dies_on_the_baseline(cpu_variants, tmp_path):
    """A real wheel that dispatches at run time passes the smoke's claim; claimed x86-64, it fails, named."""
    smoke, variants = cpu_variants
    code, doc, err = _vet(smoke, variants["numpy"])
    row = {c["name"]: c for c in doc["checks"]}["cpu_level"]
    assert row["status"] == "pass", (row, err[-2000:])
    baseline = smoke.variant(
        tmp_path / "v1", "v1", lambda text: text.replace("linux/amd64: x86-64-v2", "linux/amd64: x86-64")
    )
    code, doc, err = _vet(baseline, variants["numpy"])
    row = {c["name"]: c for c in doc["checks"]}["cpu_level"]
    assert code == 1 and row["status"] == "fail", (row, err[-2000:])
    assert "import numpy: killed by SIGILL (Illegal instruction) on x86-64 (QEMU -cpu qemu64" in row["finding"], row
