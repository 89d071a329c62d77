"""Transient registry failures are tried again (issue 55): 5xx, 429 with its Retry-After, a reset
connection, a timeout, a reply cut short, a connection refused once the registry has answered;
idempotent requests only (an upload session is restarted from its POST); a 4xx other than 429
never; each retry one log line; no more retries once the budget is spent.

The rule and the budget on a fake clock; the behaviour against a real HTTP server on 127.0.0.1
(``Host`` from test_registry_redirects) that fails as told, then answers."""

from __future__ import annotations

import hashlib
import http.client
import socket
import ssl
import threading
import time
import urllib.error
from http.server import BaseHTTPRequestHandler

import pytest

from builder.engine import transport
from builder.engine.registry import Registry, RegistryClient
from builder.engine.transport import Fault, RegistryError, Retrier, transient
from builder.errors import ConfigError, RegistryUnavailable
from tests.unit.test_registry_redirects import Host, Reply

MANIFEST = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}'
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    """Short waits, and the retry lines collected rather than printed."""
    monkeypatch.setattr(transport, "BASE_DELAY", 0.01)
    monkeypatch.setattr(transport, "MAX_DELAY", 0.05)
    lines: list[str] = []
    monkeypatch.setattr(transport.log, "warn", lines.append)
    return lines


# -- the rule -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 599])
def test_429_and_5xx_are_transient(status):
    assert transient(RegistryError("x", status), answered=True)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 413, 416, 501, 505])
def test_other_statuses_are_final(status):
    assert not transient(RegistryError("x", status), answered=True)


@pytest.mark.parametrize(
    "fault, answered, expected",
    [
        (Fault.RESET, False, True),
        (Fault.TIMEOUT, False, True),
        (Fault.CUT, False, True),
        (Fault.REFUSED, False, False),  # down from the start: said at once
        (Fault.REFUSED, True, True),  # gone mid-run: it may be restarting
        (Fault.OTHER, True, False),  # a digest mismatch, a name that does not resolve
    ],
)
def test_faults_below_http(fault, answered, expected):
    assert transient(RegistryError("x", fault=fault), answered) is expected


@pytest.mark.parametrize(
    "exc, fault",
    [
        (ConnectionRefusedError(), Fault.REFUSED),
        (ConnectionResetError(), Fault.RESET),
        (http.client.RemoteDisconnected("closed"), Fault.RESET),
        (TimeoutError(), Fault.TIMEOUT),
        (http.client.IncompleteRead(b"x", 10), Fault.CUT),
        (http.client.BadStatusLine("garbage"), Fault.CUT),
        (urllib.error.URLError(ConnectionRefusedError()), Fault.REFUSED),
        (urllib.error.URLError(TimeoutError()), Fault.TIMEOUT),
        (urllib.error.URLError(socket.gaierror(-2, "Name or service not known")), Fault.OTHER),
        (urllib.error.URLError(ssl.SSLEOFError(8, "EOF occurred in violation of protocol")), Fault.RESET),
        (ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed"), Fault.RESET),
        (urllib.error.URLError(ssl.SSLCertVerificationError(1, "certificate verify failed")), Fault.OTHER),
        (http.client.InvalidURL("URL can't contain control characters"), Fault.OTHER),
    ],
)
def test_faults_are_told_by_type(exc, fault):
    assert transport.fault_of(exc) is fault


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("3", 3.0),
        ("0", 0.0),
        (" 12 ", 12.0),
        ("soon", None),
        ("", None),
        ("²", None),
        ("١", None),
        ("-5", None),
        ("1.5", None),
        ("9" * 400, 86400.0),
    ],
)
def test_retry_after_in_seconds(value, seconds):
    assert transport.retry_after(value) == seconds


def test_retry_after_as_an_http_date():
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= transport.retry_after(when) <= 30
    assert transport.retry_after("Mon, 01 Jan 2001 00:00:00 GMT") == 0.0  # in the past: now


class Clock:
    """A fake clock: ``sleep`` moves it, each attempt costs ``cost`` seconds."""

    def __init__(self, cost: float = 0.0) -> None:
        self.now, self.cost, self.waits = 1000.0, cost, []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def attempt(self, err: RegistryError):
        def fail():
            self.now += self.cost
            raise err

        return fail


