"""The stand-in for vllm/reasoning/abs_reasoning_parsers.py."""

from k3smoke.lazy_registry import LazyRegistry


class ReasoningParser:
    """Splits a model's output into its reasoning and its answer."""

    def extract_reasoning(self, model_output: str) -> tuple:
        raise NotImplementedError


class ReasoningParserManager(LazyRegistry, kind="Reasoning parser", base=ReasoningParser):
    """Central registry for ReasoningParser implementations (lazy registration, as vLLM's)."""

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type:
        """The ReasoningParser class registered as ``name``, imported on first use; KeyError if none."""
        return cls._get(name)
