"""Name -> class registries whose classes are imported on first use, shaped like vLLM's
ToolParserManager and ReasoningParserManager (one base here instead of two copies)."""

import importlib


class LazyRegistry:
    """Subclassed as ``class M(LazyRegistry, kind="Tool parser", base=ToolParser)``."""

    kind = "entry"  # what the registry holds, for messages
    base: type = object  # every registered class must subclass it
    registered: dict = {}  # name -> class, imported (each subclass gets its own)
    lazy: dict = {}  # name -> (module path, class name), imported on first use

    def __init_subclass__(cls, kind: str, base: type, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.kind, cls.base, cls.registered, cls.lazy = kind, base, {}, {}

    @classmethod
    def register_lazy_module(cls, name: str, module_path: str, class_name: str) -> None:
        cls.lazy[name] = (module_path, class_name)

    @classmethod
    def register_lazy_modules(cls, package: str, table: dict) -> None:
        """Register each ``name: (module in package, class name)`` of ``table``, importing nothing."""
        for name, (module, class_name) in table.items():
            cls.register_lazy_module(name, f"{package}.{module}", class_name)

    @classmethod
    def list_registered(cls) -> list:
        return sorted(set(cls.registered) | set(cls.lazy))

    @classmethod
    def _get(cls, name: str) -> type:
        """The class registered as ``name``; KeyError when there is none, the import's own error
        when its module does not import."""
        if name in cls.registered:
            return cls.registered[name]
        if name not in cls.lazy:
            raise KeyError(f"{cls.kind} '{name}' not found. Available: {', '.join(cls.list_registered())}")
        module_path, class_name = cls.lazy[name]
        found = getattr(importlib.import_module(module_path), class_name)
        if not (isinstance(found, type) and issubclass(found, cls.base)):
            raise TypeError(f"{class_name} in {module_path} is not a {cls.base.__name__} subclass.")
        cls.registered[name] = found
        return found
