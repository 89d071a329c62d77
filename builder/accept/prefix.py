"""Step 4, prefix caching checked apart from the driver: two requests sharing the system prompt,
the tool descriptions and the start of the user context, differing only in a short question; then
a one-token change near the start. Reuse counts whole blocks: the second request is judged by its
ratio of the shared prefix, the changed one by position (no more than the blocks before the change)."""

from __future__ import annotations

import json
import math
import time

from builder.accept import metrics, prompts
from builder.accept.basic import measured, streamed_result
from builder.accept.model import Outcome, ReuseCause, Step, StepResult
from builder.accept.session import Session

REUSE_MIN = 0.5  # cached / shared prefix tokens the second request must reach
PREFIX_CAP = 4096  # tokens of shared prefix: enough to show in TTFT on a GPU, quick on a CPU
DIFFER_EARLY = 0.5  # prompts parting before this share of the intended prefix: not identical
SETTLE = 1.0  # seconds for the counters on /metrics to take a finished request in
QUESTIONS = ("Which hall reported the highest fan speed?", "Which record is the coldest?")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_rack",
            "description": "Look up a rack's current fan speed and inlet temperature by hall and record number.",
            "parameters": {
                "type": "object",
                "properties": {"hall": {"type": "integer"}, "record": {"type": "integer"}},
                "required": ["hall", "record"],
            },
        },
    }
]


def _system(word: str, nonce: str) -> str:
    return f"{word} {nonce}: you are the data-centre assistant. Answer from the records in the user's message."


def _hits(s: Session) -> float | None:
    text = s.metrics()
    return None if text is None else metrics.total(metrics.parse(text), metrics.HITS)


class _Prompt:
    """The shared prompt; ``tools`` go in the request, or inline in the system prompt for a server
    (or chat template) that refuses the tools field."""

    def __init__(self, s: Session, context: str) -> None:
        self.s, self.context, self.inline = s, context, False

    def messages(self, question: str, word: str = "Alpha") -> list[dict]:
        system = _system(word, self.s.nonce)
        if self.inline:
            system += f"\nTools you may call: {TOOLS}"
        return [{"role": "system", "content": system}, {"role": "user", "content": f"{self.context}\n\n{question}"}]

    def body(self, question: str, word: str = "Alpha") -> dict:
        extra = {} if self.inline else {"tools": TOOLS, "tool_choice": "none"}
        return self.s.chat(self.messages(question, word), max_tokens=4, **extra)

    @property
    def tools(self) -> list[dict] | None:
        return None if self.inline else TOOLS


def _send(s: Session, prompt: _Prompt, question: str, word: str = "Alpha") -> tuple[dict, str | None]:
    before = _hits(s)
    out = s.client.stream_chat(prompt.body(question, word))
    if tools_refused(out) and not prompt.inline:  # tools refused: the same test, tools inline
        prompt.inline = True
        before = _hits(s)
        out = s.client.stream_chat(prompt.body(question, word))
    failed = streamed_result(Step.PREFIX, out)
    time.sleep(SETTLE)
    after = _hits(s)
    m = measured(out)
    m["hits_delta"] = None if before is None or after is None else after - before
    return m, failed.reason if failed else None


def tools_refused(out) -> bool:
    """An HTTP 400 whose error (vLLM's error JSON) names the tools: its param is tools or
    tool_choice, or its message speaks of tools. Any other 400 (a prompt too long) is a failure."""
    if out.status != 400:
        return False
    try:
        doc = json.loads(out.body)
    except ValueError:
        return False
    error = doc.get("error", doc) if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return False
    if error.get("param") in ("tools", "tool_choice"):
        return True
    return error.get("param") is None and "tool" in str(error.get("message", "")).lower()


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _cached(m: dict) -> float | None:
    """What a request reused: usage's cached_tokens, else the /metrics hit counter's rise."""
    return m["cached_tokens"] if m["cached_tokens"] is not None else m["hits_delta"]


def _cause(s: Session, first_diff: int | None, shared: int) -> ReuseCause:
    caching = s.facts.get("prefix_caching")
    if caching is False:
        return ReuseCause.FLAG_MISSING
    if first_diff is not None and first_diff < shared * DIFFER_EARLY:
        return ReuseCause.PREFIXES_DIFFER
    return ReuseCause.UNKNOWN if caching is None else ReuseCause.EVICTED


def _size(s: Session) -> int:
    limit = s.facts.get("max_model_len") or PREFIX_CAP
    return max(64, min(PREFIX_CAP, int((limit - s.opts.max_tokens - 64) * 0.75)))


def prefix(s: Session) -> StepResult:
    block = metrics.block_size(s.facts.get("cache_config"))
    size = _size(s)
    if block and size < 2 * block:
        return StepResult(Step.PREFIX, Outcome.NA, f"a prefix of {size} tokens is under two blocks of {block}")
    prompt = _Prompt(s, "")
    try:
        wrapped, _ = prompts.sized(s.client, s.model, size, lambda text: _Prompt(s, text).messages(QUESTIONS[0]))
    except prompts.NoTokenizer as exc:
        return _without_tokenizer(s, prompt, str(exc))
    prompt.context = wrapped[1]["content"].rsplit("\n\n", 1)[0]
    return _judge(s, prompt)


