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
idempotent requests only, with bounded exponential backoff and jitter (or the ``Retry-After``
the registry asks for), each retry one log line, and no more retries once a registry has failed
for ``K3_REGISTRY_RETRY_SECONDS`` (default 60) without a sound answer in between.
"""

from __future__ import annotations

import email.utils
import http.client
import os
import random
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

DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port made explicit: what a credential is bound to."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(scheme)


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
    if isinstance(reason, ConnectionRefusedError):
        return Fault.REFUSED
    if isinstance(reason, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return Fault.RESET  # http.client.RemoteDisconnected is a ConnectionResetError
    if isinstance(reason, TimeoutError):
        return Fault.TIMEOUT
    if isinstance(reason, http.client.HTTPException):
        return Fault.CUT
    return Fault.OTHER


def retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds: delta-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    value = (value or "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


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


@dataclass
class Retrier:
    """One registry host's retries (a Registry holds one): whether it has answered in this run, and
    since when it has failed without a sound answer (the budget is per host, so a registry that
    stays down costs one budget per run, not one per request)."""

    budget: float
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    jitter: Callable[[], float] = random.random
    answered: bool = False
    failing_since: float | None = None

    def run(self, attempt: Callable[[], T], again: str = "") -> T:
        """``attempt()`` until it succeeds, fails for good, or the budget is spent; each retry is
        one line (``again`` says how the request is sent again, when not as it was)."""
        retries = 0
        while True:
            started = self.clock()
            try:
                result = attempt()
            except RegistryError as exc:
                self.answered = self.answered or exc.status is not None
                wait = self._wait(exc, retries, started)
                if wait is None:
                    raise self._final(exc, retries) from None
                log.warn(f"registry {exc}; retry {retries + 1} in {wait:.1f} s{again}")
                self.sleep(wait)
                retries += 1
                continue
            self.answered, self.failing_since = True, None
            return result

    def _wait(self, exc: RegistryError, retries: int, started: float) -> float | None:
        """Seconds to wait before the next attempt, or None: not transient, or past the budget."""
        if not transient(exc, self.answered):
            self.failing_since = None  # a sound answer (404, 401): the registry is up
            return None
        if self.failing_since is None:
            self.failing_since = started
        left = self.failing_since + self.budget - self.clock()
        backoff = min(MAX_DELAY, BASE_DELAY * 2 ** min(retries, 16)) * (0.5 + self.jitter() / 2)
        wait = exc.retry_after if exc.retry_after is not None else backoff
        return None if left <= 0 or wait > left else wait

    def _final(self, exc: RegistryError, retries: int) -> RegistryError:
        if self.failing_since is None:
            return exc
        failed = self.clock() - self.failing_since
        return RegistryError(
            f"{exc} (still failing after {retries} retries over {failed:.0f} s; {BUDGET_VAR}={self.budget:g})",
            exc.status,
            exc.fault,
        )
