"""The image as its runtime reads it (issue 51): the NVIDIA container runtime's view of the config,
the interpreter options of the Env, the start-up hooks, the runtime user, file capabilities and
owners of the system directories, and whiteouts that remove base files. Same fixtures as
builder/checks/checklist.py; every answer is read on the host (boundary.Basis.HOST): from the image
config, the exported file system (``image_files``), the saved layers (``image_layers``) or the
pinned runtime base's layers as its registry or the engine lists them (``pinned_base``). A
finding fails unless ``runtime.waivers`` names its path for the check (a variable of the config:
``/config/Env/NAME``), shown as a warning with its reason.
"""

from __future__ import annotations

from builder.checks import gpurules, imageowners, runtimeview, startup
from builder.checks.checklist import _listing
from builder.checks.checklist_image import _unwaived


def _floor(expect) -> runtimeview.Driver:
    """The target's driver floor (gpu.driver_floor, else the oldest driver of its CUDA) and the CUDA
    version that driver reports (the newest of gpurules' table it runs)."""
    floor = expect.gpu.driver_floor if expect.gpu else gpurules.driver_for(gpurules.version(expect.cuda_major_minor))[0]
    floor = floor or "0"
    return runtimeview.Driver(floor, gpurules.cuda_of_driver(floor))


def test_container_runtime(image, expect, report_warning, image_files):
    floor = _floor(expect)
    env = image.env
    for var in sorted(v for v in env if v.startswith("NVIDIA_")):
        report_warning(f"container_runtime: the image config sets {var}={env[var]}")
    findings = runtimeview.requirement_findings(env, floor)
    findings += runtimeview.capability_findings(env)
    findings += runtimeview.visible_devices_findings(env)
    findings += runtimeview.library_path_findings(env, image_files, expect.cuda_major_minor, expect.compat_dir)
    problems = _unwaived(expect, "container_runtime", findings, report_warning)
    assert not problems, (
        f"expected the container runtime to accept the image on the driver floor {floor.version} and newer "
        "(NVIDIA_REQUIRE_*), to grant compute and utility, to see GPUs, and LD_LIBRARY_PATH to put neither "
        f"the compat directory nor another CUDA's libraries first, found: " + _listing(problems)
    )


def test_interpreter_options(image, expect, report_warning, image_files):
    findings, shown = runtimeview.interpreter_findings(image.env, image_files)
    for line in shown:
        report_warning(f"interpreter_options: {line}")
    problems = _unwaived(expect, "interpreter_options", findings, report_warning)
    assert not problems, (
        "expected no interpreter option or preload in the config's Env or /etc/ld.so.preload that changes "
        "what runs, found: " + _listing(problems)
    )


def test_startup_hooks(image, expect, report_warning, image_files, image_layers, pinned_base):
    found = startup.hooks(image_files, image.env.get("PYTHONPATH", ""))
    known = startup.dpkg_md5(image_files)
    findings, base_hooks = [], []
    for hook in found:
        judged_all = startup.judge(image_files, image_layers, pinned_base, hook, known)
        if judged_all[0].passed:  # the hook itself passed: an OS package's, the base's
            base_hooks.append(hook)
        for judged in judged_all:
            if judged.passed:
                report_warning(f"startup_hooks: {judged.why}")
            else:
                findings.append((judged.path, judged.why))
    if base_hooks:  # what the base's hooks can import before the program, where no RECORD holds it
        pythonpath = image.env.get("PYTHONPATH", "")
        imports = startup.hook_imports(image_files, base_hooks)
        imported = startup.imported_at_start(image_files, image_layers, pinned_base, pythonpath, imports)
        findings += [(j.path, j.why) for j in imported]
    assert len(image_files.texts) < startup.imagefiles.MAX_HOOK_TEXTS, (
        f"expected to read every .pth file of the image, found more than {startup.imagefiles.MAX_HOOK_TEXTS} texts"
    )
    problems = _unwaived(expect, "startup_hooks", findings, report_warning)
    assert not problems, (
        f"expected no start-up hook (.pth line starting with import, sitecustomize, usercustomize) the matrix "
        f"does not name ({len(found)} found), found: " + _listing(problems)
    )


def test_runtime_user(image, expect, report_warning, image_files):
    findings, notes = imageowners.user_findings(image_files, image.user, image.env)
    for note in notes:
        report_warning(f"runtime_user: {note}")
    problems = _unwaived(expect, "runtime_user", findings, report_warning)
    assert not problems, (
        f"expected the config's User {image.user or '(unset: root)'} to resolve in the image's /etc/passwd "
        "and /etc/group (or, numeric, with USER/LOGNAME and HOME in the Env), its home and /tmp writable by it, "
        "found: " + _listing(problems)
    )


def test_system_files(expect, report_warning, image_files, image_layers):
    findings = imageowners.capability_findings(image_files)
    seen = {p for p, _ in findings}
    findings += [
        (p, f"carries a file capability (security.capability, layer {d[:19]})")
        for p, d in sorted(image_layers.capabilities().items())
        if p not in seen
    ]
    findings += imageowners.ownership_findings(image_files)
    problems = _unwaived(expect, "system_files", findings, report_warning)
    assert not problems, (
        "expected no file capability anywhere and the system directories (and what the binary directories "
        "hold) owned by root, found: " + _listing(problems)
    )


def test_base_whiteouts(expect, report_warning, image_layers):
    removed = image_layers.removed_base_files()
    findings = []
    for path, layer, package in removed:
        if package:
            findings.append((path, f"a file of the OS package {package}, removed by layer {layer[:19]}'s whiteout"))
        else:
            report_warning(f"base_whiteouts: {path}: removed by layer {layer[:19]}'s whiteout")
    problems = _unwaived(expect, "base_whiteouts", findings, report_warning)
    assert not problems, (
        f"expected no whiteout to remove a file of the base's OS packages ({len(removed)} lower-layer paths "
        "removed in all), found: " + _listing(problems)
    )
