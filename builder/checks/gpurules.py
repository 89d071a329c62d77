"""The rules the GPU-code checks apply to what the gpucode probe found: which CUDA a PTX ISA needs,
which driver a CUDA version needs, where a code object loads, and the driver floor of an image.

Pure functions over the probe's facts (builder/checks/probes/gpucode.py), so the unit tests run
them on real binaries and the checklist (checklist_gpu.py) only words the outcome.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from builder.config.gpu import PTX, PTX_ISA_CUDA, SASS, CoverageCell, GpuArch, Served, Version, isa_cuda

# The one rule of where code runs, and the PTX ISA table, live with the GPU claims
# (builder/config/gpu.py): doctor judges a host with the same rule.
__all__ = ["PTX_ISA_CUDA", "Version", "isa_cuda"]

# CUDA release -> the oldest Linux x86_64 driver it needs. Sources: the CUDA Toolkit release notes,
# table "CUDA Toolkit and Corresponding Driver Versions" (12.9 GA >= 575.51.03, 13.0 GA >=
# 580.65.06), and NVIDIA's "CUDA Compatibility" guide for 12.0 (minor-version compatibility: any
# 12.x cubin runs on >= 525.60.13). Only these values are sourced here; a CUDA version between two
# entries takes the next entry up (an upper bound, said so in the check's output).
CUDA_DRIVER: dict[Version, str] = {
    (12, 0): "525.60.13",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}


def version(text: str) -> Version:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def show(v: Version) -> str:
    return ".".join(map(str, v))


def driver_for(cuda: Version) -> tuple[str | None, bool]:
    """(oldest driver for ``cuda``, exact?): exact when the table has the version, else the next one
    up (an upper bound); None when ``cuda`` is newer than the table."""
    for known in sorted(CUDA_DRIVER):
        if known >= cuda[:2]:
            return CUDA_DRIVER[known], known == cuda[:2]
    return None, False


def cuda_of_driver(driver: str) -> Version:
    """The newest CUDA of the table a driver runs (PTX it can JIT): the inverse of driver_for."""
    fits = [cuda for cuda, floor in CUDA_DRIVER.items() if version(floor) <= version(driver)]
    return max(fits) if fits else (0, 0)


def cc_of(sm: int) -> Version:
    """sm_103 -> (10, 3), sm_90 -> (9, 0)."""
    return (sm // 10, sm % 10)


def code_of(obj: dict) -> GpuArch:
    """A probe code object as a value (builder/config/gpu.py ``GpuArch``)."""
    return GpuArch(
        obj["kind"], cc_of(obj["sm"]), obj.get("variant", ""), obj.get("isa") if obj["kind"] == PTX else None
    )


def loads_on(obj: dict, cc: Version, jit_cuda: Version) -> bool:
    """Does ``obj`` (a probe code object) run on a GPU of compute capability ``cc``, PTX only where a
    driver running ``jit_cuda`` knows its ISA? The rule is ``GpuArch.runs_on``."""
    code = code_of(obj)
    if code.kind == PTX and code.isa is None:
        return False
    return code.runs_on(cc, jit_cuda)


def module_of(path: str) -> str | None:
    """The dotted module an extension file is imported as (site-packages/vllm/_C.abi3.so ->
    vllm._C); None outside a site-packages or dist-packages directory."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            rel = path.rsplit(marker, 1)[1]
            parts = rel.split("/")
            parts[-1] = parts[-1].split(".", 1)[0]
            return ".".join(parts)
    return None


@dataclass
class Floor:
    """What raises the driver an image needs, and what breaks the matrix's CUDA."""

    cuda: Version = (0, 0)  # the newest CUDA the code needs (JIT of its PTX, major of its cubins)
    because: str = "no GPU code"
    problems: list[str] = field(default_factory=list)
    waived: list[str] = field(default_factory=list)
    unknown: dict[str, int] = field(default_factory=dict)  # why a cubin's toolkit is unknown -> count

    def raise_to(self, cuda: Version, because: str) -> None:
        if cuda > self.cuda:
            self.cuda, self.because = cuda, because


def _waiver(path: str, exceptions: dict[str, str]) -> str | None:
    return next((why for pat, why in exceptions.items() if fnmatch.fnmatchcase(path, pat)), None)


