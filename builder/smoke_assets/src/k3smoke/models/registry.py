"""The stand-in for vllm/model_executor/models/registry.py: architectures -> model classes,
imported on first use."""

import importlib
import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

# architecture: (module under k3smoke.models, class)
_K3SMOKE_MODELS = {
    "K3SmokeForConditionalGeneration": ("k3smoke_model", "K3SmokeForConditionalGeneration"),
}

# What a model's config.json names in `architectures`. vLLM reads it from the model's files; the
# smoke reaches no model hub, so its one model's config is written here.
MODEL_ARCHITECTURES = {
    "k3smoke/K3-Smoke": ["K3SmokeForConditionalGeneration"],
}


@dataclass(frozen=True)
class _LazyRegisteredModel:
    module_name: str
    class_name: str

    def load_model_cls(self) -> type:
        return getattr(importlib.import_module(self.module_name), self.class_name)


@dataclass
class _ModelRegistry:
    models: dict = field(default_factory=dict)  # architecture -> _LazyRegisteredModel

    def get_supported_archs(self):
        return self.models.keys()

    def _try_load_model_cls(self, model_arch: str):
        """The model class of ``model_arch``; None when it is unknown or its module does not
        import (logged, as vLLM logs it)."""
        if model_arch not in self.models:
            return None
        try:
            return self.models[model_arch].load_model_cls()
        except Exception:
            logger.exception("Error in loading model architecture '%s'", model_arch)
            return None


ModelRegistry = _ModelRegistry({
    arch: _LazyRegisteredModel(module_name=f"k3smoke.models.{module}", class_name=cls)
    for arch, (module, cls) in _K3SMOKE_MODELS.items()
})
