"""The stand-in for vllm/model_executor/models/__init__.py."""

from k3smoke.models.registry import ModelRegistry

__all__ = ["ModelRegistry"]