def floor(found: dict, matrix_cuda: Version, exceptions: dict[str, str]) -> Floor:
    """The driver floor of the probe's ``found`` and what breaks a ``matrix_cuda`` build: PTX of a
    newer ISA, a cubin of another CUDA major, a run-time assembler newer than the matrix's CUDA.

    A cubin needs a driver of its toolkit's major (minor-version compatibility), PTX the CUDA that
    introduced its ISA, an assembler's output the driver of its major; ``exceptions`` (fnmatch over
    paths -> reason) leave files out of both, listed in ``waived``."""
    out = Floor()
    major = matrix_cuda[0]
    for path, entry in sorted(found.get("files", {}).items()):
        why = _waiver(path, exceptions)
        for obj in entry["objects"]:
            problem = _object(out, path, obj, matrix_cuda, major)
            if problem and why:
                out.waived.append(f"{path}: {problem} (waived: {why})")
            elif problem:
                out.problems.append(f"{path}: {problem}")
    for sel in found.get("selected", []):
        tool = found.get("assemblers", {}).get(sel["path"], {})
        if not tool.get("version"):
            out.problems.append(f"{sel['path']} ({sel['compiler']}, {sel['archs']}): no version: {tool.get('error')}")
            continue
        v = version(tool["version"])
        why = _waiver(sel["path"], exceptions)
        if v[:2] > matrix_cuda[:2]:
            how = f"{sel['variable']}={sel['path']}" if sel["set"] else f"{sel['variable']} unset: the bundled one"
            problem = (
                f"{sel['path']} is ptxas/nvcc {tool['version']}, newer than CUDA {show(matrix_cuda)}, and "
                f"{sel['compiler']} runs it for arch {sel['archs']} ({how})"
            )
            (out.waived if why else out.problems).append(problem + (f" (waived: {why})" if why else ""))
        if not why:
            out.raise_to((v[0], 0), f"run-time assembler {sel['path']} ({tool['version']})")
    return out


def _object(out: Floor, path: str, obj: dict, matrix_cuda: Version, major: int) -> str | None:
    """Fold one code object into ``out``; the problem it is, if any (before waivers)."""
    n = obj.get("count", 1)
    what = f"{obj['kind']} {obj['arch']}" + (f" x{n}" if n > 1 else "")
    if obj.get("unread"):  # compressed and not decoded, or its bytes contradict its header: never fine
        return f"{what} unread: {obj['unread']}"
    if obj["kind"] == "PTX":
        needs = isa_cuda(obj.get("isa", ""))
        if needs is None or needs > matrix_cuda[:2]:
            cuda = f"CUDA {show(needs)}" if needs else "newer than every CUDA the table knows"
            return f"{what} of PTX ISA {obj.get('isa')} ({cuda}), newer than CUDA {show(matrix_cuda)}"
        out.raise_to(needs, f"PTX ISA {obj['isa']} ({what}) in {path}")
        return None
    if obj["kind"] != "SASS":
        return None  # LTO-IR and other entry kinds: listed by the probe, not judged
    toolkit = obj.get("toolkit")
    if not toolkit:
        reason = obj.get("toolkit_from") or "no note"
        out.unknown[reason] = out.unknown.get(reason, 0) + n
        return None
    tk_major = int(toolkit.split(".")[0].rstrip("+"))
    if tk_major != major:
        return f"{what} built by CUDA {toolkit} ({obj.get('toolkit_from')}), not CUDA {major}"
    out.raise_to((tk_major, 0), f"cubins of CUDA {toolkit}")
    return None


def coverage(
    found: dict, required: dict[str, tuple[str, ...]], families: tuple[str, ...], jit_cuda: Version
) -> dict[str, dict[str, str]]:
    """extension -> {cc -> how it is served}: "SASS sm_90a", "PTX JIT compute_80 (ISA 8.8)", or
    "none (has ...)" naming what the extension carries. ``required``: extension -> the ccs it must
    cover; every other extension with GPU code is listed against all claimed ``families``."""
    by_module: dict[str, list[dict]] = {}
    for path, entry in found.get("files", {}).items():
        module = module_of(path)
        if module:
            by_module.setdefault(module, []).extend(entry["objects"])
    table: dict[str, dict[str, str]] = {}
    for module in sorted(set(by_module) | set(required)):
        objs = by_module.get(module, [])
        row = {}
        for cc in required.get(module) or families:
            row[cc] = _served(objs, version(cc), jit_cuda)
        table[module] = row
    return table


def _served(objs: list[dict], cc: Version, jit_cuda: Version) -> str:
    """The cell for ``cc`` in the form the record stores (``CoverageCell.show``)."""
    code = [code_of(o) for o in objs]
    sass = [c for c, o in zip(code, objs, strict=True) if c.kind == SASS and loads_on(o, cc, jit_cuda)]
    if sass:
        return CoverageCell(Served.SASS, tuple(sass)).show()
    ptx = [c for c, o in zip(code, objs, strict=True) if c.kind == PTX and loads_on(o, cc, jit_cuda)]
    if ptx:
        return CoverageCell(Served.PTX, tuple(ptx)).show()
    return CoverageCell(Served.NONE, tuple(code)).show()
