"""What differs between two images in a registry: config fields, then layer by layer and file by
file (path, type, mode, uid/gid, size, content sha256, mtime, link target). Pure Python over the
registry's blobs, for `build reproduce`."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from typing import Any

MAX_LINES = 200


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: []}
    return {prefix: value}


def config_diff(a: dict, b: dict) -> list[str]:
    fa, fb = _flatten(a), _flatten(b)
    return [
        f"config {key}: {fa.get(key, '(absent)')!r} != {fb.get(key, '(absent)')!r}"
        for key in sorted(set(fa) | set(fb))
        if fa.get(key) != fb.get(key)
    ]


def _entries(blob: bytes) -> dict[str, tuple]:
    data = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            digest = ""
            if m.isfile():
                fh = tar.extractfile(m)
                digest = hashlib.sha256(fh.read() if fh else b"").hexdigest()
            kind = (
                "file"
                if m.isfile()
                else "dir"
                if m.isdir()
                else "symlink"
                if m.issym()
                else "hardlink"
                if m.islnk()
                else "other"
            )
            out[m.name] = (
                ("type", kind),
                ("mode", oct(m.mode)),
                ("uid/gid", f"{m.uid}/{m.gid}"),
                ("size", m.size),
                ("sha256", digest[:16]),
                ("mtime", int(m.mtime)),
                ("link", m.linkname),
            )
    return out


def layer_diff(index: int, a: bytes, b: bytes) -> list[str]:
    ea, eb = _entries(a), _entries(b)
    lines = []
    for path in sorted(set(ea) | set(eb)):
        if path not in ea:
            lines.append(f"layer {index} {path}: only in the rebuild")
        elif path not in eb:
            lines.append(f"layer {index} {path}: only in the recorded image")
        elif ea[path] != eb[path]:
            fields = ", ".join(
                f"{k} {va!r} != {vb!r}" for (k, va), (_, vb) in zip(ea[path], eb[path], strict=False) if va != vb
            )
            lines.append(f"layer {index} {path}: {fields}")
    return lines


def diff_images(engine, name: str, recorded: str, rebuilt: str) -> list[str]:
    """Lines describing every difference between ``name@recorded`` and ``name@rebuilt``."""
    ma, mb = engine.registry.raw_manifest(name, recorded), engine.registry.raw_manifest(name, rebuilt)
    if ma is None or mb is None:
        return [f"the registry does not serve {name}@{recorded if ma is None else rebuilt}"]
    da, db = ma.doc, mb.doc
    lines = [f"manifest {recorded} (recorded) != {rebuilt} (rebuild)"]
    ca = json.loads(engine.registry.blob(name, da["config"]["digest"]))
    cb = json.loads(engine.registry.blob(name, db["config"]["digest"]))
    lines += config_diff(ca, cb)
    la, lb = da.get("layers", []), db.get("layers", [])
    if len(la) != len(lb):
        lines.append(f"layer count {len(la)} != {len(lb)}")
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x["digest"] == y["digest"]:
            continue
        lines.append(f"layer {i}: {x['digest'][:19]} != {y['digest'][:19]}")
        lines += layer_diff(i, engine.registry.blob(name, x["digest"]), engine.registry.blob(name, y["digest"]))
        if len(lines) > MAX_LINES:
            break
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES] + [f"... cut at {MAX_LINES} lines"]
    return lines
