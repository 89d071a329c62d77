"""K3 cu129 image pipeline: matrix.yaml -> Dockerfile -> lock -> build -> push -> record."""

__version__ = "0.1.0"
