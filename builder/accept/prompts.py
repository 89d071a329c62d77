"""Prompts of a given length in the server's own tokens: filler text cut by characters until
/tokenize counts the chat prompt at the length asked for (no tokenizer of our own can know)."""

from __future__ import annotations

from builder.accept.client import Client, EndpointDown

FILLER = (
    "Record {i}: the rack in hall {h} reported fan speed {f} rpm and inlet temperature {t} C; "
    "the operator noted nothing unusual and moved on to the next row.\n"
)


def filler(chars: int, seed: int = 0) -> str:
    """Deterministic, varied text of at least ``chars`` characters (varied so no tokenizer folds it)."""
    parts, i, size = [], seed, 0
    while size < chars:
        line = FILLER.format(i=i, h=i % 17, f=1200 + (i * 37) % 900, t=18 + (i * 7) % 11)
        parts.append(line)
        size += len(line)
        i += 1
    return "".join(parts)[:chars]


class NoTokenizer(Exception):
    """The server has no /tokenize (not vLLM, or an older one): lengths cannot be counted."""


def count(client: Client, model: str, messages: list[dict], tools: list[dict] | None = None) -> int:
    """The chat prompt's length in tokens, as the server's /tokenize counts it."""
    return len(tokens(client, model, messages, tools))


def tokens(client: Client, model: str, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    body: dict = {"model": model, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    reply = client.post("/tokenize", body)
    if tools and reply.status == 400:  # a /tokenize without the tools field: the messages alone
        return tokens(client, model, messages)
    doc = reply.json()
    if reply.status in (404, 405, 501) or (reply.ok and not isinstance(doc, dict)):
        raise NoTokenizer(f"/tokenize answered HTTP {reply.status}")
    if not reply.ok or not isinstance(doc.get("tokens"), list):
        raise NoTokenizer(f"/tokenize answered HTTP {reply.status}: {reply.text[:200]}")
    return [int(t) for t in doc["tokens"]]


def sized(client: Client, model: str, target: int, wrap) -> tuple[list[dict], int]:
    """Messages ``wrap(text)`` whose chat prompt is at most ``target`` tokens and as close as the
    text allows (binary search on the filler's characters), and their count."""
    base = count(client, model, wrap(""))
    if base >= target:
        return wrap(""), base
    probe = filler(4000)
    per_char = max(1e-3, (count(client, model, wrap(probe)) - base) / len(probe))
    lo, hi = 0, int((target - base) / per_char * 1.5) + 64
    best = (wrap(""), base)
    text = filler(hi)
    while lo <= hi:
        mid = (lo + hi) // 2
        n = count(client, model, wrap(text[:mid]))
        if n <= target:
            best = (wrap(text[:mid]), n)
            if n == target:
                break
            lo = mid + 1
        else:
            hi = mid - 1
    return best


__all__ = ["EndpointDown", "NoTokenizer", "count", "filler", "sized", "tokens"]
