"""`python -m k3smoke` (and the `k3smoke` script), shaped like `vllm` (vllm/entrypoints/cli):
without arguments it prints what the compiled kernels compute (the image's ENTRYPOINT);
`serve MODEL [flags]` parses the flags with vLLM's parser shape, validates them, resolves the
load format, parsers and architecture through the registries and prints one line. It starts
nothing: the smoke has no engine."""

import sys

from k3smoke.argparse_utils import FlexibleArgumentParser
from k3smoke.cli_args import make_arg_parser, validate_parsed_serve_args


def _parser() -> FlexibleArgumentParser:
    parser = FlexibleArgumentParser(prog="k3smoke")
    subparsers = parser.add_subparsers(dest="subparser")
    make_arg_parser(subparsers.add_parser("serve", usage="k3smoke serve [model_tag] [options]"))
    return parser


def _resolve(args) -> str:
    """What serving ``args`` would use, as one line; KeyError/ValueError name the unknown value."""
    from k3smoke.model_loader import get_model_loader
    from k3smoke.models import ModelRegistry
    from k3smoke.models.registry import MODEL_ARCHITECTURES
    from k3smoke.reasoning import ReasoningParserManager
    from k3smoke.tool_parsers import ToolParserManager

    # The parsers first, as vLLM's API server checks them before it loads a model.
    parts = [f"load format {args.load_format} ({type(get_model_loader(args.load_format)).__name__})"]
    if args.tool_call_parser:
        parts.append(f"tool-call parser {args.tool_call_parser} "
                     f"({ToolParserManager.get_tool_parser(args.tool_call_parser).__name__})")
    if args.reasoning_parser:
        parts.append(f"reasoning parser {args.reasoning_parser} "
                     f"({ReasoningParserManager.get_reasoning_parser(args.reasoning_parser).__name__})")
    if args.model_tag not in MODEL_ARCHITECTURES:
        raise KeyError(f"model '{args.model_tag}' not found. Known: {', '.join(sorted(MODEL_ARCHITECTURES))}")
    arch = MODEL_ARCHITECTURES[args.model_tag][0]
    if ModelRegistry._try_load_model_cls(arch) is None:
        raise KeyError(f"architecture {arch} of {args.model_tag} does not resolve through ModelRegistry")
    parts = [arch, *parts, f"tensor parallel {args.tensor_parallel_size}"]
    return f"k3smoke serve {args.model_tag}: " + ", ".join(parts) + "; no engine in the smoke"


def _banner() -> str:
    import k3smoke
    from k3smoke import _C

    return (f"k3smoke {k3smoke.__version__}: rms([3, 4]) = {k3smoke.rms([3, 4]):.4f}, "
            f"driver {_C.driver_version()}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if args.subparser is None:
        print(_banner())
        return 0
    try:
        if args.model_tag is None:
            raise ValueError("serve needs a model: k3smoke serve MODEL [options]")
        validate_parsed_serve_args(args)
        print(_resolve(args))
    except (KeyError, TypeError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    return 0
