"""The stand-in for vllm/utils/argparse_utils.py."""

import argparse
import sys


class FlexibleArgumentParser(argparse.ArgumentParser):
    """ArgumentParser that allows both underscore and dash in names (--tool_call_parser is
    --tool-call-parser), as vLLM's does."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args([_dashed(arg) for arg in args], namespace)


def _dashed(arg: str) -> str:
    if not arg.startswith("--"):
        return arg
    key, sep, value = arg.partition("=")
    return key.replace("_", "-") + sep + value
