"""Probe: would the image's own CLI accept the recipe's launch command?

Builds the CLI's argument parser the way its entry point does (``parser`` called with a fresh
``parser_class()``), parses the command's words after the program and its subcommand, runs the
CLI's own validation, and looks each named option's value up in the registry the CLI would
resolve it through; then resolves the model architecture through the model registry. Nothing
starts: no engine, no server, no GPU. Request: {"argv": [...], "parser": ..., "parser_class":
..., "validator": ..., "resolve": {dest: ref}, "architecture": ..., "architecture_resolver": ...}.
"""

import contextlib
import importlib
import io
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time builder/checks/probes/_report.py is prepended: report() is defined
    from builder.checks.probes._report import report


def ref(text):
    module, _, attr = text.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def error(exc):
    return f"{type(exc).__name__}: {exc}"[:400]


def resolve(registry, value):
    """None when ``value`` is known to ``registry`` (a mapping holds it, a callable returns
    something for it), else why not."""
    if value is None:
        return "the option is not set"
    try:
        if isinstance(registry, Mapping):
            return None if value in registry else f"not one of {sorted(map(str, registry))[:40]}"
        return None if registry(value) is not None else "the registry returned nothing"
    except BaseException as exc:  # noqa: BLE001 - KeyError, ValueError, SystemExit: all "unknown"
        return error(exc)


@contextlib.contextmanager
def logged(stream):
    """Copy every log record, from any logger that has handlers of its own, into ``stream``."""
    handler = logging.StreamHandler(stream)
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger) and lg.handlers
    ]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def parse(req):
    parser = ref(req["parser"])(ref(req["parser_class"])())
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(req["argv"])
    except SystemExit as exc:  # argparse's way of refusing a flag or a choice
        lines = [ln for ln in stderr.getvalue().splitlines() if ln.strip()]
        last = lines[-1].removeprefix(f"{parser.prog}: ") if lines else f"the parser exited {exc.code}"
        raise ValueError(last) from None
    return namespace


def main(req):
    out: dict[str, Any] = {"parse": None, "validate": None, "options": {}, "architecture": None}
    try:
        namespace = parse(req)
    except BaseException as exc:  # noqa: BLE001
        out["parse"] = error(exc)
        return out
    if req.get("validator"):
        try:
            ref(req["validator"])(namespace)
        except BaseException as exc:  # noqa: BLE001
            out["validate"] = error(exc)
    for dest, registry_ref in sorted(req["resolve"].items()):
        if not hasattr(namespace, dest):
            out["options"][dest] = "the parser has no such option"
            continue
        try:
            registry = ref(registry_ref)
        except BaseException as exc:  # noqa: BLE001
            out["options"][dest] = f"registry {registry_ref}: {error(exc)}"
            continue
        value = getattr(namespace, dest)
        found = resolve(registry, value)
        out["options"][dest] = None if found is None else f"{value!r}: {found}"
    if req.get("architecture"):
        said = io.StringIO()  # a registry that swallows the error (vLLM's logs it) still says why
        try:
            with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said), logged(said):
                found = resolve(ref(req["architecture_resolver"]), req["architecture"])
        except BaseException as exc:  # noqa: BLE001
            found = f"registry {req['architecture_resolver']}: {error(exc)}"
        lines = [ln.strip() for ln in said.getvalue().splitlines() if ln.strip()]
        if found and lines:
            found += f" (it said: {lines[-1][:300]})"
        out["architecture"] = found
    return out


if __name__ == "__main__":
    report(main)
