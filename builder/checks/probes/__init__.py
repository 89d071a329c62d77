"""Scripts the image checks run inside a container of the image, with the image's own python.

Each is a standalone file (standard library only: the image has nothing else the tool could
rely on), run isolated as ``python -I -S -c <text> <request as JSON>`` (``_isolated.py`` first:
the site directories put on sys.path without their .pth files), and prints its facts as the last line
that starts with ``MARKER``, so whatever an imported package prints on stdout cannot garble
them. Each gathers every fact under its own guard: a surprise fails only the check it belongs
to, with what was found. They are plain files so the unit tests can run them on this machine
against trees they make (tests/unit/test_probes.py).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

MARKER = "K3-PROBE "
HERE = Path(__file__).resolve().parent
NAMES = ("facts", "trees", "elf", "hygiene", "recipe", "os", "files", "gpucode")
# The whole-image probes (builder/checks/checklist_image.py), and the preludes a probe needs
# besides _report.py (_dyn.py: the ELF dynamic section; _fork.py: one thing run in a forked child;
# _cuda.py: the CUDA libraries in the image and what they report). Shared code lives there: a probe
# runs as one text and cannot import another.
IMAGE_NAMES = ("installed", "loads", "loaded", "starts", "privilege", "bytecode", "pagealign")
PRELUDES = {
    "facts": ("_cuda",),
    "hygiene": ("_dyn",),
    "loads": ("_dyn", "_fork"),
    "loaded": ("_cuda", "_dyn", "_fork"),
    "starts": ("_fork",),
    "gpucode": ("_dyn", "_fatbin"),
}


@cache
def script(name: str) -> str:
    """The text to run: the shared reporting prelude (_report.py), then the probe."""
    if name not in NAMES + IMAGE_NAMES:
        raise KeyError(name)
    parts = ("_isolated", "_report", *PRELUDES.get(name, ()), name)
    return "\n\n".join((HERE / f"{part}.py").read_text() for part in parts)


# How the checks start the image's interpreter: isolated, no site hooks (the text starts with _isolated.py).
PYTHON = "python -I -S"


@cache
def pip_script() -> str:
    """``pip check`` from the copy at ``sys.argv[1]``, isolated like the probes (PYTHONPATH is
    ignored under -I, so the copy's directory is given as an argument)."""
    run = (
        "import runpy\n_isys.path.insert(0, _isys.argv.pop(1))\n"
        "runpy.run_module('pip', run_name='__main__', alter_sys=True)\n"
    )
    return (HERE / "_isolated.py").read_text() + "\n\n" + run


def parse(stdout: str) -> dict | None:
    """The facts a probe printed, or None when it printed none (it crashed or never ran)."""
    lines = [ln[len(MARKER) :] for ln in stdout.splitlines() if ln.startswith(MARKER)]
    if not lines:
        return None
    try:
        doc = json.loads(lines[-1])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
