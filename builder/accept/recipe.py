"""What the launch command of a target's `runtime.recipe` makes the server expect: the model it
serves (the name /v1/models shows), and the flags `build accept` can hold against what the running
process reports (prefix caching, the maximum context, tool calling)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.errors import ConfigError

# Flags of `vllm serve` that take no value (store_true) among those the recipe reading looks at;
# any other flag is taken to consume the word after it unless that word starts with "--".
_SWITCHES = frozenset(
    {
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-auto-tool-choice",
        "--trust-remote-code",
        "--enforce-eager",
        "--enable-prompt-tokens-details",
    }
)


@dataclass(frozen=True)
class Expected:
    """The launch as the recipe states it; None where the recipe says nothing."""

    command: str
    model: str | None
    served_name: str | None
    prefix_caching: bool | None
    max_model_len: int | None
    tools: bool  # --enable-auto-tool-choice with a --tool-call-parser

    @property
    def name(self) -> str | None:
        """The name /v1/models lists: --served-model-name when given, else the model."""
        return self.served_name or self.model


def _options(words: tuple[str, ...]) -> tuple[list[str], dict[str, str | None]]:
    positional: list[str] = []
    options: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            key, eq, value = word.partition("=")
            if eq:
                options[key] = value
            elif key not in _SWITCHES and i + 1 < len(words) and not words[i + 1].startswith("--"):
                options[key] = words[i + 1]
                i += 1
            else:
                options[key] = None
        else:
            positional.append(word)
        i += 1
    return positional, options


def expected(words: tuple[str, ...]) -> Expected:
    """The recipe's words (program, subcommand `serve`, then the model and flags) read as expectations."""
    rest = words[2:] if len(words) > 1 and words[1] == "serve" else words[1:]
    positional, options = _options(tuple(rest))
    model = options.get("--model") or (positional[0] if positional else None)
    caching = (
        True if "--enable-prefix-caching" in options else False if "--no-enable-prefix-caching" in options else None
    )
    length = options.get("--max-model-len")
    return Expected(
        command=" ".join(words),
        model=model,
        served_name=options.get("--served-model-name"),
        prefix_caching=caching,
        max_model_len=int(length) if length and length.isdigit() else None,
        tools="--enable-auto-tool-choice" in options and bool(options.get("--tool-call-parser")),
    )


def from_target(matrix: Path, targets: list[str] | None) -> tuple[Expected | None, str | None, str | None]:
    """(the recipe's expectations, the image's vLLM version, where it came from) from --target."""
    if not targets:
        return None, None, None
    if len(targets) > 1:
        raise ConfigError(f"accept: one target per run; --target names {', '.join(targets)}")
    from builder.config.matrix import load

    target = load(matrix).target(targets[0])
    recipe = target.runtime.recipe
    version = target.source.wheel_version if target.source.package == "vllm" else None
    return (expected(recipe.command) if recipe else None), version, (f"--target {target.name}" if version else None)
