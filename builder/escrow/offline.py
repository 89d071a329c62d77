"""The second step of `build reproduce --from-escrow REF`: the downloaded escrow (builder/escrow/fetch.py)
turned into the inputs of a rebuild that reads nothing else. A fresh cache directory, given for
the run, is filled from it: the mirror of each pinned tree from its bundle (builder/source/bundles.py:
fsck-checked, the pinned commit the bundle's ref), each lock's wheelhouse entry from the escrowed
wheels, each .deb and the CPython tarball under their sha256. The rebuild then runs the normal
reproduce pipeline on that cache, sealed (nothing missing is downloaded), with the bases pulled by
digest from the escrow's repository (builder/config/inputsource.py).

Every input is taken from the checkout's record set (builder/escrow/inputs.py: the recorded build),
not from the escrow manifest alone: an escrow of another build, or one lacking an input the
record names, is refused (RecordError, exit 2) from the signed escrow manifest alone, before any
input is downloaded and with nothing written (``held``), and each escrowed file must be the
record's pin (a wheel one of its lock entry's sha256, a .deb and the CPython tarball their sha256,
the Dockerfile and locks the checkout's, each base the recorded digest). The build's own hash
checks then run on the files as they do on downloaded ones.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from builder import log
from builder.config.inputsource import InputSource, Origin
from builder.deps import buildcontext
from builder.engine.registry import split_reference
from builder.errors import RecordError
from builder.escrow import manifest as em
from builder.escrow.inputs import (
    BaseInput,
    DebInput,
    Input,
    Inventory,
    PythonInput,
    RecipeInput,
    SourceInput,
    WheelInput,
    inventory,
)
from builder.fsutil import cache_scope
from builder.source import bundles


def inputs(ref: str, download: Path, escrowed: em.EscrowManifest, target, root: Path, cache: Path) -> InputSource:
    """Fill ``cache`` (an empty directory of the run's own) from ``download``, the escrow ``ref``
    downloaded and checked; the InputSource a rebuild from it reads."""
    inv = held(ref, escrowed, target, root)
    wheels: dict[str, list[Path]] = defaultdict(list)
    with cache_scope(cache, sealed=True):
        for item in inv.inputs:
            entry = escrowed.entries[item.key]
            path = download / entry.kind.value / entry.title
            if isinstance(item, SourceInput):
                bundles.unbundle(item.url, item.commit, path, entry.pin.get("history") == "shallow")
            elif isinstance(item, WheelInput):
                wheels[item.lock].append(path)
            elif isinstance(item, DebInput):
                buildcontext.seed_deb(item.entry.sha256, path)
            elif isinstance(item, PythonInput):
                buildcontext.seed_python(item.sha256, path)
        for lock, files in sorted(wheels.items()):
            buildcontext.seed_wheelhouse(root / lock, sorted(set(files)))
    return InputSource(Origin.ESCROW, cache=cache, bases=split_reference(ref)[0], reference=ref)


def held(ref: str, escrowed: em.EscrowManifest, target, root: Path) -> Inventory:
    """The checkout's inventory, refused (RecordError) unless ``escrowed`` escrows that build and
    pins each of its inputs as the record does: asked of the signed escrow manifest alone, before
    any input is downloaded (builder/escrow/fetch.py ``download``'s ``check``). A target whose
    build stage installs apt packages is warned that the rebuild still fetches those."""
    inv = inventory(root, target)
    if escrowed.digest != inv.digest:
        raise RecordError(
            f"{ref}: escrows {escrowed.digest[:19]}, the record set names {inv.digest[:19]}; "
            "check out the commit that recorded the escrowed build"
        )
    missing = [key for key in inv.by_key() if key not in escrowed.entries]
    if missing:
        raise RecordError(
            f"{ref}: the escrow lacks {len(missing)} input(s) the record names: " + "; ".join(missing[:10])
        )
    for item in inv.inputs:
        _pinned(item, escrowed.entries[item.key])
    if target.compile.apt_packages:  # said, not hidden: the one input such a rebuild still fetches
        log.warn(
            f"{target.name}: compile.apt_packages ({', '.join(target.compile.apt_packages)}) are not locked, so "
            "not escrowed: the build stage installs them from the build base's archive, over the network"
        )
    return inv


def _pinned(item: Input, entry: em.Entry) -> None:
    """The escrowed bytes are what the record pins (a source's bundle is held to its commit when unbundled)."""
    if isinstance(item, WheelInput):
        ok = entry.digest.removeprefix("sha256:") in item.hashes
    elif isinstance(item, DebInput):
        ok = entry.digest == "sha256:" + item.entry.sha256
    elif isinstance(item, PythonInput | RecipeInput):
        ok = entry.digest == "sha256:" + item.sha256
    elif isinstance(item, BaseInput):
        ok = entry.digest == item.digest
    else:
        ok = True
    if not ok:
        raise RecordError(f"{item.key}: the escrow holds {entry.digest[:19]}, not what the record set pins; refused")
