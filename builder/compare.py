"""`build compare`: our image against a reference (e.g. the official CUDA 13 image), package by
package: Python distributions, OS packages, CUDA version, labels. For the decision record."""

from __future__ import annotations

from dataclasses import dataclass

from builder import compat, contract, inventory
from builder.lock import normalize



def _diff(ours: dict[str, str], theirs: dict[str, str]) -> dict[str, list]:
    return {
        "only_ours": sorted([k, ours[k]] for k in set(ours) - set(theirs)),
        "only_reference": sorted([k, theirs[k]] for k in set(theirs) - set(ours)),
        "changed": sorted([k, ours[k], theirs[k]] for k in set(ours) & set(theirs) if ours[k] != theirs[k]),
        "same": len([k for k in set(ours) & set(theirs) if ours[k] == theirs[k]]),
    }


@dataclass
class Comparison:
    ours: str
    reference: str
    sections: dict[str, dict]

    def to_json(self) -> dict:
        return {"ours": self.ours, "reference": self.reference, **self.sections}

    def text(self) -> list[str]:
        lines = [f"ours:      {self.ours}", f"reference: {self.reference}"]
        for title, d in self.sections.items():
            lines.append(f"{title}: {d['same']} same, {len(d['changed'])} changed, "
                         f"{len(d['only_ours'])} only ours, {len(d['only_reference'])} only in the reference")
            lines += [f"  ~ {k}: {a} -> {b} (reference)" for k, a, b in d["changed"]]
            lines += [f"  + {k} {v} (only ours)" for k, v in d["only_ours"]]
            lines += [f"  - {k} {v} (only in the reference)" for k, v in d["only_reference"]]
        return lines


def compare(engine, ours: str, reference: str) -> Comparison:
    a, b = inventory.read(engine, ours), inventory.read(engine, reference)
    ca, cb = engine.image_config(ours), engine.image_config(reference)

    def cuda(cfg) -> dict[str, str]:
        found = compat.image_cuda(cfg.labels, cfg.env, contract.LABEL_CUDA)
        return {"cuda": found[0]} if found else {}

    sections = {
        "python distributions": _diff({normalize(n): v for n, v in a.dists}, {normalize(n): v for n, v in b.dists}),
        "os packages": _diff({d.name: d.version for d in a.debs}, {d.name: d.version for d in b.debs}),
        "cuda": _diff(cuda(ca), cuda(cb)),
        "labels": _diff(ca.labels, cb.labels),
    }
    return Comparison(ours, reference, sections)