@pytest.mark.parametrize("cost", [0.0, 2.5])
def test_a_persistent_fault_is_given_up_within_the_budget(cost):
    clock = Clock(cost)
    retrier = Retrier(60.0, clock.sleep, lambda: clock.now, lambda: 1.0)
    with pytest.raises(
        RegistryError, match=r"HTTP 503 .*still failing after \d+ retries .*K3_REGISTRY_RETRY_SECONDS=60"
    ):
        retrier.run("GET", clock.attempt(RegistryError("GET r.example/v2/: HTTP 503 busy", 503)))
    assert clock.now - 1000.0 <= 60.0 + cost  # the budget, then the last attempt's own time
    assert clock.waits[:4] == [0.01, 0.02, 0.04, 0.05] and max(clock.waits) == 0.05  # doubling, capped
    # The budget is the host's: the next request gets what is left of it, and then none at all.
    for _ in range(2):
        with pytest.raises(RegistryError, match="still failing"):
            retrier.run("GET", clock.attempt(RegistryError("HTTP 503", 503)))
    assert sum(clock.waits) <= 60.0 and clock.now - 1000.0 <= 60.0 + 3 * cost
    assert retrier.run("GET", lambda: "ok") == "ok" and retrier.failing_since is None


def test_jitter_spreads_the_waits_below_the_doubling():
    clock = Clock()
    retrier = Retrier(1.0, clock.sleep, lambda: clock.now, lambda: 0.0)
    with pytest.raises(RegistryError):
        retrier.run("GET", clock.attempt(RegistryError("HTTP 500", 500)))
    assert clock.waits[:3] == [0.005, 0.01, 0.02]  # half of the doubling at the least


@pytest.mark.parametrize("after", [0.0, None])
def test_a_retry_after_of_0_waits_the_backoff_and_the_retries_are_capped(after):
    """Retry-After: 0 (or a past date) is no licence to hammer: the backoff still applies, and a
    stretch of failures ends after MAX_RETRIES retries even with budget left."""
    clock = Clock()
    retrier = Retrier(3600.0, clock.sleep, lambda: clock.now, lambda: 1.0)
    with pytest.raises(RegistryError, match=rf"after {transport.MAX_RETRIES} retries"):
        retrier.run("GET", clock.attempt(RegistryError("HTTP 503", 503, retry_after=after)))
    assert len(clock.waits) == transport.MAX_RETRIES and min(clock.waits) >= 0.01


def test_the_final_line_counts_the_retries_of_earlier_requests():
    clock = Clock()
    retrier = Retrier(1.0, clock.sleep, lambda: clock.now, lambda: 1.0)
    with pytest.raises(RegistryError):
        retrier.run("GET", clock.attempt(RegistryError("HTTP 500", 500)))
    spent = retrier.retries
    with pytest.raises(RegistryError, match=rf"still failing after {spent} retries of requests to this registry"):
        retrier.run("GET", clock.attempt(RegistryError("HTTP 500", 500)))
    assert spent > 0


def test_retry_after_is_honoured_and_one_past_the_budget_ends_it_at_once():
    clock = Clock()
    retrier = Retrier(60.0, clock.sleep, lambda: clock.now)
    answers = iter([RegistryError("HTTP 429", 429, retry_after=7.0), RegistryError("HTTP 429", 429, retry_after=90.0)])

    def attempt():
        raise next(answers)

    with pytest.raises(RegistryError, match="HTTP 429 .*after 1 retries"):
        retrier.run("GET", attempt)
    assert clock.waits == [7.0]


@pytest.mark.parametrize("value", ["-1", "soon", "3601", "nan"])
def test_a_bad_budget_is_bad_input_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("K3_REGISTRY_RETRY_SECONDS", value)
    with pytest.raises(ConfigError, match=r"^\$K3_REGISTRY_RETRY_SECONDS: "):
        Registry("127.0.0.1:9")


# -- against a real server --------------------------------------------------------------------------


