"""The stand-in for vllm/reasoning/__init__.py: every parser registered lazily by name."""

from k3smoke.reasoning.abs_reasoning_parsers import ReasoningParser, ReasoningParserManager

__all__ = ["ReasoningParser", "ReasoningParserManager"]

_REASONING_PARSERS_TO_REGISTER = {
    "k3smoke": ("k3smoke_reasoning_parser", "K3SmokeReasoningParser"),  # name: (module, class)
}

ReasoningParserManager.register_lazy_modules(__name__, _REASONING_PARSERS_TO_REGISTER)
