"""Everything installed into an image, hash-locked: the Python locks (uv), the OS package lock,
the rehearsal against PyPI, the hermetic environment pip and uv run in, and the build context
(the wheelhouse downloaded and hash-checked on the host).

May import: config, dockerfile, source.
"""