class Flaky:
    """A registry stand-in: each request (by method and path, the upload session left out) fails
    with the next of ``faults[method]`` ("500", "429", "reset", "cut", "slow") until they run out,
    then answers: HEAD ``head``, POST a new upload session, PUT 201, GET ``final``."""

    def __init__(self, faults: dict[str, list[str]], head: int = 200, final: Reply = (200, {}, MANIFEST)) -> None:
        self.faults, self.head, self.final, self.counts = faults, head, final, {}
        self.server = Host(self.answer)
        self.host = self.server.host

    def answer(self, h: BaseHTTPRequestHandler) -> Reply | None:
        key = (h.command, h.path.split("/uploads/")[0])
        n = self.counts[key] = self.counts.get(key, 0) + 1
        faults = self.faults.get(h.command, [])
        fault = faults[n - 1] if n <= len(faults) else None
        if fault == "429":
            return 429, {"Retry-After": "0"}, b'{"errors":[{"code":"TOOMANYREQUESTS"}]}'
        if fault and fault.isdigit():
            return int(fault), {}, b'{"errors":[{"code":"UNKNOWN"}]}'
        if fault == "reset":
            return None  # closed with no reply: RemoteDisconnected
        if fault == "cut":
            return 200, {"Content-Length": "4096"}, self.final[2][:20]
        if fault == "slow":
            time.sleep(0.6)
        return {
            "HEAD": (self.head, {}, b""),
            "POST": (202, {"Location": f"/v2/k3/x/blobs/uploads/session-{n}"}, b""),
            "PUT": (201, {}, b""),
        }.get(h.command, self.final)

    def close(self) -> None:
        self.server.close()


@pytest.fixture()
def flaky():
    made: list[Flaky] = []

    def make(faults: dict[str, list[str]], **kw) -> Flaky:
        made.append(Flaky(faults, **kw))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.mark.parametrize(
    "faults", [["500", "500", "429"], ["503"], ["reset", "reset"], ["cut"], ["slow"], ["500", "cut", "reset", "429"]]
)
def test_a_read_is_tried_again_and_gets_the_same_answer(flaky, quick, monkeypatch, faults):
    monkeypatch.setattr(transport, "TIMEOUT", 0.3)
    server = flaky({"GET": faults})
    manifest = Registry(server.host).manifest("k3/x", DIGEST)
    assert manifest is not None and manifest.raw == MANIFEST
    assert server.counts[("GET", f"/v2/k3/x/manifests/{DIGEST}")] == len(faults) + 1
    assert len(quick) == len(faults) and all("\n" not in line and "retry" in line for line in quick)
    assert quick[0].startswith(f"registry GET {server.host}/v2/k3/x/manifests/{DIGEST}: ")


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_a_4xx_other_than_429_is_never_tried_again(flaky, quick, status):
    server = flaky({}, final=(status, {}, b'{"errors":[{"code":"DENIED"}]}'))
    reg = Registry(server.host)
    if status == 404:
        assert reg.manifest("k3/x", "t") is None
    else:
        with pytest.raises(RegistryError) as info:
            reg.manifest("k3/x", "t")
        assert info.value.status == status
    assert list(server.counts.values()) == [1] and quick == []


@pytest.mark.parametrize("faults", [{"PUT": ["500"]}, {"PUT": ["reset"]}, {"POST": ["503"], "PUT": ["429"]}])
def test_an_upload_is_restarted_from_its_post(flaky, quick, faults):
    server = flaky(faults, head=404)  # HEAD: not there yet
    reg = Registry(server.host)
    data = b"an SBOM"
    assert reg.push_blob("k3/x", data) == "sha256:" + hashlib.sha256(data).hexdigest()
    seen = [(method, path.split("?")[0]) for method, path, _ in server.server.seen]
    methods = [method for method, _ in seen]
    assert methods[0] == "HEAD" and methods[-2:] == ["POST", "PUT"]
    assert all(methods[i - 1] == "POST" for i, m in enumerate(methods) if m == "PUT")  # a session per PUT
    assert methods.count("POST") == 1 + sum(len(f) for f in faults.values())
    sessions = [path for method, path in seen if method == "PUT"]
    assert len(set(sessions)) == len(sessions)  # never the failed session again
    assert len(quick) == sum(len(f) for f in faults.values()) and all(
        q.endswith("from a new upload session") for q in quick
    )


def test_a_post_alone_is_not_tried_again(flaky, quick):
    server = flaky({"POST": ["500"]})
    with pytest.raises(RegistryError, match="HTTP 500"):
        Registry(server.host)._request("POST", "/v2/k3/x/blobs/uploads/")
    assert list(server.counts.values()) == [1] and quick == []


