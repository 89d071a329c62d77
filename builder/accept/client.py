"""The HTTP side of `build accept`: an OpenAI-compatible server reached with the standard library
(no client package to install on an operator's host), every exchange kept for the evidence, the
API key sent as a bearer token and never written (the evidence is redacted when written)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from builder import log
from builder.errors import ConfigError

BODY_KEPT = 4000  # characters of a request or response body kept in the evidence
SILENT_POLL = 15.0  # seconds of a silent stream before /health is asked whether the server is there
HEALTH_TIMEOUT = 10.0


class EndpointDown(Exception):
    """The server did not answer at all (refused, reset, timed out): not an HTTP status."""


def base_url(url: str) -> str:
    """The endpoint without a trailing slash or /v1 (the paths add it); bad input is one line."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--endpoint {log.redact(url)!r}: give http(s)://HOST[:PORT][/PATH] of the server")
    if parts.username is not None or parts.password is not None:  # never echoed: it holds a password
        raise ConfigError("--endpoint: user:password@ in the URL is not sent; give the key with --api-key-env")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ConfigError(f"--endpoint {log.redact(url)!r}: the port is not a number") from None
    path = parts.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    seconds: float

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON (a proxy's HTML page, plain text)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class Streamed:
    """A streamed chat completion: what came, when (seconds from the request), and how it ended."""

    status: int
    ttft: float | None = None
    latency: float = 0.0
    text: str = ""
    chunks: int = 0
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    body: str = ""  # an error status's body (vLLM's error JSON), to tell what it refused


@dataclass
class Client:
    url: str
    api_key: str | None = None
    timeout: float = 300.0
    exchanges: list[dict[str, Any]] = field(default_factory=list)

    def _request(self, method: str, path: str, body: dict | None) -> urllib.request.Request:
        headers = {"Accept": "application/json, text/event-stream, text/plain"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        return urllib.request.Request(self.url + path, data=data, method=method, headers=headers)

    def _keep(self, method: str, path: str, body: dict | None, status: int, answer: str, seconds: float) -> None:
        sent = None if body is None else json.dumps(body)[:BODY_KEPT]
        self.exchanges.append(
            {
                "request": f"{method} {path}",
                "body": sent,
                "status": status,
                "response": answer[:BODY_KEPT],
                "seconds": round(seconds, 4),
            }
        )

    def call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> Reply:
        """One request; an HTTP error status is a Reply, no answer at all is EndpointDown."""
        start = time.monotonic()
        try:
            with urllib.request.urlopen(self._request(method, path, body), timeout=timeout or self.timeout) as resp:
                reply = Reply(resp.status, resp.read(), time.monotonic() - start)
        except urllib.error.HTTPError as exc:
            reply = Reply(exc.code, exc.read() or b"", time.monotonic() - start)
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            self._keep(method, path, body, 0, f"no answer: {why}", time.monotonic() - start)
            raise EndpointDown(f"{method} {self.url}{path}: no answer: {why}") from None
        self._keep(method, path, body, reply.status, reply.text, reply.seconds)
        return reply

    def get(self, path: str, timeout: float | None = None) -> Reply:
        return self.call("GET", path, None, timeout)

    def post(self, path: str, body: dict) -> Reply:
        return self.call("POST", path, body)

    def stream_chat(self, body: dict) -> Streamed:
        """A streaming chat completion (server-sent events), timed to its first content token."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        start = time.monotonic()
        try:
            resp = urllib.request.urlopen(self._request("POST", "/v1/chat/completions", body), timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            answer = (exc.read() or b"").decode("utf-8", "replace")
            self._keep("POST", "/v1/chat/completions", body, exc.code, answer, time.monotonic() - start)
            took = time.monotonic() - start
            return Streamed(exc.code, latency=took, error=f"HTTP {exc.code}: {answer[:200]}", body=answer)
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            raise EndpointDown(
                f"POST {self.url}/v1/chat/completions: no answer: {getattr(exc, 'reason', exc)}"
            ) from None
        out = Streamed(resp.status)
        watch = _Watch(self, resp)
        try:
            with resp, watch:
                _read_events(resp, out, start, watch)
        except (TimeoutError, OSError, ValueError) as exc:
            out.error = watch.gone or f"stream broken: {exc}"
        finally:  # kept even when an event of an unexpected shape stops the reading
            out.error = watch.gone or out.error
            out.latency = time.monotonic() - start
            self._keep("POST", "/v1/chat/completions", body, out.status, _stream_summary(out), out.latency)
        return out


class _Watch:
    """While a stream is silent, /health is asked every SILENT_POLL seconds; when nothing answers
    it (the engine died, the API server no longer listens, but keeps the stream open) the stream
    is cut, so a dead server costs SILENT_POLL seconds, not the whole --timeout."""

    def __init__(self, client: Client, resp) -> None:
        self.client, self.resp = client, resp
        self.last = time.monotonic()
        self.gone: str | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()

    def _run(self) -> None:
        while not self.done.wait(SILENT_POLL):
            if time.monotonic() - self.last < SILENT_POLL:
                continue
            why = _no_health(self.client.url)
            if why is not None and not self.done.is_set():
                self.gone = f"the server stopped answering while the stream was silent ({why})"
                _cut(self.resp)
                return


def _no_health(url: str) -> str | None:
    """Why GET /health got no answer, or None when it answered (any status: the server is there)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=HEALTH_TIMEOUT):
            return None
    except urllib.error.HTTPError:
        return None
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        return f"GET {url}/health: no answer: {getattr(exc, 'reason', exc)}"


def _cut(resp) -> None:
    """Ends the blocking read of ``resp`` from another thread: its socket is shut down."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _read_events(resp, out: Streamed, start: float, watch: _Watch | None = None) -> None:
    for raw in resp:
        if watch is not None:
            watch.last = time.monotonic()
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            out.error = f"not JSON in the stream: {data[:120]}"
            return
        if not isinstance(event, dict):
            continue
        if "error" in event:
            out.error = f"error in the stream: {json.dumps(event['error'])[:200]}"
            return
        out.chunks += 1
        out.usage = event.get("usage") or out.usage
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
            if (piece or delta.get("tool_calls")) and out.ttft is None:
                out.ttft = time.monotonic() - start
            out.text += delta.get("content") or ""
            out.finish_reason = choice.get("finish_reason") or out.finish_reason


def _stream_summary(out: Streamed) -> str:
    return json.dumps(
        {
            "streamed": True,
            "chunks": out.chunks,
            "ttft": out.ttft,
            "text": out.text[:BODY_KEPT],
            "usage": out.usage,
            "finish_reason": out.finish_reason,
            "error": out.error,
        }
    )
