"""matrix.yaml, parsed once into typed, frozen objects: read (a safe YAML loader: no aliases, no
duplicate keys, dates kept as text), the options cascade's matrix layers applied (``cascade``:
environment > target > ``defaults:`` > the schema's built-in defaults), validated against the
schema (``schema``, its strict values in ``patterns``), then checked across keys. Past ``load()``
the rest of the code sees only these objects.

Every bad input is one line naming the file and the key as written (a value a target got from
``defaults:`` is named there, one from the environment names its variable), with a "did you mean"
for a misspelt key. The schema's models are importable from here, where the rest of the tool has
always found them.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ValidationError

from builder.config import cascade, cpulevel, platforms
from builder.config.ospackages import OsPackage, OsPackages
from builder.config.patterns import did_you_mean, show
from builder.config.schema import (
    RESERVED_LAYERS,
    BaseImage,
    Bases,
    Compile,
    Cuda,
    Extensions,
    ImageTarget,
    Layer,
    Matrix,
    Pin,
    Python,
    RawMatrix,
    Recipe,
    Runtime,
    Signing,
    Source,
    Standalone,
    Target,
    ThirdParty,
)
from builder.errors import ConfigError

# The models, for ``from builder.config.matrix import Target`` (the rest of the tool's one entry).
__all__ = [
    "BaseImage",
    "Bases",
    "Compile",
    "Cuda",
    "Extensions",
    "ImageTarget",
    "Layer",
    "Matrix",
    "OsPackage",
    "OsPackages",
    "Pin",
    "Python",
    "Recipe",
    "Runtime",
    "Signing",
    "Source",
    "Standalone",
    "Target",
    "ThirdParty",
    "load",
    "parse",
]

MAX_MATRIX_BYTES = 1 << 20  # a matrix is a few KB; anything past 1 MiB is not one
_ANNOTATED: Any = Annotated  # a field's type rebuilt at run time from its parts: no static type to check


class _Loader(yaml.SafeLoader):
    """Safe loader that refuses duplicate keys and aliases (no billion-laughs expansion)."""


def _compose_node(self: _Loader, parent: Any, index: Any) -> Any:
    if self.check_event(yaml.events.AliasEvent):
        event = self.peek_event()
        raise yaml.constructor.ConstructorError(
            None, None, "YAML aliases (*name) are not allowed in the matrix; write the value out", event.start_mark
        )
    return yaml.SafeLoader.compose_node(self, parent, index)


def _construct_mapping(self: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = self.construct_object(key_node, deep=deep)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, f"keys must be strings, got {show(key)}", key_node.start_mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen[key] = True
    return yaml.SafeLoader.construct_mapping(self, node, deep=True)


_Loader.compose_node = _compose_node
# Dates stay text until the schema parses them, so 2027-02-30 is a keyed error, not a crash.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# --- errors: one line, the key as written -----------------------------------------------------


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class that owns the mapping at ``loc`` (for "did you mean" suggestions)."""
    model: Any = RawMatrix
    i = 0
    while i < len(loc):
        field = model.model_fields.get(loc[i]) if isinstance(loc[i], str) else None
        if field is None:
            return None
        ann = field.annotation
        i += 1
        for _ in range(3):  # unwrap Optional[...], dict[str, X], tuple[X, ...]
            origin = typing.get_origin(ann)
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            if origin is dict and i < len(loc):
                ann, i = args[1], i + 1
            elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
                ann = args[0]
            elif origin is typing.Annotated or (args and hasattr(ann, "__metadata__")):
                ann = args[0]
            else:
                break
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
        if i == len(loc):
            return model
    return model


_TYPE_TAG = re.compile(r"(function-|\[key\]$|[a-z-]+\[.*\(\))|(literal|tuple|list|dict|union|str|int|bool)\[")


def _clean_loc(loc: tuple) -> tuple:
    # pydantic appends the validator name for Annotated members and the member's type for union
    # members (literal['all','none'], tuple[...]); keep real keys only.
    return tuple(p for p in loc if not (isinstance(p, str) and _TYPE_TAG.match(p)))


def _key(part: Any) -> str:
    """A key as it can be printed on one line: plain names as they are, anything else quoted."""
    text = str(part)
    return text if re.fullmatch(r"[A-Za-z0-9_.+@\[\]-]+", text) else repr(part)


def _where(loc: tuple, own: dict, defaults: dict) -> str:
    """The key as written in the file: a value a target got from ``defaults:`` is named there."""
    if len(loc) > 2 and loc[0] == "targets" and isinstance(own.get(loc[1]), dict):
        rest = loc[2:]
        if cascade.from_defaults(rest, own[loc[1]], defaults):
            return "defaults." + ".".join(map(_key, rest)) + f" (used by targets.{_key(loc[1])})"
    return ".".join(_key(p) for p in loc) or "(top level)"