def _without_tokenizer(s: Session, prompt: _Prompt, why: str) -> StepResult:
    return StepResult(Step.PREFIX, Outcome.NA, f"the shared prefix cannot be counted ({why})")


def _runs(s: Session, prompt: _Prompt) -> tuple[dict, dict, dict, str | None]:
    first, why = _send(s, prompt, QUESTIONS[0])
    if why:
        return first, {}, {}, why
    second, why = _send(s, prompt, QUESTIONS[1])
    if why:
        return first, second, {}, why
    changed, why = _send(s, prompt, QUESTIONS[1], word="Bravo")
    return first, second, changed, why


def _judge(s: Session, prompt: _Prompt) -> StepResult:
    first, second, changed, why = _runs(s, prompt)
    m: dict = {"first": first, "second": second, "changed": changed, "tools_inline": prompt.inline}
    if why:
        return StepResult(Step.PREFIX, Outcome.FAIL, why, m)
    try:
        a, b, c = (
            prompts.tokens(s.client, s.model, prompt.messages(q, word), prompt.tools)
            for q, word in ((QUESTIONS[0], "Alpha"), (QUESTIONS[1], "Alpha"), (QUESTIONS[1], "Bravo"))
        )
    except prompts.NoTokenizer as exc:
        return StepResult(Step.PREFIX, Outcome.NA, f"the shared prefix cannot be counted ({exc})", m)
    shared = _first_difference(a, b)
    m.update({"prompt_tokens": len(a), "shared_tokens": shared, "changed_at_token": _first_difference(b, c)})
    reused, after_change = _cached(second), _cached(changed)
    if reused is None:
        return StepResult(
            Step.PREFIX,
            Outcome.NA,
            "no reuse can be seen: no usage.prompt_tokens_details.cached_tokens (vLLM: --enable-prompt-tokens-details) "
            "and no prefix-cache counter on /metrics",
            m,
        )
    m["reuse_ratio"] = round(reused / max(shared, 1), 3)
    if first["ttft_s"] and second["ttft_s"]:
        m["ttft_second_over_first"] = round(second["ttft_s"] / first["ttft_s"], 3)
    if m["reuse_ratio"] < REUSE_MIN:
        cause = _cause(s, shared, len(a) - 16)
        return StepResult(Step.PREFIX, Outcome.FAIL, _why_not(cause, m, s), m, cause=cause)
    block = metrics.block_size(s.facts.get("cache_config")) or _inferred_block(reused, after_change)
    m["block_size"] = block
    if after_change is not None and block and after_change > _allowed(m["changed_at_token"], block):
        why_changed = (
            f"{after_change:.0f} tokens reused after a change at token {m['changed_at_token']}: more than the "
            f"blocks of {block} before it ({_allowed(m['changed_at_token'], block)})"
        )
        return StepResult(Step.PREFIX, Outcome.FAIL, why_changed, m, cause=ReuseCause.REUSE_AFTER_CHANGE)
    return StepResult(
        Step.PREFIX,
        Outcome.PASS,
        f"second request reused {reused:.0f} of {shared} shared tokens ({m['reuse_ratio']:.0%}); "
        f"a change at token {m['changed_at_token']} (block {block or '?'}): "
        f"{after_change if after_change is not None else '?'} reused",
        m,
    )


def _allowed(changed_at: int, block: int) -> int:
    """What a request changed at token ``changed_at`` may reuse: the blocks before the change,
    counted up to a whole block (the block holding the change may be judged by the server)."""
    return math.ceil(changed_at / block) * block


def _inferred_block(reused: float, after_change: float | None) -> int | None:
    """Without cache_config_info's block_size: reuse comes in whole blocks, so both counts are
    multiples of the block; their greatest common divisor is the largest block size they allow."""
    if not after_change:
        return None
    return math.gcd(int(reused), int(after_change)) or None


def _why_not(cause: ReuseCause, m: dict, s: Session) -> str:
    head = f"the second request reused {m['reuse_ratio']:.0%} of {m['shared_tokens']} shared tokens"
    return head + {
        ReuseCause.FLAG_MISSING: ": the process runs without prefix caching (cache_config_info "
        "enable_prefix_caching=False): the flag did not reach it",
        ReuseCause.PREFIXES_DIFFER: f": the prompts are not identical from token {m['shared_tokens']} on "
        "(the chat template puts something varying in them)",
        ReuseCause.EVICTED: ": caching is on and the prefixes are identical: the state was evicted "
        "(KV cache too small, or the retention policy drops it)",
        ReuseCause.UNKNOWN: ": the server does not say whether caching is on (no cache_config_info)",
    }.get(cause, "")
