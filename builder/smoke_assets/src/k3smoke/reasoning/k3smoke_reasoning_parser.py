"""The smoke model's reasoning: everything before </think>."""

from k3smoke.reasoning.abs_reasoning_parsers import ReasoningParser


class K3SmokeReasoningParser(ReasoningParser):
    def extract_reasoning(self, model_output: str) -> tuple:
        reasoning, sep, content = model_output.partition("</think>")
        if not sep:
            return None, model_output
        return reasoning.removeprefix("<think>").strip(), content.strip()
