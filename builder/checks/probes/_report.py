# Prepended to every probe by builder.checks.probes.script(): how a probe takes its request and reports.
import json as _json
import sys as _sys
from collections.abc import Callable as _Callable

MARKER = "K3-PROBE "


def report(main: _Callable[[dict], dict]) -> None:
    """Run ``main(request)`` and print its facts as the last marked line. A probe that breaks
    still prints one: {"error": ...}, so the check says what broke instead of failing to parse."""
    try:
        facts = main(_json.loads(_sys.argv[1]))
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: a probe always reports
        facts = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    _sys.stdout.flush()
    print(MARKER + _json.dumps(facts))
