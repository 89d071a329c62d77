# Prepended (after _report.py) to the probes that try one thing at a time in a forked child
# (probes.PRELUDES): a crash, a hang or what an import maps and registers stays in the child, and its
# one result comes back as JSON over a pipe.
import json as _fjson
import os as _fos
import signal as _fsignal


def fork_call(fn, *args, quiet=False, timeout=0, cut=300):
    """Fork a child that runs ``fn(*args)``, writes its result (an exception as "Type: text"; a string
    cut to ``cut`` characters) as JSON and exits; returns (pid, read end). ``quiet``: the child's
    stdout and stderr go to /dev/null, so nothing it prints lands before the probe's report;
    ``timeout``: SIGALRM ends the child after that many seconds."""
    r, w = _fos.pipe()
    pid = _fos.fork()
    if pid == 0:
        try:  # whatever happens, the child never returns into the probe's own code
            _fos.close(r)
            if quiet:
                devnull = _fos.open(_fos.devnull, _fos.O_WRONLY)
                _fos.dup2(devnull, 1)
                _fos.dup2(devnull, 2)
            if timeout:
                _fsignal.alarm(timeout)
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - whatever the child raises is its result
                result = f"{type(exc).__name__}: {exc}"
            _fos.write(w, _fjson.dumps(result[:cut] if isinstance(result, str) else result).encode())
        finally:
            _fos._exit(0)
    _fos.close(w)
    return pid, r


def child_result(fd, died):
    """The result a child wrote on ``fd`` (closed here), or ``died`` when it wrote none."""
    data = b"".join(iter(lambda: _fos.read(fd, 65536), b""))
    _fos.close(fd)
    return _fjson.loads(data) if data else died


def in_child(fn, *args, quiet=False):
    """``fn(*args)`` run in a forked child and waited for: its result, or "the process died"."""
    pid, fd = fork_call(fn, *args, quiet=quiet)
    result = child_result(fd, "the process died")
    _fos.waitpid(pid, 0)
    return result
