"""The image checks: one test per entry of contract.CHECKS (checklist), the pytest/testinfra run
that computes their expectations (runner), the probes run inside the image, and the secret
scan of the built image.

May import: config, engine, dockerfile, source, deps.
"""
