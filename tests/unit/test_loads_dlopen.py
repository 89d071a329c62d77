"""dlopen targets (issue 51): the loads probe reports every file the imports map and the libraries no
NEEDED entry names; the check holds the mapped files to the image's files as the host reads them."""

from __future__ import annotations

import subprocess
import sysconfig

from builder.checks import boundary, imagefiles
from tests.unit.test_checks_image import _ext_suffix, _loads
from tests.unit.test_probes import compile_so


def test_what_imports_dlopen_is_reported_and_code_made_at_run_time_is_not_in_the_image(tmp_path):
    """issue 51: dlopen targets found by what the import maps; one written at run time (to /tmp, a
    cache) is in no layer, so the host's reading of the image never holds it."""
    site, made = tmp_path / "site", tmp_path / "runtime"
    (site / "pkg").mkdir(parents=True)
    made.mkdir()
    plug = compile_so(site / "pkg/libplug.so")
    payload = compile_so(tmp_path / "libpayload.so")
    (site / "pkg/__init__.py").write_text(
        "import ctypes, shutil\n"
        f"ctypes.CDLL({str(plug)!r})\n"  # a library of the image, loaded by name: a dlopen target
        f"shutil.copy({str(payload)!r}, {str(made / 'libmade.so')!r})\n"
        f"ctypes.CDLL({str(made / 'libmade.so')!r})\n"  # code written at import, then loaded
    )
    src = tmp_path / "m.c"
    src.write_text(
        '#include <Python.h>\nstatic struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "_m", 0, -1, 0};\n'
        "PyMODINIT_FUNC PyInit__m(void) { return PyModule_Create(&d); }\n"
    )
    ext = site / "pkg" / f"_m{_ext_suffix()}"
    include = sysconfig.get_paths()["include"]
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{include}", "-o", str(ext), str(src)], check=True)
    found = _loads(site, {"PYTHONPATH": str(site)})
    assert found["failed"] == [], found
    assert {str(plug), str(made / "libmade.so")} <= set(found["mapped"])
    assert str(plug) in found["dlopened"] and str(made / "libmade.so") in found["dlopened"]
    assert str(ext) not in found["dlopened"]  # Python dlopens extension modules: not a finding
    # the host's reading: everything but what the import wrote
    files = imagefiles.ImageFiles()
    for path in found["mapped"]:
        if not path.startswith(str(made)):
            files.entries[path] = imagefiles.Entry(path, "file", 0o755, 0, 0, 1)
    elsewhere = boundary.mapped_elsewhere(files, found["mapped"])
    assert [p for p, _ in elsewhere] == [str(made / "libmade.so")]
    assert "not a file of the image (read on the host)" in elsewhere[0][1]
    assert boundary.mapped_elsewhere(files, ["/memfd:k3 (deleted)", "/dev/zero"]) == [
        ("/memfd:k3 (deleted)", "mapped at import from a deleted file or from memory: in no layer of the image")
    ]
