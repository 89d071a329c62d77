"""The stand-in for vllm/entrypoints/launchers/cli_args.py: the `serve` arguments.

Executable in git, as vLLM's envs.py is: setuptools copies modules into the wheel without their
mode, so the package_files check must not expect the bit on a module."""

import argparse

from k3smoke.argparse_utils import FlexibleArgumentParser


def make_arg_parser(parser: FlexibleArgumentParser) -> FlexibleArgumentParser:
    """Add the serve arguments to ``parser`` and return it. Flags and their types are vLLM's, for
    the ones the K3 recipe uses; like vLLM's, --load-format and the parsers are free strings that
    the registries check, not argparse choices."""
    parser.add_argument("model_tag", type=str, nargs="?", help="The model tag to serve")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--load-format", type=str, default="auto",
                        help="A key of k3smoke.model_loader._LOAD_FORMAT_TO_MODEL_LOADER")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--enable-auto-tool-choice", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--tool-call-parser", type=str, default=None,
                        help="A name ToolParserManager.get_tool_parser resolves")
    parser.add_argument("--reasoning-parser", type=str, default="",
                        help="A name ReasoningParserManager.get_reasoning_parser resolves")
    return parser


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """Quick checks that raise before anything loads, as vLLM's do."""
    if hasattr(args, "subparser") and args.subparser != "serve":
        return
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
