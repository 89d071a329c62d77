"""The one options cascade: where each setting of a build comes from, in one order (first wins).

    flags > environment > target > defaults: > built-in

- **flags**: the command line, only where a flag exists (``--max-jobs``, ``--compile-cache``...);
- **environment**: ``$K3_REGISTRY``, ``$K3_REPOSITORY``, ``$K3_TAG``, ``$K3_SIGNING_IDENTITY``,
  ``$K3_SIGNING_ISSUER``, ``$K3_BUILDER_ID`` and ``$K3_BUILD_TYPE`` set matrix keys
  (``ENV_OVERRIDES``, like cibuildwheel's CIBW_* variables: a CI job pushes where its repository
  variables say without editing the matrix), and
  ``$K3_COMPILE_CACHE`` stands in for ``--compile-cache`` (``FLAG_ENV``);
- **target**: the target's own entry under ``targets:``;
- **defaults**: the matrix's ``defaults:`` block, merged key by key under each target;
- **built-in**: the defaults written in the models (``schema``) and in ``BuildOptions``.

Settings that meet the matrix after parsing have their order here too: ``max_jobs`` (--max-jobs >
compile.max_jobs > derived from the builder), ``compile_cache`` (--compile-cache or
$K3_COMPILE_CACHE > compile.cache_url), and ``environment_or_target`` for the attestation's
identities ($K3_BUILDER_ID > signing.builder_id, $K3_BUILD_TYPE > signing.build_type,
$K3_SIGNING_IDENTITY/$K3_SIGNING_ISSUER > signing.identity/issuer).

Environment values go through the same validation as the file, and an error names the variable
(``(from $K3_REGISTRY)``). The layers below the flags meet in ``target_entry`` before the schema
reads the file; the flags and ``$K3_COMPILE_CACHE`` meet in ``build_options``. Past those two the
rest of the code sees only the resolved, frozen objects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builder.config.options import BuildOptions, parse_secrets
from builder.config.schema import Target

ORDER = ("flags", "environment", "target", "defaults", "built-in")

# Matrix keys a variable sets in every target: variable -> (section, key).
ENV_OVERRIDES = {
    "K3_REGISTRY": ("image", "registry"),
    "K3_REPOSITORY": ("image", "repository"),
    "K3_TAG": ("image", "tag"),  # CI pushes candidates under their own tag (issue: promotion)
    "K3_SIGNING_IDENTITY": ("signing", "identity"),
    "K3_SIGNING_ISSUER": ("signing", "issuer"),
    # The provenance's identities: validated as the keys they stand for (an https:// URL), so a
    # bad value is exit 2 naming the variable, not a provenance that says anything (issue 32).
    "K3_BUILDER_ID": ("signing", "builder_id"),
    "K3_BUILD_TYPE": ("signing", "build_type"),
}
# Flags a variable stands in for when the flag is not given: flag -> variable.
FLAG_ENV = {"--compile-cache": "K3_COMPILE_CACHE"}


@dataclass(frozen=True)
class Setting:
    """A resolved value and the layer it came from (one of ORDER), with the flag or variable."""

    value: Any
    layer: str
    name: str = ""


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


# --- the matrix: environment > target > defaults: (built-in: the schema's own defaults) ----------


def environment_overrides(environ: Mapping[str, str] | None = None) -> dict:
    """The matrix keys the environment sets, as a mapping to merge over each target's entry."""
    out: dict = {}
    for var, (section, key) in ENV_OVERRIDES.items():
        value = _environ(environ).get(var)
        if value:
            out.setdefault(section, {})[key] = value
    return out


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: mappings merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def target_entry(name: str, entry: Any, defaults: dict, overrides: dict) -> Any:
    """One target's entry with the layers below the flags applied: ``defaults:`` under the entry,
    the environment's ``overrides`` over it, and its name from its key (unless the entry sets one,
    which the matrix refuses). An entry that is not a mapping is left for the schema to report."""
    if not isinstance(entry, dict):
        return entry
    merged = deep_merge(deep_merge(defaults, entry), overrides)
    return {"name": name, **merged} if "name" not in merged else merged


