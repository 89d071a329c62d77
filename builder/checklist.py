"""The image checks, one test per entry of ``contract.CHECKS`` (same names, ``test_`` prefixed).

Run by ``build test`` through pytest with testinfra's docker backend; fixtures come from
builder/checks.py: ``expect`` (from the matrix, record and source), ``image`` (the image config),
``host`` (testinfra, inside a container of the image). Every failure says what was expected and
what was found.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from builder import contract
from builder.lock import normalize

# Runs inside the image with its own python. Gathers every fact the checks need in one process,
# because ops are registered by importing the compiled modules first.
PROBE = r"""
import ctypes, importlib, importlib.metadata as md, importlib.util, json, os, sys
req = json.loads(sys.argv[1])
facts = {"uid": os.getuid(), "libs": {}, "dists": [], "modules": {}, "ops": {}}
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
for path in req["ops"]:
    parts = path.split(".")
    obj, err = None, None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    if obj is None:
        facts["ops"][path] = "no importable prefix"
        continue
    try:
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        facts["ops"][path] = None
    except BaseException as exc:
        facts["ops"][path] = f"{type(exc).__name__}: {exc}"
if importlib.util.find_spec("torch"):
    try:
        import torch
        facts["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda}
    except BaseException as exc:
        facts["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(facts))
"""


_TRACKS_CUDA = re.compile(r"cuda-toolkit|nvidia-cuda-[a-z-]+|nvidia-cublas|nvidia-nvjitlink|nvidia-cufft|nvidia-curand"
                          r"|nvidia-cusolver|nvidia-cusparse")



@pytest.fixture(scope="session")
def facts(image_host, expect):
    request = {"modules": list(expect.modules.required + expect.modules.optional), "ops": list(expect.ops)}
    result = image_host.run("python -c %s %s", PROBE, json.dumps(request))
    assert result.rc == 0, f"the probe could not run in the image: expected exit 0, found {result.rc}: {result.stderr[-300:]}"
    return json.loads(result.stdout)


def _major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


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
        assert _major_minor(facts["version_json"]) == expect.cuda_major_minor, (
            f"expected /usr/local/cuda/version.json CUDA {expect.cuda_major_minor}, found {facts['version_json']}")
    if "CUDA_VERSION" in image.env:
        assert _major_minor(image.env["CUDA_VERSION"]) == expect.cuda_major_minor, (
            f"expected CUDA_VERSION {expect.cuda_major_minor}.x, found {image.env['CUDA_VERSION']}")
    torch = facts.get("torch")
    if torch:
        assert "error" not in torch, f"expected torch to import, found {torch.get('error')}"
        assert torch["cuda"] == expect.cuda_major_minor, (
            f"expected torch.version.cuda == {expect.cuda_major_minor}, found {torch['cuda']} (torch {torch['version']})")


def test_no_other_cuda_major(facts, expect):
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
        norm = normalize(name)
        m = re.search(r"-cu(\d+)$", norm)
        if m and int(m.group(1)) != major:
            wrong.append(f"distribution {name} {version}")
        # CUDA 13's wheels dropped the -cuNN suffix (cuda-toolkit, nvidia-cuda-runtime, ...):
        # their version is the CUDA version. PyPI's torch 2.14 pulls these in.
        elif not m and _TRACKS_CUDA.fullmatch(norm) and version.split(".")[0] != str(major):
            wrong.append(f"distribution {name} {version}")
    torch = facts.get("torch") or {}
    local = (torch.get("version") or "").partition("+")[2]
    if re.fullmatch(r"cu\d+", local) and not local.startswith(f"cu{major}"):
        wrong.append(f"torch {torch['version']}")
    assert not wrong, f"expected only CUDA {major} libraries and packages, found: {'; '.join(wrong)}"


def test_compiled_modules(facts, expect):
    broken = {m: facts["modules"].get(m) for m in expect.modules.required if facts["modules"].get(m)}
    assert expect.modules.required, "expected the source to declare compiled modules, found none (waive or add them)"
    assert not broken, "expected every compiled module to import, found: " + "; ".join(
        f"{m}: {err}" for m, err in sorted(broken.items()))


def test_ops_registered(facts, expect, report_warning):
    for module in expect.modules.optional:
        if facts["modules"].get(module):
            report_warning(f"optional module {module} does not import: {facts['modules'][module]}")
    if not expect.ops:
        pytest.skip("the matrix names no ops for this target")
    missing = {op: err for op, err in facts["ops"].items() if err}
    assert not missing, "expected every named op to be registered, found missing: " + "; ".join(
        f"{op} ({err})" for op, err in sorted(missing.items()))


def test_pinned_versions(facts, expect):
    if not expect.pins:
        pytest.skip("the target pins no FlashInfer or NCCL")
    have = {normalize(n): v for n, v in facts["dists"]}
    wrong = [f"{name}: expected {want}, found {have.get(name, 'not installed')}"
             for name, want in sorted(expect.pins.items()) if have.get(name) != want]
    assert not wrong, "; ".join(wrong)


def test_expiry(image, expect, report_warning):
    key = contract.LABEL_EXPIRES
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
             if k != contract.LABEL_EXPIRES and image.labels.get(k) != v]
    assert not wrong, "; ".join(wrong)


def test_lock_contents(facts, expect):
    src_name, src_version = expect.source_package
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
