"""The image checks, one test per entry of ``contract.CHECKS`` (same names, ``test_`` prefixed).

Run by ``build test`` through pytest with testinfra's docker backend; fixtures come from
builder/imagechecks.py: ``expect`` (from the matrix, record and source), ``image`` (the image
config), ``image_host`` (testinfra, inside a container of the image), ``pip_dir`` (a copy of pip
for ``pip check``) and ``report_warning``. Every failure says what was expected and what was found.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from builder.cudamajor import is_other_major, major_minor
from builder.lock import normalize

# Runs inside the image with its own python. Gathers every fact the checks need in one process,
# because ops are registered by importing the compiled modules first.
PROBE = r"""
import ctypes, importlib, importlib.metadata as md, importlib.util, json, os, sys
req = json.loads(sys.argv[1])
facts = {"uid": os.getuid(), "libs": {}, "dists": [], "modules": {}, "ops": {}, "absent": {}}
try:  # the driver library the extensions link; in a GPU-less container, the base's compat copy
    ctypes.CDLL("libcuda.so.1")
    facts["libcuda"] = None
except OSError as exc:
    facts["libcuda"] = str(exc)
for top, dirs, files in os.walk("/"):
    if top in ("/proc", "/sys", "/dev"):
        dirs[:] = []
        continue
    for f in files:
        if f.startswith(("libcudart.so", "libcublas.so")):
            path = os.path.join(top, f)
            entry = {"real": os.path.realpath(path)}
            if f.startswith("libcudart.so"):
                try:
                    v = ctypes.c_int()
                    rc = ctypes.CDLL(path).cudaRuntimeGetVersion(ctypes.byref(v))
                    entry["version"] = v.value if rc == 0 else None
                    entry["error"] = None if rc == 0 else f"cudaRuntimeGetVersion returned {rc}"
                except OSError as exc:
                    entry["version"], entry["error"] = None, str(exc)
            facts["libs"][path] = entry
try:
    with open("/usr/local/cuda/version.json") as fh:
        facts["version_json"] = json.load(fh).get("cuda", {}).get("version")
except (OSError, ValueError):
    facts["version_json"] = None
facts["dists"] = sorted({(d.metadata["Name"], d.version) for d in md.distributions() if d.metadata["Name"]})
for name in req["modules"]:
    try:
        importlib.import_module(name)
        facts["modules"][name] = None
    except BaseException as exc:
        facts["modules"][name] = f"{type(exc).__name__}: {exc}"
def resolve(path):
    parts = path.split(".")
    obj = None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    if obj is None:
        return "no importable prefix"
    try:
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return None
    except BaseException as exc:
        return f"{type(exc).__name__}: {exc}"
for path in req["ops"]:
    facts["ops"][path] = resolve(path)
for path in req["absent"]:
    facts["absent"][path] = resolve(path)
