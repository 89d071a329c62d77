"""The stand-in for vllm/model_executor/model_loader/__init__.py: the load formats and their loaders."""


class BaseModelLoader:
    def __init__(self, load_format: str):
        self.load_format = load_format


class DefaultModelLoader(BaseModelLoader):
    """Weights from the model's files (safetensors, read with or without fastsafetensors)."""


class DummyModelLoader(BaseModelLoader):
    """Random weights, for tests."""


_LOAD_FORMAT_TO_MODEL_LOADER: dict = {
    "auto": DefaultModelLoader,
    "dummy": DummyModelLoader,
    "fastsafetensors": DefaultModelLoader,
    "safetensors": DefaultModelLoader,
}


def get_model_loader(load_format: str) -> BaseModelLoader:
    if load_format not in _LOAD_FORMAT_TO_MODEL_LOADER:
        raise ValueError(f"Load format `{load_format}` is not supported")
    return _LOAD_FORMAT_TO_MODEL_LOADER[load_format](load_format)
