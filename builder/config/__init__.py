"""What a build is asked to do, read and validated before anything runs: the image-facing
contract (labels, record files, paths), matrix.yaml's typed schema (schema, its strict values in
patterns, ospackages) and its loader (matrix), the one options cascade (flags > environment >
target > defaults: > built-in, in cascade), the build options, and the naming rules every
comparison shares (PEP 503 names, the CUDA major of a distribution).

May import: nothing above the foundation (errors, log, fsutil).
"""
