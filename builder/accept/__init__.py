"""`build accept`: a running OpenAI-compatible (vLLM) server checked step by step after the launch,
in the migration guide's order (loaded, short request, target context, prefix caching,
concurrency, agent, cross-node), each step's evidence kept as it completes, the report (JSON,
Markdown, a PNG plot) and the "Launch verification" section of the decision record.

May import: config, host.
"""
