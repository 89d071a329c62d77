"""The smoke model's tool calls: one JSON object per <tool_call>...</tool_call> section."""

import json
import re

from k3smoke.tool_parsers.abstract_tool_parser import ToolParser

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class K3SmokeToolParser(ToolParser):
    def extract_tool_calls(self, model_output: str) -> list:
        return [json.loads(body) for body in _CALL.findall(model_output)]
