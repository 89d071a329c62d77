"""The pinned upstream tree, treated as untrusted: fetched into a mirror (objects fsck-checked) and
verified, exported without trusting a path check, its requirement files parsed, its third-party
sources and submodules pinned, its compiled extensions derived; and `build track`, which moves the
pin when the branch moves.

May import: config, dockerfile.
"""
