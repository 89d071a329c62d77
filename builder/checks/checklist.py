"""The image checks, one test per entry of ``contract.CHECKS`` (same names, ``test_`` prefixed), run
by ``build test`` through pytest (boundary.py: who answers each); fixtures from runner.py: ``expect``
(matrix, record, source), ``image`` (the image config), ``image_host`` (boundary.ContainerHost, in a
container of the image), ``image_files`` (the image's files read on the host), ``pip_dir`` (pip for
``pip check``), ``report_warning``. Failures say expected and found.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import re
import shlex

import pytest

from builder.checks import boundary, probes
from builder.checks.toolchain import TOOLCHAIN
from builder.config import contract
from builder.config.cudamajor import is_other_major, major_minor
from builder.config.waivers import unwaived
from builder.deps.lock import normalize


def run_probe(image_host, name: str, request: dict, env: str = "") -> dict:
    """Run probe ``name`` (builder/checks/probes/) in the image; its facts, or a failure that shows why it
    could not run (its exit status and the end of its stderr)."""
    result = image_host.run(f"{env}{probes.PYTHON} -c %s %s", probes.script(name), json.dumps(request))
    found = probes.parse(result.stdout)
    if found is None:
        pytest.fail(
            f"expected the {name} probe to run in the image, found exit {result.rc} and no facts: "
            f"{_tail(result.stderr or result.stdout)}"
        )
    return found


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln.strip() for ln in (text or "").splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)[-600:] or "(no output)"


def need(facts: dict, *keys: str) -> None:
    """Fail (this check only) when the probe could not gather a fact the check reads."""
    broken = {k: facts.get("errors", {}).get(k) for k in keys if facts.get("errors", {}).get(k)}
    assert not broken, "expected the probe to gather " + "; ".join(f"{k}, found {v}" for k, v in broken.items())


# The compiled modules link libcuda.so.1, which only a GPU host's driver provides; the probes
# load the base image's forward-compatibility copy instead (loading needs no GPU). A module that
# is really missing still fails to import.
def _compat_env(expect) -> str:
    return f"LD_LIBRARY_PATH={shlex.quote(expect.compat_dir)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} "


@pytest.fixture(scope="session")
def facts(image_host, expect):
    request = {
        "modules": list(expect.modules.required + expect.modules.optional),
        "ops": list(expect.ops),
        "absent": sorted(expect.absent),
    }
    found = run_probe(image_host, "facts", request, _compat_env(expect))
    assert "error" not in found, f"expected the facts probe to run, found {found['error']}"
    return found


def test_cuda_runtime(facts, expect, image, image_files):
    need(facts, "libs", "version_json")
    want = expect.cudart_version
    runtimes = {p: e for p, e in facts["libs"].items() if "libcudart.so" in p}
    assert runtimes, f"expected a CUDA runtime (libcudart.so) reporting {want}, found none in the image"
    # The interpreter's answer held to the host's reading: a runtime that is not there never reports.
    absent = {p: image_files.runtime_problem(p, expect.platform) for p, e in runtimes.items() if e.get("version")}
    assert not any(absent.values()), "expected the CUDA runtime the probe reports in the image, found " + "; ".join(
        f"{p}: {why}" for p, why in sorted(absent.items()) if why
    )
    # The copy the imports mapped is judged (other copies: loaded_libraries); none mapped: every copy.
    real = {e.get("real") or p: p for p, e in runtimes.items()}
    judged = [real.get(m, m) for m in facts.get("mapped") or []] or sorted(runtimes)
    found = {p: runtimes.get(p, {}).get("version") for p in judged}
    unreadable = [f"{p} ({e['error']})" for p, e in sorted(runtimes.items()) if p in judged and e.get("error")]
    assert {v for v in found.values() if v or facts.get("mapped")} == {want}, (
        f"expected cudaRuntimeGetVersion() == {want} (CUDA {expect.cuda_major_minor}) from the "
        + ("loaded libcudart" if facts.get("mapped") else "libcudart (none loaded: every copy)")
        + ", found "
        + (", ".join(f"{v} at {p}" for p, v in sorted(found.items()) if v) or "no loadable libcudart")
        + (f"; unreadable: {', '.join(unreadable)}" if unreadable else "")
    )
    if facts["version_json"]:
        assert major_minor(facts["version_json"]) == expect.cuda_major_minor, (
            f"expected /usr/local/cuda/version.json CUDA {expect.cuda_major_minor}, found {facts['version_json']}"
        )
    if "CUDA_VERSION" in image.env:
        assert major_minor(image.env["CUDA_VERSION"]) == expect.cuda_major_minor, (
            f"expected CUDA_VERSION {expect.cuda_major_minor}.x, found {image.env['CUDA_VERSION']}"
        )
    torch = facts.get("torch")
    if torch:
        assert "error" not in torch, f"expected torch to import, found {torch.get('error')}"
        assert torch["cuda"] == expect.cuda_major_minor, (
            f"expected torch.version.cuda == {expect.cuda_major_minor}, "
            f"found {torch['cuda']} (torch {torch['version']})"
        )


def test_no_other_cuda_major(facts, expect, report_warning):
    need(facts, "libs", "dists")
    major = expect.cuda_major
    wrong = []
    for path, entry in sorted(facts["libs"].items()):
        m = re.search(r"lib(?:cudart|cublas)\.so\.(\d+)", path)
        if m and int(m.group(1)) != major:
            wrong.append(path)
        v = entry.get("version")
        if v and v // 1000 != major:
            wrong.append(f"{path} reports {v}")
    for name, version, *_ in facts["dists"]:
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


def test_compiled_modules(facts, expect, image_files):
    need(facts, "modules")
    broken = {m: facts["modules"].get(m) for m in expect.modules.required if facts["modules"].get(m)}
    # The interpreter's answer held to the host's reading: a module with no loadable file never imports
    # (where the probe already says why it does not, that stays the finding).
    for module, why in boundary.missing_modules(image_files, expect, expect.modules.required):
        broken.setdefault(module, why)
    assert expect.modules.required, "expected the source to declare compiled modules, found none (waive or add them)"
    hint = ""
    if facts.get("libcuda"):
        hint = f" (libcuda.so.1 could not be loaded from {expect.compat_dir}: {facts['libcuda']})"
    assert not broken, (
        "expected every compiled module to import, found: "
        + "; ".join(f"{m}: {err}" for m, err in sorted(broken.items()))
        + hint
    )


def test_ops_registered(facts, expect, report_warning):
    need(facts, "modules", "ops", "absent")
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
        f"{op} ({err})" for op, err in sorted(missing.items())
    )
    assert not appeared, (
        "expected these ops absent (source.extensions.absent), found them registered: "
        + ", ".join(appeared)
        + "; the build now has them: drop them from `absent`"
    )


def _installed(facts) -> tuple[dict[str, str], list[str]]:
    """name -> version installed, and each name installed twice (sys.path order picks one: a failure)."""
    copies: dict[str, list[str]] = {}
    for name, version, *where in facts["dists"]:
        copies.setdefault(normalize(name), []).append(f"{version}" + (f" at {where[0]}" if where else ""))
    twice = [
        f"{n}: {len(c)} copies installed ({', '.join(sorted(c))})" for n, c in sorted(copies.items()) if len(c) > 1
    ]
    return {normalize(n): v for n, v, *_ in facts["dists"]}, twice


def test_pinned_versions(facts, expect):
    if not expect.pins:
        pytest.skip("the target pins no FlashInfer or NCCL")
    need(facts, "dists")
    have, twice = _installed(facts)
    wrong = [t for t in twice if t.split(":")[0] in expect.pins]
    wrong += [
        f"{name}: expected {want}, found {have.get(name, 'not installed')}"
        for name, want in sorted(expect.pins.items())
        if have.get(name) != want
    ]
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
        "its owner must move hosts to the official image or extend the date in the matrix and rebuild"
    )
    horizon = expect.build_date + dt.timedelta(days=expect.horizon_days)
    assert expires <= horizon, (
        f"expected {key} at most {expect.horizon_days} days after the build ({horizon.isoformat()}), found {raw}"
    )
    assert expires == expect.expires, f"expected label {key} = {expect.expires.isoformat()} (matrix), found {raw}"
    left = (expires - expect.today).days
    if left <= expect.warning_days:
        report_warning(f"{key} {raw}: expires in {left} days (warning window {expect.warning_days} days)")


def test_labels(image, expect):
    wrong = [
        f"{k}: expected {v!r}, found {image.labels.get(k, '(missing)')!r}"
        for k, v in sorted(expect.labels.items())
        if k != expect.label_keys.expires and image.labels.get(k) != v
    ]
    assert not wrong, "; ".join(wrong)


def test_lock_contents(facts, expect):
    need(facts, "dists")
    src_name, src_version = expect.source_package  # the wheel's version, local label included
    have, problems = _installed(facts)
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
    command = f"{probes.PYTHON} -c %s %s check --disable-pip-version-check --no-color"
    result = image_host.run(command, probes.pip_script(), pip_dir)
    lines = [ln for ln in (result.stdout + result.stderr).splitlines() if ln.strip()]
    if result.rc == 0:
        return
    conflicts = []
    for line in lines:
        m = re.search(r"but you have (\S+) ", line)
        gone = re.search(r"requires (\S+), which is not installed", line)
        if m and normalize(m.group(1)) in expect.overrides:
            report_warning(f"pip check (expected, matrix override): {line}")
        elif gone and normalize(gone.group(1)) in expect.dropped:
            report_warning(f"pip check (expected, source.drop: {expect.dropped[normalize(gone.group(1))]}): {line}")
        else:
            conflicts.append(line)
    assert not conflicts, "expected pip check to pass, found: " + "; ".join(conflicts)


def test_non_root(image, facts, image_files):
    user = image.user.split(":")[0]
    assert user not in ("", "0", "root"), f"expected a non-root default user, found {image.user or '(unset: root)'}"
    uid = image_files.uid_of(image.user)  # the image's /etc/passwd, read on the host
    assert uid != 0, f"expected a non-root default user, found {image.user}, uid 0 in the image's /etc/passwd"
    assert facts["uid"] != 0, f"expected the container to run as non-root, found uid {facts['uid']}"


def test_no_world_writable(image_files):
    # Files: never. Directories: only sticky ones (/tmp, /var/tmp, /run/lock), and /tmp itself.
    # Read from the exported file system on the host: no program of the image answers (boundary.py).
    found = image_files.world_writable()
    assert not found, f"expected no world-writable files outside /tmp, found: {', '.join(found[:20])}"


def test_runtime_toolchain(image_host, image, expect, report_warning):
    env = f"K3_CHECK_CUDA_HOME={expect.cuda_home or ''} K3_CHECK_ARCH={expect.nvcc_arch}"
    result = image_host.run(f"{env} sh -c %s", TOOLCHAIN)
    assert result.rc == 0, f"expected the toolchain probe to run, found exit {result.rc}: {result.stderr[-300:]}"
    got = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    problems = []
    if not got.get("cc"):
        problems.append("no C compiler for Triton's run-time stubs (it looks for $CC, then gcc, then clang)")
    else:
        for key, what in (
            ("cc_link", "compile and link a C program"),
            ("cc_python", f"build a Python extension against {got.get('pyinclude')} as Triton does"),
        ):
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
        elif got.get("nvcc_headers") != "yes":
            problems.append(
                "nvcc cannot compile against the run-time JIT headers (cuda_runtime.h, nvrtc.h, curand.h, "
                f"cublas_v2.h): {got.get('nvcc_headers')}"
            )
    else:
        report_warning(
            "runtime_toolchain: skipped nvcc (version, a trivial kernel, JIT headers): the target declares no "
            "run-time CUDA toolkit (runtime.cuda_home unset); checked the C compiler and Python.h only"
        )
    for var in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"):
        if got.get(var, "ok") != "ok":
            problems.append(f"{var} points at no executable: {got[var].removeprefix('missing: ')}")
    assert not problems, "expected a run-time toolchain, found: " + "; ".join(problems)


def _listing(items: list[str], limit: int = 12) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def test_python_trees(image_host, expect, report_warning):
    if not expect.python_trees:
        pytest.skip("the matrix names no Python trees (source.extensions.python_trees)")
    request = {
        "trees": list(expect.python_trees),
        "skip": sorted(expect.python_skip),
        "setup": list(expect.python_setup),
    }
    found = run_probe(image_host, "trees", request, _compat_env(expect))
    assert "error" not in found, f"expected the trees probe to run, found {found.get('error')}"
    problems = [f"set-up {ref}: {err}" for ref, err in sorted(found["setup"].items()) if err]
    problems += [f"tree {tree}: {err}" for tree, err in sorted(found["trees"].items()) if err]
    problems += [f"{name}: {err}" for name, err in sorted(found["imported"].items()) if err]
    for name, effects in sorted(found.get("side_effects", {}).items()):  # report-only (issue 34, rule 8)
        shown = "; ".join(f"{kind} {what}" for kind, what in effects[:5])
        report_warning(f"python_trees: importing {name} made {len(effects)} side effect(s): {shown}")
    for pattern in sorted(expect.python_skip):
        count = sum(1 for p in found["skipped"].values() if p == pattern)
        if count:
            report_warning(f"python_trees: skipped {count} module(s) matching {pattern}: {expect.python_skip[pattern]}")
        else:  # a stale exclusion hides nothing today, and would hide a new module tomorrow
            report_warning(f"python_trees: skip pattern {pattern} matches no module: drop it from python_skip")
    assert not problems, (
        f"expected every module of {', '.join(expect.python_trees)} to import "
        f"({len(found['imported'])} tried), found: " + _listing(problems)
    )


def test_shared_libraries(image_host, image, expect, report_warning, image_files):
    request = {
        "roots": [expect.app_prefix],
        "ld_library_path": image.env.get("LD_LIBRARY_PATH", ""),
        "cuda_major": expect.cuda_major,
        "tracking": list(contract.CUDA_TRACKING_LIBS),
        "dlopen": sorted(expect.dlopen),
    }
    found = run_probe(image_host, "elf", request)
    assert "error" not in found, f"expected the ELF probe to run, found {found.get('error')}"
    assert found["elves"], f"expected ELF files under {expect.app_prefix}, found none"

    def who(entry):
        return f"{entry['path']}" + (f" ({entry['dist']})" if entry.get("dist") else "")

    problems, other = [], set()
    for e in found["other_major"]:
        dist = normalize(e["dist"].rsplit(" ", 1)[0]) if e.get("dist") else None
        other.add((e["path"], e["needed"]))
        if dist in expect.other_major:
            report_warning(
                f"shared_libraries: {who(e)} needs {e['needed']} (CUDA {e['major']}), allowed by the "
                f"matrix: {expect.other_major[dist]}"
            )
        else:
            problems.append(f"{who(e)} needs {e['needed']}, a CUDA {e['major']} library")
    for e in found["unresolved"]:
        if (e["path"], e["needed"]) in other or e["needed"] in contract.DRIVER_LIBRARIES:
            continue
        why = next((r for pat, r in expect.optional_libraries.items() if fnmatch.fnmatchcase(e["path"], pat)), None)
        if why:
            report_warning(f"shared_libraries: {who(e)} needs {e['needed']}, which the image lacks; allowed: {why}")
        else:
            problems.append(f"{who(e)} needs {e['needed']}, which nothing in the image provides")
    for name, err in sorted((found.get("dlopen") or {}).items()):
        if err:
            problems.append(f"{name} (loaded by name: {expect.dlopen[name]}) does not load: {err}")
    problems += [f"{path}: {why}" for path, why in boundary.static_unloadable(image_files, expect)]
    # Held to the NEEDED lists the host reads from the same files (elfdyn.py): what the probe left out
    reported = {(e["path"], e["needed"]) for e in found["unresolved"] + found["other_major"]}
    ld_path = image.env.get("LD_LIBRARY_PATH", "")
    problems += [f"{p}: {why}" for p, why in boundary.static_needed(image_files, expect, ld_path, reported)]
    if unread := boundary.host_unread(image_files, expect):  # said, never counted as needing nothing
        report_warning(boundary.unread_line(unread))
    assert not problems, (
        f"expected every NEEDED library of the {found['elves']} ELF files under "
        f"{expect.app_prefix} to resolve, found: " + _listing(problems)
    )


def test_image_hygiene(image_host, expect, report_warning):
    request = {"roots": [expect.app_prefix], "build_roots": list(contract.BUILD_ONLY_ROOTS)}
    found = run_probe(image_host, "hygiene", request)
    assert "error" not in found, f"expected the hygiene probe to run, found {found.get('error')}"
    problems = [f"symlink {path} -> {target} dangles" for path, target in found["dangling"]]
    problems += [f"symlink {path} -> {target} points into a build-only path" for path, target in found["outside"]]
    named = [(path, f"names {root}: {line}") for path, root, line in found["named"]]  # runtime.waivers may pass one
    problems += [f"{path} {what}" for path, what in unwaived(expect.waivers, "image_hygiene", named, report_warning)]
    total = sum(found["counts"].values())
    assert not problems, (
        f"expected nothing under {expect.app_prefix} to point at a build-only path "
        f"({', '.join(contract.BUILD_ONLY_ROOTS)}), found {total}: " + _listing(problems)
    )


def test_package_files(image_host, expect, report_warning):
    # A release built from a checkout ships every tracked file under the package (setuptools-scm's
    # file finder); PyPI's vLLM 0.30.0 wheel holds all 3,088 files of its sdist's vllm/. A build
    # from an export without VCS metadata drops the non-Python ones silently, and nothing imports
    # a shell wrapper or a tuning config until a user's flag needs it.
    if not expect.package_files:
        pytest.skip(f"the source carries no {expect.package}/ directory at the pinned commit")
    blobs = expect.package_blobs
    request = {"distribution": expect.source_package[0], "package": expect.package, "blobs": sorted(blobs)}
    found = run_probe(image_host, "files", request)
    assert "error" not in found, f"expected the files probe to list {expect.package}/, found {found.get('error')}"
    installed = found["files"]
    missing = sorted(path for path in expect.package_files if path not in installed)
    # Modules lose their mode on the way into a wheel (setuptools' build_py copies them with
    # preserve_mode=False: vLLM's executable envs.py is 0644 in PyPI's wheel); data files keep it.
    want_exec = {p for p, x in expect.package_files.items() if x and not p.endswith(".py")}
    not_exec = sorted(p for p in want_exec if p in installed and not installed[p])
    # By content too: setuptools copies every tracked file byte for byte (what a build generates, such
    # as vLLM's _version.py or its FlashAttention files, is untracked: not compared here).
    where = found["root"].rsplit("/", 1)[0]
    changed = [
        (f"{where}/{p}", f"differs from the pinned commit's (git blob {blobs[p][:12]}, installed {got[:12]})")
        for p, got in sorted(found.get("blobs", {}).items())
        if got != blobs.get(p)
    ]
    problems = [f"{p} missing" for p in missing] + [f"{p} not executable" for p in not_exec]
    problems += [f"{p}: {what}" for p, what in unwaived(expect.waivers, "package_files", changed, report_warning)]
    assert not problems, (
        f"expected every file of {expect.package}/ at the pinned commit ({len(expect.package_files)}) in "
        f"{found['root']} with its content, found {len(missing)} missing, {len(not_exec)} not executable and "
        f"{len(changed)} changed: " + _listing(problems)
    )


def test_recipe_cli(image_host, expect):
    recipe = expect.recipe
    if not recipe:
        pytest.skip("the matrix gives no launch command (runtime.recipe)")
    env = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(recipe.get("env", {}).items()))
    found = run_probe(image_host, "recipe", recipe, _compat_env(expect) + env)
    assert "error" not in found, f"expected the recipe probe to run, found {found.get('error')}"
    assert not found["parse"], f"expected the CLI to accept `{recipe['command']}`, found {found['parse']}"
    problems = [f"its validation: {found['validate']}"] if found["validate"] else []
    problems += [f"--{dest.replace('_', '-')} {err}" for dest, err in sorted(found["options"].items()) if err]
    if found["architecture"]:
        problems.append(f"architecture {recipe['architecture']}: {found['architecture']}")
    assert not problems, f"expected `{recipe['command']}` to be servable by the image's CLI, found: " + "; ".join(
        problems
    )


# --- os_packages: the OS layer's .debs, in the image as locked (builder/checks/probes/os.py) ---------------


def test_os_packages(image_host, expect, report_warning, image):
    osp = expect.os_packages
    if osp is None:
        pytest.skip("the target declares no os_packages")
    request = {
        "status_dir": contract.OS_STATUS_DIR,
        "locked": [list(e) for e in osp.locked],
        "listed": list(osp.listed),
        "loads": list(osp.loads),
        "runs": [list(c) for c in osp.runs],
    }
    facts = run_probe(image_host, "os", request)
    assert "error" not in facts, f"expected the OS package probe to run, found {facts.get('error')}"
    assert facts["checked"] == len(osp.locked) > 0, (
        f"expected {len(osp.locked)} locked packages, checked {facts['checked']}"
    )
    problems, cmds = facts["problems"], [" ".join(c) + " " for c in osp.runs]
    # Under QEMU a command may need what user-mode emulation lacks (numactl: NUMA syscalls): NOT CHECKED.
    emulated = [p for p in problems if expect.emulated and any(p.startswith(c) for c in cmds)]
    problems = [p for p in problems if p not in emulated]
    assert not problems, "expected the OS lock's packages in the image, found: " + "; ".join(problems)
    if emulated:
        said = "; ".join(" ".join(p.split()) for p in emulated)  # one line: the report keeps a message's first
        native = expect.native_command(image.ref)
        pytest.skip(f"NOT CHECKED (emulated, {expect.platform} under QEMU): {said}; natively, {native}")
