"""The stand-in for vllm/tool_parsers/abstract_tool_parser.py."""

from k3smoke.lazy_registry import LazyRegistry


class ToolParser:
    """Extracts tool calls from a model's output."""

    def extract_tool_calls(self, model_output: str) -> list:
        raise NotImplementedError


class ToolParserManager(LazyRegistry, kind="Tool parser", base=ToolParser):
    """Central registry for ToolParser implementations (lazy registration, as vLLM's)."""

    @classmethod
    def get_tool_parser(cls, name: str) -> type:
        """The ToolParser class registered as ``name``, imported on first use; KeyError if none."""
        return cls._get(name)
