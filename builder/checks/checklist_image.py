"""The whole-image checks: rules that hold over everything under the application prefix and the
image config, never over a list of names (issue 34). Same fixtures as builder/checks/checklist.py;
each runs its probe (builder/checks/probes/) once per image.

A finding is failed unless the matrix waives its path for that check (``runtime.waivers``:
builder/config/waivers.py); a waived finding is shown as a warning with its reason, and a waiver
that matched nothing is shown too.
"""

from __future__ import annotations

import shlex

import pytest

from builder.checks import boundary, cpurun, probes
from builder.checks.checklist import _compat_env, _listing, run_probe
from builder.config import contract
from builder.config.waivers import unwaived, waived


def _unwaived(expect, check: str, findings: list[tuple[str, str]], report_warning) -> list[str]:
    """``findings`` ([path, what]) the matrix does not waive for ``check``, as "path: what"."""
    return [f"{path}: {what}" for path, what in unwaived(expect.waivers, check, findings, report_warning)]


def _probe(image_host, name: str, request: dict, env: str = "") -> dict:
    found = run_probe(image_host, name, request, env)
    assert "error" not in found, f"expected the {name} probe to run, found {found.get('error')}"
    return found


def _recipe_env(expect) -> str:
    """runtime.recipe.env, as recipe_cli runs with it (cu129: VLLM_TARGET_DEVICE=cpu, without which
    vLLM finds no platform on a GPU-less host and cannot build its parser)."""
    env = (expect.recipe or {}).get("env", {})
    return "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(env.items()))


def _argv(image) -> list[str]:
    return [*image.entrypoint, *image.cmd]


def test_installed_files(image_host, expect, report_warning, image_files):
    request = {"roots": [expect.app_prefix], "dpkg_info": contract.DPKG_INFO_DIR, "wheels": expect.wheel_records}
    found = _probe(image_host, "installed", request)
    if expect.wheel_records is None:
        report_warning(
            "installed_files: no wheel RECORD digests recorded for this image (a record made before them, or "
            "another lock): each RECORD is checked against its files only, so a re-hashed RECORD line passes"
        )
    else:
        added = found["pip_added"]
        report_warning(
            f"installed_files: {found['wheel_checked']} RECORDs equal their locked wheel's; pip added "
            f"{added['metadata']} INSTALLER/REQUESTED/direct_url.json, {added['bytecode']} bytecode and "
            f"{added['outside']} script/header entries outside site-packages (hashed above like every other line)"
        )
    # The probe's answer held to the host's reading: every RECORD hash checked again on the host.
    seen = {path for path, _ in found["problems"]}
    host = [(p, w) for p, w in image_files.record_problems(expect.app_prefix) if p not in seen]
    found["count"] += len(host)
    problems = _unwaived(expect, "installed_files", [*found["problems"], *host], report_warning)
    assert not problems, (
        f"expected every file of the {found['dists']} distributions under {expect.app_prefix} to equal its "
        f"RECORD ({found['hashed']} hashed), each RECORD the locked wheel's ({found['wheel_checked']} compared) "
        f"and the base's {found['dpkg_checked']} dpkg files their md5sums, found {found['count']}: "
        + _listing(problems)
    )


def test_everything_loads(image_host, expect, report_warning, image_files):
    request = {"roots": [expect.app_prefix], "driver_libraries": sorted(contract.DRIVER_LIBRARIES), "timeout": 120}
    found = _probe(image_host, "loads", request, _compat_env(expect))
    gaps: dict[str, int] = {}
    for _, soname in found["gaps"]:
        gaps[soname] = gaps.get(soname, 0) + 1
    for soname, count in sorted(gaps.items()):
        report_warning(
            f"everything_loads: {count} file(s) need {soname} ({contract.DRIVER_LIBRARIES[soname]}), "
            "which the container runtime mounts: their symbols are not checked"
        )
    failed = [
        (path, f"{'import ' + module if module else 'dlopen RTLD_NOW'}: {err}") for path, module, err in found["failed"]
    ]
    left = []
    for (
        path,
        what,
    ) in failed:  # runtime.optional_libraries (loaded only when selected) pass, shown, as in shared_libraries
        hit = waived({"optional": expect.optional_libraries}, "optional", path)
        if hit:
            report_warning(f"everything_loads: {path}: {what}; optional ({hit[0]}): {hit[1]}")
        else:
            left.append((path, what))
    # The probe's answer held to the host's reading: bytes that are not a loadable ELF never load.
    left += [(p, w) for p, w in boundary.static_unloadable(image_files, expect) if p not in {q for q, _ in left}]
    # What the imports mapped is held to the image's files: code an import writes and loads is in no layer.
    left += boundary.mapped_elsewhere(image_files, found.get("mapped", []))
    if found.get("dlopened"):  # dlopen targets: loaded by name at import, no NEEDED entry shows them
        shown = ", ".join(found["dlopened"][:8]) + (" ..." if len(found["dlopened"]) > 8 else "")
        report_warning(f"everything_loads: {len(found['dlopened'])} libraries loaded by dlopen at import: {shown}")
    problems = _unwaived(expect, "everything_loads", left, report_warning)
    assert not problems, (
        f"expected each of the {found['extensions']} extension modules to import and the {found['shared']} other "
        f"shared objects under {expect.app_prefix} to load with every symbol bound ({found['covered']} more in "
        f"their dependents' load), found {found['count']}: " + _listing(problems)
    )