def _format_error(path: Path, err: dict, own: dict | None = None, defaults: dict | None = None) -> str:
    loc = _clean_loc(tuple(err["loc"]))
    where = _where(loc, own or {}, defaults or {})
    var = cascade.env_source(loc[2:])
    if var:
        where += f" (from ${var})"
    kind = err["type"]
    if kind == "extra_forbidden":
        owner = _model_at(loc[:-1])
        options = list(owner.model_fields) if owner else []
        options = [o for o in options if o != "name"] if owner is Target else options
        return f"{path}: {where}: unknown key{did_you_mean(str(loc[-1]), options)}"
    if kind == "missing":
        return f"{path}: {where}: required key is missing"
    msg = err["msg"]
    msg = msg.removeprefix("Value error, ")
    if kind in ("string_type", "int_type", "bool_type", "date_type", "tuple_type", "dict_type", "model_type"):
        quote = kind == "string_type" and isinstance(err.get("input"), (int, float))
        msg = f"{msg} (got {show(err.get('input'))}{'; quote it' if quote else ''})"
    elif (
        kind.startswith("literal")
        or kind.endswith("_parsing")
        or kind in ("greater_than_equal", "less_than_equal", "too_short")
    ):
        msg = f"{msg} (got {show(err.get('input'))})"
    return f"{path}: {where}: {msg}"


# --- parsing -------------------------------------------------------------------------------------


