"""The stand-in for vllm/tool_parsers/__init__.py: every parser registered lazily by name."""

from k3smoke.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

__all__ = ["ToolParser", "ToolParserManager"]

_TOOL_PARSERS_TO_REGISTER = {
    "k3smoke": ("k3smoke_tool_parser", "K3SmokeToolParser"),  # name: (module, class)
}

ToolParserManager.register_lazy_modules(__name__, _TOOL_PARSERS_TO_REGISTER)