def test_loaded_libraries(image_host, image, expect, report_warning):
    env = {var: image.env[var] for var in ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD") if var in image.env}
    for var, value in sorted(env.items()):
        report_warning(f"loaded_libraries: the image config sets {var}={value}")
    request = {"argv": _argv(image), "package": expect.package, "roots": [expect.app_prefix], "env": env}
    found = _probe(image_host, "loaded", request, _compat_env(expect))
    for kind, what in found.get("side_effects", []):  # report-only (issue 34, rule 8)
        report_warning(f"loaded_libraries: importing the app made a {kind}: {what}")
    problems = [f"import {m}: {err}" for m, err in sorted(found["imports"].items()) if err]
    if len(found["cudart"]) > 1:
        problems.append(f"{len(found['cudart'])} libcudart mapped: {', '.join(found['cudart'])}")
    nccl = next((v for n, v in expect.pins.items() if n.startswith("nvidia-nccl-cu")), None)
    if nccl:
        want = int("".join(f"{int(x):02d}" if i else x for i, x in enumerate(nccl.split(".")[:3])))
        problems += [f"{p} reports NCCL {v}, expected {want} ({nccl})" for p, v in found["nccl"].items() if v != want]
    findings = [
        (path, f"reports {v}, expected {expect.cudart_version} (CUDA {expect.cuda_major_minor})")
        for path, v in sorted(found["copies"].items())
        if v != expect.cudart_version and path not in found["cudart"]  # the loaded one is cuda_runtime's
    ]
    for var, entries in sorted(found["paths"].items()):
        for entry, e in sorted(entries.items()):
            if not e["exists"]:
                findings.append((entry, f"{var} names a path that does not exist"))
            elif e["shadows"]:
                findings.append((entry, f"{var} entry shadows the application's {', '.join(e['shadows'][:5])}"))
    problems += _unwaived(expect, "loaded_libraries", findings, report_warning)
    assert not problems, (
        f"expected the entrypoint's process to map one libcudart and the pinned NCCL, every CUDA runtime copy to "
        f"report CUDA {expect.cuda_major_minor}, and no search path of the config to shadow or dangle, found: "
        + _listing(problems)
    )


def test_image_starts(image_host, image, expect, report_warning):
    argv = _argv(image)
    request = {"argv": argv, "help": [*(image.entrypoint or argv)[1:], "--help"], "timeout": 120}
    found = _probe(image_host, "starts", request, _compat_env(expect) + _recipe_env(expect))
    entry = found["entrypoint"]
    findings = [(entry.get("program") or (argv or ["(none)"])[0], entry["error"])] if entry["error"] else []
    findings += [
        (p, f"{s['value']} ({s['dist']}): {s['error']}") for p, s in sorted(found["scripts"].items()) if s["error"]
    ]
    problems = _unwaived(expect, "image_starts", findings, report_warning)
    assert not problems, (
        f"expected `{' '.join(argv)}` to resolve and its --help to run, and each of the {len(found['scripts'])} "
        "console scripts to have its script, interpreter and entry point, found: " + _listing(problems)
    )


def test_least_privilege(image_host, expect, report_warning, image_files):
    found = _probe(image_host, "privilege", {"roots": [expect.app_prefix], "caches": contract.CACHE_ENV})
    setid = dict(found["setid"]) | dict(image_files.setid(expect.app_prefix))  # the host's reading too
    findings = [(p, f"set-id mode {mode}") for p, mode in sorted(setid.items())]
    findings += [(path, f"{var} {why}") for var, (path, why) in sorted(found["caches"].items()) if why]
    findings += [(p, f"writable by uid {found['uid']} (mode {m}, owner {u}:{g})") for p, m, u, g in found["writable"]]
    problems = _unwaived(expect, "least_privilege", findings, report_warning)
    assert not problems, (
        f"expected no setuid/setgid file under {expect.app_prefix} and nothing on sys.path or PATH writable by "
        f"the runtime user (uid {found['uid']}, groups {found['gids']}; {found['scanned']} paths), its "
        f"{len(found['caches'])} cache directories writable and off both paths, "
        f"found {found['count']}: " + _listing(problems)
    )


def test_bytecode_matches(image_host, expect, report_warning):
    found = _probe(image_host, "bytecode", {"roots": [expect.app_prefix]})
    if found["checked"] == 0 and not found["problems"]:
        pytest.fail(f"expected checked hash-based bytecode under {expect.app_prefix}, found no .pyc with a source")
    problems = _unwaived(expect, "bytecode_matches", found["problems"], report_warning)
    assert not problems, (
        f"expected every .pyc under {expect.app_prefix} checked hash-based with its source's hash "
        f"({found['checked']} checked) and none sourceless, found {found['count']}: " + _listing(problems)
    )


def test_page_alignment(image_host, image, expect, report_warning):
    # What the config's PATH and LD_LIBRARY_PATH name is run and loaded too (the toolkit's nvcc and
    # ptxas, /usr/local/cuda/lib64); the probe adds the dynamic loader's own directories.
    dirs = [d for var in ("PATH", "LD_LIBRARY_PATH") for d in image.env.get(var, "").split(":") if d.startswith("/")]
    request = {"roots": [expect.app_prefix, *dirs], "pages": contract.LARGEST_PAGE, "loader": True}
    found = _probe(image_host, "pagealign", request)
    machine, page = found["machine"], found["page"]
    if page is None:
        known = ", ".join(f"{m} {p}" for m, p in sorted(contract.LARGEST_PAGE.items()))
        pytest.skip(f"the image's interpreter is {machine}: no kernel page above 4 KiB to fit (only {known})")
    if found["other_machine"]:
        report_warning(
            f"page_alignment: {found['other_machine']} ELF file(s) of another machine than {machine} not judged "
            "(a process of this image cannot load them)"
        )
    where = ", ".join(found["roots"])
    assert found["checked"], f"expected {machine} ELF files under {where}, found none"
    problems = _unwaived(expect, "page_alignment", found["problems"], report_warning)
    assert not problems, (
        f"expected every {machine} ELF file under {where} ({found['checked']} checked) to map on a "
        f"{page // 1024}K-page kernel: each PT_LOAD's p_align and p_vaddr - p_offset a multiple of {page:#x}, "
        f"found {found['count']}: " + _listing(problems)
    )


def test_cpu_level(image_host, expect, report_warning):
    from builder.checks.runner import host_platform

    platform = expect.platform or host_platform()
    plan = cpurun.plan(expect.cpu, platform, expect.qemu)
    if plan.not_checked or plan.level is None:
        pytest.skip(plan.not_checked)
    level, env = plan.level, _compat_env(expect)
    request = {"roots": [expect.app_prefix], "driver_libraries": sorted(contract.DRIVER_LIBRARIES)}
    native = cpurun.load_all(image_host, cpurun.command(probes.PYTHON, env), request)
    model = cpurun.load_all(image_host, cpurun.command(probes.PYTHON, env, plan.qemu, level.model), request)
    if model.unstarted and native.complete:  # a wrapper script, say: QEMU starts ELF programs only
        pytest.skip(f"NOT CHECKED: {level.name}: QEMU could not start the image's python (not an ELF program?)")
    # Nothing loaded as the container runs it: no file was tried on the model, so the level is not shown.
    assert native.results, (
        f"expected files to load under {expect.app_prefix} as the container runs it (the baseline cpu_level holds "
        f"{level.name} to), found none: {native.tail or 'no output'}"
    )
    version = " ".join(image_host.run(f"{plan.qemu} -version").stdout.strip().splitlines()[:1]) or plan.qemu
    emulated = f" (the container runs {platform} emulated: the baseline is the binfmt handler's CPU)"
    report_warning(
        f"cpu_level: {len(model.results)} loads (files and top-level package imports) in one process under "
        f"{version} -cpu {level.model} ({level.name}), {len(model.killed)} restart(s)"
        + (emulated if expect.emulated else "")
    )
    problems = _unwaived(expect, "cpu_level", cpurun.findings(native, model, level), report_warning)
    assert not problems, (
        f"expected every file everything_loads loads under {expect.app_prefix} ({len(native.results)}) to load in one "
        f"process on the oldest CPU {platform} claims, {level.name} ({level.features}: QEMU -cpu {level.model}), "
        "found: " + _listing(problems)
    )
    assert model.complete, f"expected the run on {level.name} to finish, found it stopped: {model.tail}"