def _read(text: str, path: Path) -> Any:
    """The YAML document, or one line saying where and why it is not one."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MATRIX_BYTES:
        raise ConfigError(f"{path}: the file is larger than {MAX_MATRIX_BYTES} bytes; is it really a matrix?")
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(unknown position)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}: invalid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nesting too deep to be a matrix") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a scalar YAML could not construct
        raise ConfigError(f"{path}: invalid YAML value: {show(str(exc))}") from None


def parse(text: str, path: Path) -> Matrix:
    """Parse matrix text. Raises ConfigError with one line naming the file and the key."""
    raw = _read(text, path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: (top level): must be a mapping with 'version' and 'targets'")
    defaults = raw.get("defaults", {})
    targets = raw.get("targets")
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: defaults: must be a mapping")
    own_targets = targets if isinstance(targets, dict) else {}
    _check_defaults(path, defaults, own_targets)
    if isinstance(targets, dict):
        overrides = cascade.environment_overrides()
        merged = {name: cascade.target_entry(name, entry, defaults, overrides) for name, entry in targets.items()}
        raw = {**raw, "targets": merged}
    try:
        checked = RawMatrix.model_validate(raw)
    except ValidationError as exc:
        # Unknown keys first (a typo explains the "missing" errors it causes), then the deepest
        # location: "indexes.0: must be an https URL" says more than "indexes: too short".
        # Of a union's members, the one that got as deep as an item (a bad path in a list) says most.
        errors = sorted(
            exc.errors(include_url=False),
            key=lambda e: (
                e["type"] != "extra_forbidden",
                -len(_clean_loc(tuple(e["loc"]))),
                tuple(map(str, e["loc"])),
            ),
        )
        raise ConfigError(_format_error(path, dict(errors[0]), own_targets, defaults)) from None
    for name, target in checked.targets.items():
        if target.name != name:
            raise ConfigError(f"{path}: targets.{name}.name: 'name' is set from the key; remove it")
        _cross_checks(path, target)
    return Matrix(version=checked.version, targets=checked.targets, path=path)


def _check_defaults(path: Path, defaults: dict, targets: dict) -> None:
    """Every value under ``defaults:`` is checked on its own, used by a target or not: a bad value
    no target reads is still bad input (and would bite the next target that inherits it)."""
    from pydantic import TypeAdapter

    for key, value in defaults.items():
        field = Target.model_fields.get(key) if isinstance(key, str) and key != "name" else None
        if field is None:
            options = [o for o in Target.model_fields if o != "name"]
            raise ConfigError(f"{path}: defaults.{_key(key)}: unknown key{did_you_mean(str(key), options)}")
        try:
            # Annotated[X] with no metadata is a TypeError: plain models (image, bases...) have none.
            parts = (field.annotation, *field.metadata)
            kind: Any = _ANNOTATED[parts] if field.metadata else field.annotation
            TypeAdapter(kind).validate_python(value)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            message = _format_error(path, {**err, "loc": ("defaults", key, *err["loc"])})
            users = [n for n, t in targets.items() if not (isinstance(t, dict) and key in t)]
            if users:  # after the whole key path: "<file>: defaults.image.registry (used by ...): why"
                prefix = f"{path}: "
                keypath, _, why = message[len(prefix) :].partition(": ")
                message = f"{prefix}{keypath} (used by {', '.join(f'targets.{_key(u)}' for u in users)}): {why}"
            raise ConfigError(message) from None


# Variables the template sets in the build stage (builder/dockerfile/templates/Dockerfile.j2): no matrix key
# may set them too.
TEMPLATE_ENV = (
    "SOURCE_DATE_EPOCH",
    "TORCH_CUDA_ARCH_LIST",
    "MAX_JOBS",
    "NVCC_THREADS",
    "SETUPTOOLS_SCM_PRETEND_VERSION",
    "SCCACHE_DIR",
    "SCCACHE_IDLE_TIMEOUT",
    "CMAKE_ARGS",
    "PIP_NO_INDEX",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_NO_COMPILE",
    "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV",
    "PATH",
)


def _cross_checks(path: Path, t: Target) -> None:
    where = f"{path}: targets.{t.name}"
    if t.python.provider == "standalone" and t.python.standalone is None:
        raise ConfigError(f"{where}.python.standalone: required when provider is 'standalone' (url and sha256)")
    if t.python.provider == "system" and t.python.standalone is not None:
        raise ConfigError(f"{where}.python.standalone: only used with provider 'standalone'; remove it")
    # The template's own variables first, so a clash is reported at the matrix key that caused it.
    envs = [("the template", k) for k in TEMPLATE_ENV]
    envs += [("source.version_env", t.source.version_env)] if t.source.version_env else []
    for n, tp in sorted(t.source.third_party.items()):
        if (tp.env is None) == (tp.fetchcontent is None):
            raise ConfigError(
                f"{where}.source.third_party.{n}: set exactly one of env (the source's own *_SRC_DIR "
                "variable) and fetchcontent (CMake's FETCHCONTENT_SOURCE_DIR_<NAME>)"
            )
    envs += [(f"source.third_party.{n}.env", tp.env) for n, tp in t.source.third_party.items() if tp.env]
    envs += [(f"compile.env.{k}", k) for k in t.compile.env]
    seen: dict[str, str] = {}
    for key, var in envs:
        if var in seen:
            raise ConfigError(f"{where}.{key}: {var} is already set by {seen[var]}; each variable has one owner")
        seen[var] = key
    recipe = t.runtime.recipe
    if recipe and len(recipe.command) < 2:
        raise ConfigError(
            f"{where}.runtime.recipe.command: give the program and its subcommand first, "
            "e.g. vllm serve MODEL --flag ..."
        )
    if recipe and recipe.architecture and not recipe.architecture_resolver:
        raise ConfigError(
            f"{where}.runtime.recipe.architecture_resolver: required with architecture "
            "(the model registry's lookup, module:attribute)"
        )
    for problem in t.kernels.unknown_families(t.gpu):
        raise ConfigError(f"{where}.{problem}")
    if t.signing.key and not t.signing.public_key:
        raise ConfigError(f"{where}.signing.public_key: required with signing.key (verify checks against it)")
    names = [layer.name for layer in t.layers]
    for i, name in enumerate(names):
        if name in RESERVED_LAYERS or name in names[:i]:
            raise ConfigError(
                f"{where}.layers.{i}.name: {name!r} is reserved or repeated "
                f"({', '.join(RESERVED_LAYERS)} are the tool's own layers)"
            )
    for req in t.overrides:
        if "==" not in req or any(op in req.split("==", 1)[1] for op in ",<>!~"):
            raise ConfigError(f"{where}.overrides.{req}: an override forces one version: write name==version")
    if t.python.glibc.split(".")[1] not in [str(m) for m in range(17, 41)]:
        raise ConfigError(f"{where}.python.glibc: {t.python.glibc} is outside what the resolver knows (2.17-2.40)")
    if t.os_packages:
        _os_package_checks(where, t.os_packages)
    for found in (platforms.check(where, t), cpulevel.check(t)):
        if found:
            raise ConfigError(f"{where}.{found}")
    if t.torch and t.torch.version.partition("+")[2] not in ("", t.cuda.short):
        raise ConfigError(
            f"{where}.torch.version: local version {t.torch.version!r} does not match CUDA {t.cuda.version} "
            f"(expected +{t.cuda.short})"
        )


def _os_package_checks(where: str, osp: OsPackages) -> None:
    if not osp.snapshot and not osp.accept_drift:
        raise ConfigError(
            f"{where}.os_packages.archive: {osp.archive} is not a snapshot archive "
            "(https://snapshot.ubuntu.com/ubuntu/<YYYYMMDDTHHMMSSZ> or snapshot.debian.org's); "
            "use one, or set accept_drift: true"
        )
    if osp.snapshot and osp.accept_drift:
        raise ConfigError(f"{where}.os_packages.accept_drift: a snapshot archive does not drift; remove it")
    if len(set(osp.suites)) != len(osp.suites):
        raise ConfigError(f"{where}.os_packages.suites: a suite is listed twice")
    names = [p.name for p in osp.packages]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{where}.os_packages.packages.{i}.name: {name} is listed twice")


def load(path: Path) -> Matrix:
    from builder.fsutil import read_regular

    if not path.exists():
        raise ConfigError(f"{path}: no such file (pass --matrix PATH)")
    raw = read_regular(path, MAX_MATRIX_BYTES, "the build matrix")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})") from None
    return parse(text, path)
