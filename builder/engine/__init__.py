"""The one engine seam and what sits behind it: buildx builds, containers of built images, the
OCI registry client and its authentication, the signals held back around container creation,
and BuildKit's log.

May import: config.
"""
