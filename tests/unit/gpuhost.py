"""GPU code read as ``build test`` reads it: the files put in a tar as the engine exports an image
(absolute names), read on the host (imagefiles.py, gpuread.py, gpufound.py), and the gpucode
probe run on the same files, headers only, its listing held to the host's."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from builder.checks import gpufound, gpuread, imagefiles, probes


def export(*trees: Path) -> tempfile.SpooledTemporaryFile:
    """A tar stream of ``trees``, each file under its absolute path (as ``docker export`` names them)."""
    out = tempfile.TemporaryFile()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for tree in trees:
            tar.add(tree, arcname=str(tree).lstrip("/"))
    out.seek(0)
    return out  # type: ignore[return-value]


def probe(*roots: Path, cuda_home: str | None = None, env: dict | None = None, ld_library_path: str = "") -> dict:
    """The gpucode probe's answer (headers only, the assemblers), run by this machine's Python."""
    request = {"roots": [str(r) for r in roots], "cuda_home": cuda_home, "env": env or {}}
    request["ld_library_path"] = ld_library_path
    proc = subprocess.run(
        [sys.executable, "-c", probes.script("gpucode"), json.dumps(request)], capture_output=True, text=True
    )
    found = probes.parse(proc.stdout)
    assert found is not None and "error" not in found, (found, proc.stderr[-2000:])
    return found


def read(
    *roots: Path,
    tree: tuple[Path, ...] = (),
    ld_library_path: str = "",
    cuda_home: str | None = None,
    env: dict | None = None,
    codecs: gpuread.Codecs | None = None,
    major: int | None = 12,
) -> dict:
    """The facts gpu_code judges (checklist_gpu.gpu_found's), ``tree`` (default: the roots) exported."""
    judge = gpuread.Judge(codecs or gpuread.Codecs(), major)
    with export(*(tree or roots)) as stream:
        view = imagefiles.read(stream, tuple(str(r) for r in roots), judge)
    found = gpufound.host_found(view, tuple(str(r) for r in roots), ld_library_path)
    told = probe(*roots, cuda_home=cuda_home, env=env, ld_library_path=ld_library_path)
    found["mismatches"] = gpufound.held_to_host(found, told, view)
    found["assemblers"], found["selected"] = told["assemblers"], told["selected"]
    found["probe"] = told
    return found
