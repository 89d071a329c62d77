"""HTTP for the registry client and its token service: credentials that stay with their origin,
and the one rule deciding whether a failed request is tried again.

urllib's ``add_header`` copies a header onto every redirect, to any host and any scheme, so a
registry (or a token service) answering 307 to another host would hand it ``Authorization``.
Here the credential is an unredirected header, and a redirect carries it on only to the same
origin (scheme, host and port) as the request it came from: once dropped it is never put back
(a -> b -> b again gets nothing), as Go's net/http does since CVE-2024-45336. Real registries
redirect blob downloads to a CDN or object storage, which needs no credential (its URL is
presigned).

Busy registries and CDNs answer 500, 502, 503 and 429 now and then, drop connections and time
out; buildx, crane, skopeo and containerd retry those, and so does ``Retrier`` (issue 55):
idempotent requests only, with bounded exponential backoff and jitter (longer when the registry's
``Retry-After`` asks for more), each retry one log line, and no more retries once a registry has
failed for ``K3_REGISTRY_RETRY_SECONDS`` (default 60), or MAX_RETRIES times, without a sound
answer in between.
"""

from __future__ import annotations

import email.utils
import http.client
import os
import random
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from builder import log
from builder.errors import ConfigError

T = TypeVar("T")
TIMEOUT = 60.0  # seconds without a byte (connect, or any read) before a request has timed out
# A reply that keeps dripping never hits TIMEOUT, so a request other than a blob stream has a
# deadline for its whole body, and a blob stream a minimum rate once it has run TIMEOUT seconds.
DEADLINE = 120.0  # seconds from sending a request to the last byte of its reply (blob streams aside)
MIN_RATE = 16 * 1024  # bytes per second a blob stream averages, at the least, after TIMEOUT seconds
MANIFEST_LIMIT = 4 * 1024 * 1024  # bytes: containerd's limit on a manifest (and an index)

DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port made explicit: what a credential is bound to."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        return scheme, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:  # an unclosed IPv6 bracket, a port out of range: no origin, nobody's
        return "", "", None


class _CredentialsStayHome(urllib.request.HTTPRedirectHandler):
    """A redirect keeps the credential only to the origin the redirected request went to."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 - urllib's signature
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        credential = req.unredirected_hdrs.get("Authorization")
        if new is not None and credential and origin(req.full_url) == origin(new.full_url):
            new.add_unredirected_header("Authorization", credential)
        return new


_OPENER = urllib.request.build_opener(_CredentialsStayHome)


def open_url(req: urllib.request.Request, credential: str | None, timeout: float) -> http.client.HTTPResponse:
    """Send ``req`` with ``credential`` as its Authorization header, never past its origin."""
    if credential:
        req.add_unredirected_header("Authorization", credential)
    return _OPENER.open(req, timeout=timeout)


def read_body(
    resp: http.client.HTTPResponse,
    started: float,
    limit: int | None = None,
    sink: Callable[[bytes], None] | None = None,
) -> bytes:
    """The reply's body, read as it arrives: at most ``limit`` bytes (more is refused, declared or
    not), within DEADLINE of ``started``; with ``sink`` (a blob stream) each chunk goes there
    instead, and the stream must average MIN_RATE after TIMEOUT seconds. A miss is a timeout."""
    if limit is not None and (resp.length or 0) > limit:
        raise TooLarge(resp.length or 0, limit)
    chunks, size = [], 0
    while chunk := resp.read1(1 << 20):  # read1: one socket read, so the clock is looked at between
        size += len(chunk)
        if limit is not None and size > limit:
            raise TooLarge(size, limit)
        if sink is None:
            chunks.append(chunk)
        else:
            sink(chunk)
        elapsed = time.monotonic() - started
        if sink is None and elapsed > DEADLINE:
            raise TimeoutError(f"the reply took over {DEADLINE:g} s ({size} bytes so far)")
        if sink is not None and elapsed > TIMEOUT and size < MIN_RATE * elapsed:
            raise TimeoutError(f"the blob arrived at {size / elapsed:.0f} bytes/s, under {MIN_RATE} bytes/s")
    if resp.length:  # urllib ends a short body quietly: the bytes the reply declared are missing
        raise http.client.IncompleteRead(b"", resp.length)
    return b"".join(chunks)


class TooLarge(Exception):
    """A reply over its size limit (a manifest over MANIFEST_LIMIT): not the registry's passing mood."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the reply is over {limit} bytes (at least {size}); refused")