if importlib.util.find_spec("torch"):
    try:
        import torch
        facts["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda}
    except BaseException as exc:
        facts["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(facts))
"""


@pytest.fixture(scope="session")
def facts(image_host, expect):
    request = {"modules": list(expect.modules.required + expect.modules.optional), "ops": list(expect.ops),
               "absent": sorted(expect.absent)}
    # The compiled modules link libcuda.so.1, which only a GPU host's driver provides; the probe
    # loads the base image's forward-compatibility copy instead (loading needs no GPU). A module
    # that is really missing still fails to import.
    result = image_host.run("LD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} python -c %s %s",
                            expect.compat_dir, PROBE, json.dumps(request))
    assert result.rc == 0, f"the probe could not run in the image: expected exit 0, found {result.rc}: {result.stderr[-300:]}"
    return json.loads(result.stdout)


def test_cuda_runtime(facts, expect, image):
    want = expect.cudart_version
    runtimes = {p: e for p, e in facts["libs"].items() if "libcudart.so" in p}
    assert runtimes, f"expected a CUDA runtime (libcudart.so) reporting {want}, found none in the image"
    reported = {p: e.get("version") for p, e in runtimes.items() if e.get("version")}
    assert want in reported.values(), (
        f"expected cudaRuntimeGetVersion() == {want} (CUDA {expect.cuda_major_minor}), found "
        + (", ".join(f"{v} at {p}" for p, v in sorted(reported.items())) or "no loadable libcudart")
    )
    if facts["version_json"]:
        assert major_minor(facts["version_json"]) == expect.cuda_major_minor, (
            f"expected /usr/local/cuda/version.json CUDA {expect.cuda_major_minor}, found {facts['version_json']}")
    if "CUDA_VERSION" in image.env:
        assert major_minor(image.env["CUDA_VERSION"]) == expect.cuda_major_minor, (
            f"expected CUDA_VERSION {expect.cuda_major_minor}.x, found {image.env['CUDA_VERSION']}")
    torch = facts.get("torch")
    if torch:
        assert "error" not in torch, f"expected torch to import, found {torch.get('error')}"
        assert torch["cuda"] == expect.cuda_major_minor, (
            f"expected torch.version.cuda == {expect.cuda_major_minor}, found {torch['cuda']} (torch {torch['version']})")


def test_no_other_cuda_major(facts, expect, report_warning):
    major = expect.cuda_major
    wrong = []
    for path, entry in sorted(facts["libs"].items()):
        m = re.search(r"lib(?:cudart|cublas)\.so\.(\d+)", path)
        if m and int(m.group(1)) != major:
            wrong.append(path)
        v = entry.get("version")
        if v and v // 1000 != major:
            wrong.append(f"{path} reports {v}")
    for name, version in facts["dists"]:
        if not is_other_major(name, version, major):
            continue
        reason = expect.other_major.get(normalize(name))
        if reason:  # expected, and said so in the check's output, not silently skipped
            report_warning(f"no_other_cuda_major: {name} {version} allowed by the matrix: {reason}")
        else:
            wrong.append(f"distribution {name} {version}")
    torch = facts.get("torch") or {}
    if torch.get("version") and is_other_major("torch", torch["version"], major):
        wrong.append(f"torch {torch['version']}")
    assert not wrong, f"expected only CUDA {major} libraries and packages, found: {'; '.join(wrong)}"


def test_compiled_modules(facts, expect):
    broken = {m: facts["modules"].get(m) for m in expect.modules.required if facts["modules"].get(m)}
    assert expect.modules.required, "expected the source to declare compiled modules, found none (waive or add them)"
    hint = ""
    if facts.get("libcuda"):
        hint = f" (libcuda.so.1 could not be loaded from {expect.compat_dir}: {facts['libcuda']})"
    assert not broken, "expected every compiled module to import, found: " + "; ".join(
        f"{m}: {err}" for m, err in sorted(broken.items())) + hint


def test_ops_registered(facts, expect, report_warning):
    for module in expect.modules.optional:
        if facts["modules"].get(module):
            report_warning(f"optional module {module} does not import: {facts['modules'][module]}")
    if not expect.ops and not expect.absent:
        pytest.skip("the matrix names no ops for this target")
    missing = {op: err for op, err in facts["ops"].items() if err}
    appeared = sorted(op for op, err in facts["absent"].items() if err is None)
    for op, reason in sorted(expect.absent.items()):
        if op not in appeared:
            report_warning(f"ops_registered: {op} absent as the matrix expects: {reason}")
    assert not missing, "expected every named op to be registered, found missing: " + "; ".join(
        f"{op} ({err})" for op, err in sorted(missing.items()))
    assert not appeared, ("expected these ops absent (source.extensions.absent), found them registered: "
                          + ", ".join(appeared) + "; the build now has them: drop them from `absent`")


def test_pinned_versions(facts, expect):
    if not expect.pins:
        pytest.skip("the target pins no FlashInfer or NCCL")
    have = {normalize(n): v for n, v in facts["dists"]}
    wrong = [f"{name}: expected {want}, found {have.get(name, 'not installed')}"
             for name, want in sorted(expect.pins.items()) if have.get(name) != want]
    assert not wrong, "; ".join(wrong)


def test_expiry(image, expect, report_warning):
    key = expect.label_keys.expires
    raw = image.labels.get(key, "")
    assert raw, f"expected label {key} = {expect.expires.isoformat()}, found it missing"
    try:
        expires = dt.date.fromisoformat(raw)
    except ValueError:
        pytest.fail(f"expected label {key} to be an ISO date (YYYY-MM-DD), found {raw!r}")
    assert expires >= expect.today, (
        f"expected {key} not in the past, found {raw} (today {expect.today.isoformat()}): the image has expired; "
        "its owner must move hosts to the official image or extend the date in the matrix and rebuild")
    horizon = expect.build_date + dt.timedelta(days=expect.horizon_days)
    assert expires <= horizon, (
        f"expected {key} at most {expect.horizon_days} days after the build ({horizon.isoformat()}), found {raw}")
    assert expires == expect.expires, f"expected label {key} = {expect.expires.isoformat()} (matrix), found {raw}"
    left = (expires - expect.today).days
    if left <= expect.warning_days:
        report_warning(f"{key} {raw}: expires in {left} days (warning window {expect.warning_days} days)")


def test_labels(image, expect):
    wrong = [f"{k}: expected {v!r}, found {image.labels.get(k, '(missing)')!r}"
             for k, v in sorted(expect.labels.items())
             if k != expect.label_keys.expires and image.labels.get(k) != v]
    assert not wrong, "; ".join(wrong)


def test_lock_contents(facts, expect):
    src_name, src_version = expect.source_package  # the wheel's version, local label included
    have = {normalize(n): v for n, v in facts["dists"]}
    problems = []
    for name, version in sorted(have.items()):
        if name == src_name:
            if version != src_version:
                problems.append(f"{name}: expected {src_version} (the source), found {version}")
        elif name not in expect.lock:
            problems.append(f"{name} {version}: not in the lock")
        elif expect.lock[name] != version:
            problems.append(f"{name}: expected {expect.lock[name]} (lock), found {version}")
    for name, version in sorted(expect.lock.items()):
        if name not in have:
            problems.append(f"{name} {version}: in the lock, not installed")
    if src_name not in have:
        problems.append(f"{src_name} {src_version}: the source's package is not installed")
    assert not problems, "expected the environment to equal the lock, found: " + "; ".join(problems)


def test_pip_check(image_host, pip_dir, expect, report_warning):
    result = image_host.run("PYTHONPATH=%s python -m pip check --disable-pip-version-check --no-color", pip_dir)
    lines = [ln for ln in (result.stdout + result.stderr).splitlines() if ln.strip()]
    if result.rc == 0:
        return
    conflicts = []
    for line in lines:
        m = re.search(r"but you have (\S+) ", line)
        if m and normalize(m.group(1)) in expect.overrides:
            report_warning(f"pip check (expected, matrix override): {line}")
        else:
            conflicts.append(line)
    assert not conflicts, "expected pip check to pass, found: " + "; ".join(conflicts)


def test_non_root(image, facts):
    user = image.user.split(":")[0]
    assert user not in ("", "0", "root"), f"expected a non-root default user, found {image.user or '(unset: root)'}"
    assert facts["uid"] != 0, f"expected the container to run as non-root, found uid {facts['uid']}"


def test_no_world_writable(image_host):
    # Files: never. Directories: only sticky ones (/tmp, /var/tmp, /run/lock), and /tmp itself.
    result = image_host.run(
        "find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -perm -0002 ! -type l "
        "\\( ! -type d -o ! -perm -1000 \\) ! -path /tmp -print 2>/dev/null")
    found = [line for line in result.stdout.splitlines() if line.strip()]
    assert not found, f"expected no world-writable files outside /tmp, found: {', '.join(found[:20])}"


# Run inside the image: what code that compiles at run time needs. Triton builds its driver stub
# with the C compiler and Python.h on first use; FlashInfer and DeepGEMM JIT with nvcc.
TOOLCHAIN = r"""
set -u
work=$(mktemp -d)
cd "$work"
cc=${CC:-}
[ -n "$cc" ] || cc=$(command -v cc || command -v gcc || command -v clang || true)
echo "cc=$cc"
includepy=$(python -c 'import sysconfig; print(sysconfig.get_config_var("INCLUDEPY"))')
echo "includepy=$includepy"
[ -f "$includepy/Python.h" ] && echo "python_h=yes" || echo "python_h=no"
if [ -n "$cc" ]; then
  printf '#include <stdio.h>\nint main(void){puts("k3-toolchain-ok");return 0;}\n' > t.c
  if "$cc" -o t t.c > cc.log 2>&1 && [ "$(./t)" = k3-toolchain-ok ]; then echo "cc_link=yes"; else echo "cc_link=no: $(tail -n 2 cc.log | tr '\n' ' ')"; fi
  printf '#include <Python.h>\nint k3(void){return Py_IsInitialized();}\n' > p.c
  if "$cc" -c -fPIC -I"$includepy" p.c -o p.o > p.log 2>&1; then echo "cc_python=yes"; else echo "cc_python=no: $(tail -n 2 p.log | tr '\n' ' ')"; fi
fi
if [ -n "${K3_CHECK_CUDA_HOME:-}" ]; then
  nvcc="$K3_CHECK_CUDA_HOME/bin/nvcc"
  if [ -x "$nvcc" ]; then
    echo "nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p' | head -n 1)"
    printf '__global__ void k3(float *x){x[threadIdx.x]*=2.0f;}\n' > k.cu
    if "$nvcc" -c -arch="$K3_CHECK_ARCH" k.cu -o k.o > nvcc.log 2>&1; then echo "nvcc_compile=yes"; else echo "nvcc_compile=no: $(tail -n 2 nvcc.log | tr '\n' ' ')"; fi
  else
    echo "nvcc_version=missing: no executable $nvcc"
  fi
fi
for var in TRITON_PTXAS_PATH TRITON_PTXAS_BLACKWELL_PATH; do
  eval "p=\${$var:-}"
  if [ -n "$p" ]; then [ -x "$p" ] && echo "$var=ok" || echo "$var=missing: $p"; fi
done
cd / && rm -rf "$work"
"""


def test_runtime_toolchain(image_host, image, expect, report_warning):
    env = f"K3_CHECK_CUDA_HOME={expect.cuda_home or ''} K3_CHECK_ARCH={expect.nvcc_arch}"
    result = image_host.run(f"{env} sh -c %s", TOOLCHAIN)
    assert result.rc == 0, f"expected the toolchain probe to run, found exit {result.rc}: {result.stderr[-300:]}"
    got = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    problems = []
    if not got.get("cc"):
        problems.append("no C compiler (CC, cc, gcc or clang) for Triton's run-time stubs")
    else:
        for key, what in (("cc_link", "compile and link a C program"), ("cc_python", "compile against Python.h")):
            if got.get(key) != "yes":
                problems.append(f"{got['cc']} cannot {what}: {got.get(key, 'not tried')}")
    if got.get("python_h") != "yes":
        problems.append(f"no Python.h in INCLUDEPY={got.get('includepy')}")
    if expect.cuda_home:
        if image.env.get("CUDA_HOME") != expect.cuda_home:
            problems.append(f"CUDA_HOME: expected {expect.cuda_home}, found {image.env.get('CUDA_HOME', '(unset)')}")
        version = got.get("nvcc_version", "not run")
        if major_minor(version) != expect.cuda_major_minor:
            problems.append(f"nvcc: expected release {expect.cuda_major_minor}, found {version}")
        elif got.get("nvcc_compile") != "yes":
            problems.append(f"nvcc cannot compile a trivial kernel for {expect.nvcc_arch}: {got.get('nvcc_compile')}")
    else:
        report_warning("runtime_toolchain: skipped nvcc (version and a trivial kernel): the target declares no "
                       "run-time CUDA toolkit (runtime.cuda_home unset); checked the C compiler and Python.h only")
    for var in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"):
        if got.get(var, "ok") != "ok":
            problems.append(f"{var} points at no executable: {got[var].removeprefix('missing: ')}")
    assert not problems, "expected a run-time toolchain, found: " + "; ".join(problems)


# --- os_packages (issue 24): the OS layer's .debs, in the image as locked -----------------------
OS_PROBE = r"""
import ctypes, glob, hashlib, json, os, re, subprocess, sys
req = json.loads(sys.argv[1])
sd, out = "/var/lib/dpkg/status.d", {"problems": []}
def fields(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return dict(re.findall(r"^([A-Za-z-]+): (.*)$", fh.read(), re.M))
    except OSError:
        return None
base = set()
with open("/var/lib/dpkg/status", encoding="utf-8") as fh:
    for stanza in fh.read().split("\n\n"):
        f = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if f.get("Status", "").endswith(" installed"):
            base.add(f.get("Package"))
for name, version, arch in req["locked"]:
    f = fields(os.path.join(sd, name))
    if f is None:
        out["problems"].append(f"{name}: no {sd}/{name}")
        continue
    if (f.get("Version"), f.get("Architecture")) != (version, arch):
        out["problems"].append(f"{name}: expected {version} {arch}, found {f.get('Version')} {f.get('Architecture')}")
    try:
        sums = open(os.path.join(sd, name + ".md5sums"), encoding="utf-8").read().splitlines()
    except OSError:
        sums = []
    for line in sums:
        digest, path = line.split(None, 1)
        try:
            with open("/" + path, "rb") as fh:
                got = hashlib.md5(fh.read()).hexdigest()
        except OSError as exc:
            got = f"missing ({exc.strerror})"
        if got != digest:
            out["problems"].append(f"{name}: /{path} {got if got.startswith('missing') else 'differs from the package'}")
for name in req["listed"]:
    if name not in base and fields(os.path.join(sd, name)) is None:
        out["problems"].append(f"{name}: listed in os_packages, neither in the OS layer nor in the base")
for item in req["loads"]:
    paths = sorted(glob.glob(item)) if item.startswith("/") else [item]
    if not paths:
        out["problems"].append(f"{item}: matches no file")
    for path in paths:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            out["problems"].append(f"{path} does not load: {exc}")
for cmd in req["runs"]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            out["problems"].append(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-200:]}")
    except (OSError, subprocess.SubprocessError) as exc:
        out["problems"].append(f"{' '.join(cmd)} did not run: {exc}")
out["checked"] = len(req["locked"])
print(json.dumps(out))
"""


def test_os_packages(image_host, expect, report_warning):
    osp = expect.os_packages
    if osp is None:
        report_warning("os_packages: skipped: the target declares no os_packages")
        return
    request = {"locked": [list(e) for e in osp.locked], "listed": list(osp.listed), "loads": list(osp.loads),
               "runs": [list(c) for c in osp.runs]}
    result = image_host.run("python -c %s %s", OS_PROBE, json.dumps(request))
    assert result.rc == 0, f"expected the OS package probe to run, found exit {result.rc}: {result.stderr[-300:]}"
    facts = json.loads(result.stdout)
    assert facts["checked"] == len(osp.locked) > 0, f"expected {len(osp.locked)} locked packages, checked {facts['checked']}"
    assert not facts["problems"], "expected the OS lock's packages in the image, found: " + "; ".join(facts["problems"])
