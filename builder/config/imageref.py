"""How an image reference is read, one rule for the tool: whether it names a registry host.

Every place that chooses between the registry and the local engine (image configs for doctor,
compare and vet, the runtime base's layers before a push) and the purl both records write asks
this one function, so they never disagree about the same reference.
"""

from __future__ import annotations


def names_registry_host(ref: str) -> bool:
    """True when ``ref``'s first path component is a registry host: there is a ``/``, and the part
    before it holds a ``.`` or a ``:`` (a domain, a port) or is ``localhost``: the rule Docker's
    reference parser applies to lower-case names to tell a host from a Docker Hub namespace.
    ``k3/vllm`` and ``ubuntu:24.04`` name none (they are Docker Hub's, or the local engine's)."""
    first, slash, _ = ref.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")