def env_source(keys: tuple, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable that set a target's key (``keys`` below the target, e.g. ("image", "registry")),
    or None when the environment did not set it."""
    for var, path in ENV_OVERRIDES.items():
        if _environ(environ).get(var) and tuple(keys[:2]) == path:
            return var
    return None


def has(node: Any, keys: tuple) -> bool:
    """Whether ``keys`` lead somewhere in ``node``: mapping keys, list positions (integers only)."""
    for key in keys:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return False
    return True


def from_defaults(keys: tuple, entry: Any, defaults: dict) -> bool:
    """Whether a target got the key at ``keys`` from ``defaults:``: its entry lacks the top-level
    key that ``defaults:`` has."""
    return isinstance(entry, dict) and not has(entry, keys[:1]) and has(defaults, keys[:1])


# --- how one build runs: flags > environment > built-in (BuildOptions) ---------------------------


def flag_or_env(flag: str, value: Any, environ: Mapping[str, str] | None = None) -> Setting:
    """A flag's value, else its variable's (FLAG_ENV), else None from the built-in layer."""
    if value:
        return Setting(value, "flags", flag)
    var = FLAG_ENV.get(flag)
    if var and _environ(environ).get(var):
        return Setting(_environ(environ)[var], "environment", f"${var}")
    return Setting(None, "built-in")


def build_options(
    flags: Mapping[str, Any], secrets: set[str], environ: Mapping[str, str] | None = None
) -> BuildOptions:
    """The BuildOptions of one command line (``flags``: argparse's destinations), the ``secrets``
    being the ids the targets list in compile.secrets. BuildOptions checks the ranges."""
    cache = flag_or_env("--compile-cache", flags["compile_cache"], environ)
    return BuildOptions(
        no_cache=flags["no_cache"],
        builder=flags["builder"],
        max_jobs=flags["max_jobs"],
        run_checks=not flags["no_checks"],
        force=flags["force"],
        cache_from=tuple(flags["cache_from"]),
        cache_to=flags["cache_to"],
        secrets=parse_secrets(flags["secret"], secrets),
        jobs=flags["jobs"],
        keep_context=flags["keep_context"],
        compile_cache=cache.value,
        compile_cache_from_env=cache.layer == "environment",
        allow_emulated=bool(flags.get("allow_emulated")),
        platforms=tuple(flags.get("platform") or ()),
    )


# --- settings read after parsing: flags > environment > target (the pipeline and the records) ----


def max_jobs(flag: int | None, target: Target) -> Setting:
    """MAX_JOBS: --max-jobs (``flag``, BuildOptions.max_jobs), else compile.max_jobs, else None (the
    pipeline derives it from the builder's cores and memory: built-in)."""
    if flag:
        return Setting(flag, "flags", "--max-jobs")
    if target.compile.max_jobs:
        return Setting(target.compile.max_jobs, "target", "compile.max_jobs")
    return Setting(None, "built-in")


def compile_cache(options: BuildOptions, target: Target) -> Setting:
    """The remote compile cache's backend: --compile-cache or $K3_COMPILE_CACHE (build_options
    resolved those two), else the target's compile.cache_url, else none."""
    if options.compile_cache:
        if options.compile_cache_from_env:
            return Setting(options.compile_cache, "environment", f"${FLAG_ENV['--compile-cache']}")
        return Setting(options.compile_cache, "flags", "--compile-cache")
    if target.compile.cache_url:
        return Setting(target.compile.cache_url, "target", "compile.cache_url")
    return Setting(None, "built-in")


def environment_or_target(var: str, value: str | None, environ: Mapping[str, str] | None = None) -> Setting:
    """A variable's value (an empty one counts as unset), else the target's ``value``, else None
    (the caller's built-in default). Values are returned as given: the caller trims if it must."""
    found = _environ(environ).get(var)
    if found:
        return Setting(found, "environment", f"${var}")
    if value:
        return Setting(value, "target")
    return Setting(None, "built-in")
