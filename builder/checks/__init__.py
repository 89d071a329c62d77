"""The image checks: one test per entry of contract.CHECKS (checklist), the pytest run
that computes their expectations (runner), the trust boundary (boundary: the image's files read
on the host, the commands bounded), the probes run inside the image, and the secret scan of the
built image.

May import: config, engine, dockerfile, source, deps.
"""
