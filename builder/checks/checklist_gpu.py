"""The GPU-code checks (``gpu_code``, ``gpu_coverage``): what the image's binaries carry, against
what the matrix's ``gpu`` block claims. Run by builder/checks/runner.py beside checklist.py, with
the same fixtures. Judged on the host's reading of the image's files (``image_files``: gpuread.py,
gpufound.py); the gpucode probe runs once in the image, headers only, for the run-time assemblers
(only the image's ptxas can say its version) and for its listing, which is held to the host's.
The rules are builder/checks/gpurules.py.

Both record what they proved (``record_fact``): the derived driver floor and the coverage table
go into the record (image.json ``gpu``) and the build summary.
"""

from __future__ import annotations

import pytest

from builder.checks import boundary, gpufound, gpurules
from builder.checks.checklist import _listing, run_probe
from builder.config.gpu import cell_runs


@pytest.fixture(scope="session")
def gpu_found(image_host, image, expect, image_files):
    """The GPU code the host read, with the assemblers the probe found and the probe's listing held
    to the host's reading (``mismatches``), gathered once for both checks."""
    if expect.gpu is None:
        pytest.skip("the target claims no GPU code (no `gpu` block in the matrix)")
    env = {k: image.env[k] for k in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH") if image.env.get(k)}
    ld_library_path = image.env.get("LD_LIBRARY_PATH", "")
    request = {
        "roots": [expect.app_prefix],
        "cuda_home": expect.cuda_home,
        "env": env,
        # the libraries the prefix's files NEED are read wherever they are, found as ld.so would
        "ld_library_path": ld_library_path,
    }
    probe = run_probe(image_host, "gpucode", request)
    assert "error" not in probe, f"expected the GPU-code probe to run, found {probe.get('error')}"
    found = gpufound.host_found(image_files, (expect.app_prefix,), ld_library_path)
    found["mismatches"] = gpufound.held_to_host(found, probe, image_files)
    found["assemblers"], found["selected"] = probe.get("assemblers", {}), probe.get("selected", [])
    return found


def _matrix_cuda(expect) -> gpurules.Version:
    return gpurules.version(expect.cuda_version)[:2]


def derived_floor(found: dict, expect) -> tuple[gpurules.Floor, str | None, bool]:
    """The floor, the driver it needs (None: newer than the table) and whether that is exact."""
    result = gpurules.floor(found, _matrix_cuda(expect), dict(expect.gpu.exceptions))
    driver, exact = gpurules.driver_for(result.cuda) if result.cuda > (0, 0) else (None, True)
    return result, driver, exact


def test_gpu_code(gpu_found, expect, image, report_warning, record_fact, image_files):
    gpu = expect.gpu
    result, driver, exact = derived_floor(gpu_found, expect)
    # The label equals the matrix's floor (the labels check); the binaries are held to the claim.
    claimed = image.labels.get(expect.label_keys.driver_floor) or gpu.driver_floor
    for line in result.waived:
        report_warning(f"gpu_code: {line}")
    for reason, n in sorted(result.unknown.items()):
        report_warning(f"gpu_code: {n} cubin(s) with toolkit unknown ({reason}): their major is not checked")
    record_fact(
        "gpu",
        {
            "driver_floor": gpu.driver_floor,
            "derived_floor": driver if result.cuda > (0, 0) else None,
            "derived_cuda": gpurules.show(result.cuda),
            "derived_from": result.because,
            "families": list(gpu.capabilities),
            "waived": result.waived,
            "toolkit_unknown": dict(result.unknown),
        },
    )
    problems = list(result.problems) + list(gpu_found["mismatches"])
    # GPU code the host could not read has no floor: never counted as none (that would pass it).
    problems += [f"{path}: GPU code unread on the host: {err}" for path, err in sorted(gpu_found["errors"].items())]
    # Held to the host's reading: a shared object that is not a loadable ELF carries no GPU code any
    # driver runs (a required extension with no file at all is gpu_coverage's: it covers no family).
    problems += [f"{path}: {why}" for path, why in boundary.static_unloadable(image_files, expect)]
    if result.cuda > (0, 0):
        bound = "" if exact else " (an upper bound: the table has no exact entry)"
        if driver is None:
            problems.append(f"the code needs CUDA {gpurules.show(result.cuda)}, newer than the driver table")
        elif gpurules.version(driver) > min(gpurules.version(claimed), gpurules.version(gpu.driver_floor)):
            problems.append(
                f"derived driver floor {driver}{bound} (CUDA {gpurules.show(result.cuda)}: {result.because}) "
                f"exceeds the claimed {claimed}"
            )
    files = len(gpu_found["files"])
    if not problems:  # said on every run, not only on failure: the value image.json records
        report_warning(
            f"gpu_code: derived driver floor {driver or 'none (no GPU code)'} (CUDA {gpurules.show(result.cuda)}: "
            f"{result.because}) <= claimed {claimed}"
        )
    assert not problems, (
        f"expected GPU code a driver >= {gpu.driver_floor} runs (CUDA {expect.cuda_major_minor}; {files} files "
        f"with GPU code of {gpu_found['scanned']} scanned), found: " + _listing(problems)
    )


def test_gpu_coverage(gpu_found, expect, report_warning, record_fact, image_files):
    gpu = expect.gpu
    jit = gpurules.cuda_of_driver(gpu.driver_floor)
    required = {ext: gpu.required_on(ext) for ext in gpu.required}
    table = gpurules.coverage(gpu_found, required, gpu.capabilities, jit)
    record_fact("gpu_coverage", {ext: table[ext] for ext in sorted(required)})
    problems = [f"{m}: {why}" for m, why in boundary.missing_modules(image_files, expect, tuple(required))]
    for ext in sorted(required):
        for cc, how in table[ext].items():
            if not cell_runs(how):
                problems.append(f"{ext} on {cc} ({gpu.families[cc]}): {how}")
    for ext in sorted(set(table) - set(required)):
        gaps = [cc for cc, how in table[ext].items() if not cell_runs(how)]
        if gaps:
            report_warning(f"gpu_coverage: {ext} (not required) has no code for {', '.join(gaps)}")
    assert not problems, (
        f"expected every required extension to load on every claimed family ({' '.join(gpu.capabilities)}; "
        f"PTX counted where a {gpu.driver_floor} driver JIT-compiles it), found: " + _listing(problems)
    )