# --- failures, and the one rule for trying again ------------------------------------------------


class Fault(Enum):
    """What went wrong below HTTP (a reply with a status is judged by its status)."""

    REFUSED = "connection refused"
    RESET = "connection reset"
    TIMEOUT = "timed out"
    CUT = "reply cut short or garbled"
    OTHER = "other"


class RegistryError(Exception):
    """A request that failed: its HTTP ``status``, or the ``fault`` below HTTP; ``retry_after`` is
    the registry's Retry-After in seconds, when it sent one."""

    def __init__(
        self, message: str, status: int | None = None, fault: Fault = Fault.OTHER, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.fault, self.retry_after = status, fault, retry_after


IDEMPOTENT = frozenset({"GET", "HEAD", "PUT"})  # PUT: content-addressed blobs, manifests (same bytes, same result)
_PERMANENT_5XX = frozenset({501, 505})  # "not implemented", "version not supported": asking again changes nothing


def transient(err: RegistryError, answered: bool) -> bool:
    """Whether ``err`` may go away if the same request is sent again: 429 and 5xx, a reset, a
    timeout, a reply cut short; a refused connection only once the registry has answered in this
    run (one down from the start is said at once). Any other 4xx never is."""
    if err.status is not None:
        return err.status == 429 or (500 <= err.status <= 599 and err.status not in _PERMANENT_5XX)
    if err.fault is Fault.REFUSED:
        return answered
    return err.fault in (Fault.RESET, Fault.TIMEOUT, Fault.CUT)


def fault_of(exc: BaseException) -> Fault:
    """The fault an exception below HTTP stands for, by its type (never its wording)."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return Fault.RESET  # a TLS handshake or session cut mid-way; a certificate error stays OTHER
    if isinstance(reason, ConnectionRefusedError):
        return Fault.REFUSED
    if isinstance(reason, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return Fault.RESET  # http.client.RemoteDisconnected is a ConnectionResetError
    if isinstance(reason, TimeoutError):
        return Fault.TIMEOUT
    if isinstance(reason, http.client.InvalidURL):
        return Fault.OTHER  # our URL (or the registry's Location) is malformed: asking again is the same
    if isinstance(reason, http.client.HTTPException):
        return Fault.CUT
    return Fault.OTHER


def retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds: delta-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    value = (value or "").strip()
    if re.fullmatch(r"[0-9]+", value, re.ASCII):  # ASCII digits only: "²" is a digit to isdigit()
        return float(min(int(value), 86400))
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None


def refused(where: str, exc: urllib.error.HTTPError, note: str = "") -> RegistryError:
    """The error for an HTTP error reply to ``where`` ("METHOD host/path"): its status, a little
    of its body, its Retry-After, and ``note`` (why credentials did not help), when there is one."""
    try:
        body = exc.read()[:300].decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):  # the error's own body cut short: its status stands
        body = ""
    return RegistryError(
        f"{where}: HTTP {exc.code} {' '.join(body.split())}{f' ({note})' if note else ''}",
        exc.code,
        retry_after=retry_after(exc.headers.get("Retry-After")),
    )


def unreached(where: str, exc: Exception) -> RegistryError:
    """The error for a request to ``where`` that got no reply, or a cut or garbled one."""
    fault = fault_of(exc)
    if fault is Fault.CUT:  # IncompleteRead, BadStatusLine
        why = f"the registry's reply was cut short or garbled ({exc.__class__.__name__})"
    else:
        why = f"cannot reach the registry: {exc}"
    return RegistryError(f"{where}: {why}", fault=fault)


def session_url(post: str, location: str, digest: str) -> str:
    """The URL an upload session's PUT goes to: its ``location`` resolved against the ``post``'s
    URL (RFC 3986: it may be relative, or name another host), its query kept, ``digest`` added.
    ValueError when there is none or it is not a URL (an unclosed IPv6 bracket, port 99999)."""
    if not location:
        raise ValueError("the registry named no upload session (no Location)")
    try:
        parts = urllib.parse.urlsplit(urllib.parse.urljoin(post, location))
        parts.port  # noqa: B018 - raises on a port out of range, which the socket would wrap around
    except ValueError:
        raise ValueError("the upload session's Location is not a URL") from None
    query = "&".join(q for q in (parts.query, urllib.parse.urlencode({"digest": digest})) if q)
    return parts._replace(query=query).geturl()


BUDGET_VAR = "K3_REGISTRY_RETRY_SECONDS"
DEFAULT_BUDGET = 60.0
BASE_DELAY, MAX_DELAY = 0.5, 10.0  # the first wait, and the longest between two attempts


def budget_seconds() -> float:
    """How long a registry may fail before its failures are final: $K3_REGISTRY_RETRY_SECONDS."""
    raw = os.environ.get(BUDGET_VAR, "").strip()
    if not raw:
        return DEFAULT_BUDGET
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise ConfigError(f"${BUDGET_VAR}: {raw!r} is not a number of seconds from 0 to 3600")
    return value


MAX_RETRIES = 10  # a host's retries in one failing stretch, whatever its Retry-After says


@dataclass
class Retrier:
    """One registry host's retries (a Registry holds one): whether it has answered in this run, and
    since when (and with how many retries) it has failed without a sound answer. The budget and the
    retry count are per host, so a registry that stays down costs one budget per run, not one per
    request: a later request in the same failing stretch gets what is left, possibly none."""

    budget: float
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    jitter: Callable[[], float] = random.random
    answered: bool = False
    failing_since: float | None = None
    retries: int = 0  # in the current failing stretch, over all requests

    def run(self, method: str, attempt: Callable[[], T], again: str = "") -> T:
        """``attempt()`` (a ``method`` request) until it succeeds, fails for good, or the budget is
        spent; each retry is one line (``again`` says how it is sent again, when not as it was).
        The one place deciding what is retried: an idempotent method only, else one attempt."""
        if method not in IDEMPOTENT:
            return attempt()
        while True:
            started = self.clock()
            try:
                result = attempt()
            except RegistryError as exc:
                self.answered = self.answered or exc.status is not None
                wait = self._wait(exc, started)
                if wait is None:
                    raise self._final(exc) from None
                self.retries += 1
                log.warn(f"registry {exc}; retry {self.retries} in {wait:.1f} s{again}")
                self.sleep(wait)
                continue
            self.answered, self.failing_since, self.retries = True, None, 0
            return result

    def _wait(self, exc: RegistryError, started: float) -> float | None:
        """Seconds to wait before the next attempt, or None: not transient, past the budget, or
        out of retries. Never less than the backoff: a Retry-After of 0 (or a past date) asks for
        no wait at all, which would be a request per round trip until the budget ran out."""
        if not transient(exc, self.answered):
            self.failing_since, self.retries = None, 0  # a sound answer (404, 401): the registry is up
            return None
        if self.failing_since is None:
            self.failing_since = started
        left = self.failing_since + self.budget - self.clock()
        backoff = min(MAX_DELAY, BASE_DELAY * 2 ** min(self.retries, 16)) * (0.5 + self.jitter() / 2)
        wait = max(exc.retry_after or 0.0, backoff)
        return None if left <= 0 or wait > left or self.retries >= MAX_RETRIES else wait

    def _final(self, exc: RegistryError) -> RegistryError:
        if self.failing_since is None:
            return exc
        failed = self.clock() - self.failing_since
        return RegistryError(
            f"{exc} (still failing after {self.retries} retries of requests to this registry over {failed:.0f} s; "
            f"{BUDGET_VAR}={self.budget:g}, at most {MAX_RETRIES} retries)",
            exc.status,
            exc.fault,
        )
