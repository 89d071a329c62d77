"""K3 cu129 image pipeline: matrix.yaml -> Dockerfile -> lock -> build -> push -> record.

Lazy-import policy (declared here, once; tests/unit/test_structure.py holds it): pytest,
testinfra, cyclonedx and jsonschema cost about a second to import and are needed only once an
image exists (the image checks, the SBOM). ``builder.checks.runner`` and ``builder.records.attest`` import
them at the top, and every caller imports those two modules inside the function that needs them,
so start-up, `build plan --no-source`, `build render` and an "up to date" build never pay for them.
The same holds for three libraries those paths do not use: python-on-whales (~170 pydantic
models: the engine makes its Docker client on first use), GitPython (imported by the functions
that fetch or read the mirror: a plain `build plan` reads the source at the pin) and rich (the
console is made on first print).
"""

import os

__version__ = "0.1.0"

# The tool uses no pydantic plugins; without this, pydantic scans every installed distribution's
# entry points the first time a model is built (the matrix, python-on-whales): 50-120 ms of every
# command's start, measured with benchmarks/bench.py --only overhead.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
