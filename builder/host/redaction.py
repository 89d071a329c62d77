"""What `build evidence` hides, by value and not by shape (issue 32, defect 5).

A bundle is handed to people outside the team, so what it must not hold is decided by value:

- every value of a variable whose name looks secret (TOKEN, SECRET, PASSWORD, KEY, CREDENTIAL,
  AUTH..., HF_TOKEN) is registered with the log's redaction (builder/log.py), in each form it may be
  written in: as it is, line by line and word by word (what ``log.register_secret`` derives),
  shell-quoted, JSON-escaped, percent-encoded and base64; so it is hidden in every file of the
  bundle (the container's log included), not only in environment.txt;
- URL credentials (userinfo), query strings and fragments (presigned URLs, tokens in a query), and
  long opaque path segments (webhook URLs carry their secret in the path);
- PEM blocks other than certificates and public keys (a private key, multi-line);
- the value after a credential flag (``-u user:pw``, ``--password X``, ``--token X``) and after
  ``Authorization: Bearer|Basic``.

A value with spaces is not harmless for that (a DSN with a password, a command line with
``-u user:pw``): environment.txt keeps a value only when every word of it is harmless on its own.
What stays out of reach: a secret in a form none of the above names (split, encrypted, or under a
name that does not look secret and in a shape that does not either).
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import urllib.parse

from builder import log

# Names whose values are secrets: tokens, passwords, keys, JWTs, personal access tokens, ...
SECRET_NAME = re.compile(
    r"(?i)(token|secret|passw|pwd|pass\b|_pass|pat\b|_pat|jwt|key|credential|auth|access"
    r"|cookie|session|private|signature|cert|webhook|dsn)"
)
# Values that look like credentials whatever their name: long opaque strings, known token shapes.
SECRET_VALUE = re.compile(r"^(gh[pousr]_|github_pat_|glpat-|hf_|sk-|xox[abpr]-|AKIA|eyJ)|^[A-Za-z0-9+/_=.-]{32,}$")
# A value of one word: a path, a PATH-like list, a plain word, a URL (scrubbed by then).
_HARMLESS = re.compile(r"^(/[\w./:-]*|[\w.-]+(:[\w./-]+)*|[a-z][a-z0-9+.-]*://\S*)$")
# A word of a value with several: a path, a plain word or number, a URL; no `a:b`, no `k=v`.
_HARMLESS_WORD = re.compile(r"^(/[\w./-]*|[\w.,+%-]+|[a-z][a-z0-9+.-]*://\S*)$")
# Values a secret-looking name often holds that are not secrets; hiding them everywhere would
# blank every "true" in `docker info`.
_NOT_SECRET = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null", "0", "1"})

_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]{1,40})-----.*?(?:-----END \1-----|\Z)", re.S)
_PUBLIC_PEM = frozenset({"CERTIFICATE", "TRUSTED CERTIFICATE", "PUBLIC KEY", "X509 CRL", "CERTIFICATE REQUEST"})
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s\"'<>`]+)")
_OPAQUE_SEGMENT = re.compile(r"^(?=[^/]*\d)(?=[^/]*[A-Za-z])[A-Za-z0-9_~.=-]{16,}$")
_FLAG_VALUE = re.compile(r"(?i)((?:^|\s)(?:--?(?:password|passwd|pass|token|api-key|apikey|secret|auth)[ =]))(\S+)")
_USER_FLAG = re.compile(r"((?:^|\s)(?:-u|--user)[ =])(\S*:\S+)")
_AUTH_HEADER = re.compile(r"(?i)(\b(?:Bearer|Basic|Token)\s+)([A-Za-z0-9+/_=.~-]{8,})")


def forms(value: str) -> tuple[str, ...]:
    """The other forms a value is written in: shell-quoted, JSON-escaped, percent-encoded, base64."""
    raw = value.encode()
    return (
        shlex.quote(value),
        json.dumps(value)[1:-1],
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote_plus(value),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        base64.b64encode(raw).decode().rstrip("="),
    )


def register_environment(environ: dict[str, str]) -> None:
    """Register every value of a secret-looking name (and its forms) with the log's redaction. A
    PEM value is registered by its body lines: its armor (`-----BEGIN ... KEY-----`) is no secret,
    and hiding it would hide where every other block starts (the PEM rule needs it)."""
    for name, value in environ.items():
        if not SECRET_NAME.search(name) or not value.strip() or value.strip().lower() in _NOT_SECRET:
            continue
        if "-----BEGIN " in value:
            for line in value.splitlines():
                if line.strip() and not line.startswith("-----"):
                    log.register_secret(line)
            continue
        log.register_secret_forms(value, tuple(f for f in forms(value) if f != value))


def _url(match: re.Match) -> str:
    scheme, rest = match.group(1), match.group(2)
    rest = re.sub(r"^[^/@]*@", "***@", rest)  # userinfo, whatever its shape
    rest = re.sub(r"\?[^#]*", "?***", rest, count=1)
    rest = re.sub(r"#.*", "#***", rest, count=1)
    head, sep, path = rest.partition("/")
    if sep:
        path = "/".join("***" if _OPAQUE_SEGMENT.match(seg) else seg for seg in path.split("/"))
    return scheme + head + sep + path


def _pem(match: re.Match) -> str:
    label = match.group(1)
    return match.group(0) if label in _PUBLIC_PEM else f"-----BEGIN {label}----- *** -----END {label}-----"


def scrub(text: str) -> str:
    """A text of the bundle with every form above hidden (registered values via ``log.redact``)."""
    text = _PEM.sub(_pem, text)
    text = log.redact(text)
    text = _URL.sub(_url, text)
    text = _FLAG_VALUE.sub(r"\1***", text)
    text = _USER_FLAG.sub(r"\1***", text)
    return _AUTH_HEADER.sub(r"\1***", text)


def harmless(value: str) -> bool:
    """A value environment.txt may show: every word of it harmless on its own, none credential-shaped."""
    if not value:
        return True
    if "\n" in value or "\r" in value:
        return False
    words = value.split()
    if any(SECRET_VALUE.search(w) for w in words):
        return False
    if len(words) == 1 and value == words[0]:
        return bool(_HARMLESS.match(value))
    return all(_HARMLESS_WORD.match(w) for w in words)
