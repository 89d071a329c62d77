"""Utilities; numa_wrapper.sh beside this file is package data (vLLM: vllm/utils/)."""
