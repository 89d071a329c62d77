# Prepended first to every probe and to pip check by builder.checks.probes: they run as
# ``python -I -S`` (the checks' trust boundary, docs/guarantees.md#the-trust-boundary-of-vet-and-test),
# so no .pth file, sitecustomize, usercustomize or PYTHON* variable of the image ran before this line.
# The interpreter's site directories are put on sys.path here, explicitly, without reading their
# .pth files: the modules a check imports are found where an installer put them, and nothing the
# image planted runs before the check does.
import sys as _isys


def _isolated_paths() -> None:
    if not _isys.flags.no_site:
        return  # run as a plain script (the unit tests run the probes on this machine that way)
    import os as _ios

    prefix = _venv_prefix(_ios.path.dirname(_ios.path.abspath(_isys.executable)))
    if prefix and prefix != _isys.prefix:  # site.py reads pyvenv.cfg, which -S skips
        _isys.prefix = _isys.exec_prefix = prefix  # before sysconfig is imported: it reads them then
    import site as _isite
    import sysconfig as _isysconfig

    paths = _isysconfig.get_paths(vars={"base": _isys.prefix, "platbase": _isys.prefix})
    for entry in (*_isite.getsitepackages([_isys.prefix]), paths.get("purelib"), paths.get("platlib")):
        if entry and _ios.path.isdir(entry) and entry not in _isys.path:
            _isys.path.append(entry)


def _venv_prefix(bindir):
    import os as _ios

    for where in (bindir, _ios.path.dirname(bindir)):
        if _ios.path.isfile(_ios.path.join(where, "pyvenv.cfg")):
            return where
    return None


_isolated_paths()
