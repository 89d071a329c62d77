"""Command line: ``build [--matrix M] [--target T] [COMMAND] ...``. Parses with the parser the
command modules make (builder/commands/), dispatches to the command, and turns what it raises into
one line on stderr and an exit code (builder/errors.py). Only ``main()`` exits."""

from __future__ import annotations

import os
import signal
import sys

from builder import log
from builder.commands._common import Output
from builder.commands.parser import COMMANDS, DEFAULT, build_parser
from builder.errors import BuilderError, Interrupted, host_resources

_parser = build_parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command or DEFAULT
    if args.command is None and not args.target:
        parser.print_help(sys.stderr)
        sys.exit(2)
    # SIGTERM (a CI runner cancelling the job) takes the same path as Ctrl-C: the build's child is
    # stopped, the log says so, and no record is written. SIGINT is set too: a shell without job
    # control starts `build ... &` with SIGINT ignored, and Python keeps an inherited ignore, so
    # a deliberate `kill -INT` would otherwise be lost and the build would run on.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Output(args.json)
    try:
        code = COMMANDS[command](args, out)
    except BuilderError as exc:
        # One line, always: control characters from hostile input are shown escaped.
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in log.redact(exc.message))
        log.info(f"error: {message}")
        out.finish(exc.exit_code, exc)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `build plan | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except (OSError, MemoryError, RuntimeError) as exc:
        # Resource exhaustion wherever it strikes (a full or read-only disk, a memory limit):
        # its own exit code and one line, never a traceback nor "bad input".
        resources = host_resources(exc)
        if resources is None:
            raise
        log.info(f"error: {log.redact(resources.message)}")
        out.finish(resources.exit_code, resources)
        sys.exit(resources.exit_code)
    except KeyboardInterrupt:
        log.info("error: interrupted; records untouched")
        out.finish(130, Interrupted("interrupted; records untouched"))
        sys.exit(130)
    out.finish(code)
    sys.exit(code)


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt
