"""HTTP for the registry client and its token service: credentials that stay with their origin.

urllib's ``add_header`` copies a header onto every redirect, to any host and any scheme, so a
registry (or a token service) answering 307 to another host would hand it ``Authorization``.
Here the credential is an unredirected header, and a redirect carries it on only to the same
origin (scheme, host and port) as the request it came from: once dropped it is never put back
(a -> b -> b again gets nothing), as Go's net/http does since CVE-2024-45336. Real registries
redirect blob downloads to a CDN or object storage, which needs no credential (its URL is
presigned).
"""

from __future__ import annotations

import http.client
import urllib.parse
import urllib.request

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