def test_refused_from_the_start_is_said_at_once(quick):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once it is closed
    with pytest.raises(RegistryUnavailable, match="cannot reach the registry"):
        RegistryClient().resolve_digest(f"127.0.0.1:{port}/k3/x:t")
    assert quick == []


def test_refused_mid_run_is_tried_again_then_exit_3_within_the_budget(flaky, quick, monkeypatch):
    monkeypatch.setenv("K3_REGISTRY_RETRY_SECONDS", "0.5")
    server = flaky({})
    client = RegistryClient()
    ref = f"{server.host}/k3/x@{DIGEST}"
    assert client.resolve_digest(ref) == DIGEST
    server.close()  # the registry goes away mid-run
    with pytest.raises(RegistryUnavailable) as info:
        client.resolve_digest(ref)
    assert info.value.exit_code == 3 and "\n" not in info.value.message
    assert "still failing after" in info.value.message and "K3_REGISTRY_RETRY_SECONDS=0.5" in info.value.message
    assert quick and all("retry" in line for line in quick)


def test_a_streamed_blob_is_fetched_again_from_its_first_byte(flaky, quick, tmp_path):
    server = flaky({"GET": ["500", "cut"]})
    Registry(server.host).blob_to("k3/x", DIGEST, tmp_path / "blob")
    assert (tmp_path / "blob").read_bytes() == MANIFEST and len(quick) == 2


# -- a reply that drips (bounded time) and one too large ------------------------------------------------


class Drip:
    """A server answering 200 with ``body`` one ``step`` bytes every ``pause`` seconds (declared
    length or none), until done or the client hangs up."""

    def __init__(self, body: bytes, pause: float, declared: bool, step: int = 1) -> None:
        drip = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _any(self):
                drip.requests += 1
                self.send_response(200)
                if declared:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for i in range(0, len(body), step):
                        self.wfile.write(body[i : i + step])
                        self.wfile.flush()
                        time.sleep(pause)
                except OSError:
                    pass

            do_GET = do_HEAD = _any  # noqa: N815

        from http.server import ThreadingHTTPServer

        self.requests = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("declared", [True, False])
def test_a_dripping_manifest_ends_at_the_deadline(monkeypatch, declared):
    """A byte every 0.05 s never hits the per-read timeout; the request's deadline ends it."""
    monkeypatch.setenv("K3_REGISTRY_RETRY_SECONDS", "0")
    monkeypatch.setattr(transport, "DEADLINE", 0.5)
    server = Drip(MANIFEST * 4, pause=0.05, declared=declared)  # about 17 s in all
    try:
        with pytest.raises(RegistryError) as info:
            Registry(server.host).manifest("k3/x", "v1")
        assert info.value.fault is Fault.TIMEOUT and "took over 0.5 s" in str(info.value)
    finally:
        server.close()


@pytest.mark.parametrize("declared", [True, False])
def test_a_manifest_over_4_mib_is_refused_and_not_tried_again(quick, declared):
    server = Drip(b" " * (transport.MANIFEST_LIMIT + 1), pause=0, declared=declared, step=1 << 20)
    try:
        with pytest.raises(RegistryError, match=r"over 4194304 bytes") as info:
            Registry(server.host).manifest("k3/x", "v1")
        assert info.value.fault is Fault.OTHER and server.requests == 1 and quick == []
    finally:
        server.close()


def test_a_blob_stream_under_the_minimum_rate_times_out(monkeypatch, tmp_path):
    monkeypatch.setenv("K3_REGISTRY_RETRY_SECONDS", "0")
    monkeypatch.setattr(transport, "TIMEOUT", 0.3)
    server = Drip(MANIFEST, pause=0.02, declared=True)  # whole and correct, at 50 bytes/s: about 2 s
    try:
        with pytest.raises(RegistryError) as info:
            Registry(server.host).blob_to("k3/x", DIGEST, tmp_path / "blob")
        assert info.value.fault is Fault.TIMEOUT and "bytes/s" in str(info.value)
    finally:
        server.close()


def test_a_streamed_blob_keeps_the_registrys_retry_after(flaky, tmp_path):
    server = flaky({}, final=(503, {"Retry-After": "7"}, b"busy"))
    reg = Registry(server.host)
    with pytest.raises(RegistryError) as info:
        reg._stream("k3/x", DIGEST, tmp_path / "blob")
    assert info.value.status == 503 and info.value.retry_after == 7.0 and "HTTP 503 busy" in str(info.value)
