"""`build compare`: our image against a reference (e.g. the official CUDA 13 image), package by
package: Python distributions, OS packages, CUDA version, labels. For the decision record."""

from __future__ import annotations

from dataclasses import dataclass

from builder.config import contract
from builder.config.names import normalize
from builder.host import compat
from builder.records import inventory


def _diff(ours: dict[str, str], theirs: dict[str, str]) -> dict[str, list | int]:
    return {
        "only_ours": sorted([k, ours[k]] for k in set(ours) - set(theirs)),
        "only_reference": sorted([k, theirs[k]] for k in set(theirs) - set(ours)),
        "changed": sorted([k, ours[k], theirs[k]] for k in set(ours) & set(theirs) if ours[k] != theirs[k]),
        "same": len([k for k in set(ours) & set(theirs) if ours[k] == theirs[k]]),
        "same_items": sorted([k, ours[k]] for k in set(ours) & set(theirs) if ours[k] == theirs[k]),
    }


def _versions(section: dict) -> dict[str, tuple]:
    """name -> (ours, reference) from a diffed section."""
    pairs = {k: (v, v) for k, v in section.get("same_items", [])}
    pairs.update({k: (a, b) for k, a, b in section["changed"]})
    pairs.update({k: (v, None) for k, v in section["only_ours"]})
    pairs.update({k: (None, v) for k, v in section["only_reference"]})
    return pairs


HEADLINE = ("torch", "vllm", "flashinfer-python", "nvidia-nccl", "cuda-bindings", "triton")


def side_by_side(ours: dict, reference: dict) -> dict:
    """Two `build vet` scorecards (their JSON), check by check, and whether the reference passes
    every deciding check ours passes (advisory rows aside): the bridge's exit condition."""
    theirs = {c["name"]: c for c in reference["checks"]}

    def deciding_passes(card: dict) -> set[str]:
        return {c["name"] for c in card["checks"] if c["status"] == "pass" and not c["advisory"]}

    short = sorted(deciding_passes(ours) - deciding_passes(reference))
    return {
        "ours": ours,
        "reference": reference,
        "rows": [[c["name"], c["status"], theirs.get(c["name"], {}).get("status", "-")] for c in ours["checks"]],
        "reference_short_of_ours": short,
        "reference_as_fit": bool(reference["fit"]) and not short,
    }


def _vet_text(vet: dict) -> list[str]:
    lines = [f"vet scorecards ({vet['ours']['target']}): {'check':<20} {'ours':<6} reference"]
    lines += [f"  {name:<20} {a:<6} {b}" for name, a, b in vet["rows"]]
    lines += [f"ours:      {vet['ours']['verdict']}", f"reference: {vet['reference']['verdict']}"]
    short = vet["reference_short_of_ours"]
    lines.append(
        "the reference passes every check ours passes"
        if not short
        else f"the reference fails what ours passes: {', '.join(short)}"
    )
    return lines


@dataclass
class Comparison:
    ours: str
    reference: str
    sections: dict[str, dict]
    vet: dict | None = None  # side_by_side of the two scorecards (build compare --vet)
    # What is compared of an image index: this platform's manifest only (image_config and the
    # inventory read linux/amd64 of an index); a one-image reference is compared as it is.
    platform: str = "linux/amd64"

    def to_json(self) -> dict:
        extra = {"vet": self.vet} if self.vet else {}
        head = {"ours": self.ours, "reference": self.reference, "platform": self.platform}
        return {**head, "headline": self.headline(), **self.sections, **extra}

    def headline(self) -> dict[str, list]:
        """What decides between the images: CUDA, torch, NCCL, FlashInfer, vLLM, ours vs theirs."""
        out = {"cuda": list(_versions(self.sections["cuda"]).get("cuda", (None, None)))}
        py = _versions(self.sections["python distributions"])
        for name in HEADLINE:
            out[name] = list(
                next((pair for k, pair in sorted(py.items()) if k == name or k.startswith(name + "-cu")), (None, None))
            )
        return out

    def summary(self) -> list[str]:
        lines = [f"ours:      {self.ours}", f"reference: {self.reference}"]
        lines.append(f"platform:  {self.platform} (of an image index, only this platform's manifest is compared)")
        for name, (a, b) in self.headline().items():
            lines.append(f"  {name:<18} {a or '-':<24} {b or '-'}")
        for title, d in self.sections.items():
            lines.append(
                f"{title}: {d['same']} same, {len(d['changed'])} changed, "
                f"{len(d['only_ours'])} only ours, {len(d['only_reference'])} only in the reference"
            )
        return lines + (_vet_text(self.vet) if self.vet else [])

    def markdown(self) -> str:
        """For $GITHUB_STEP_SUMMARY: the headline and the counts, details folded."""
        rows = ["| | ours | reference |", "| --- | --- | --- |"]
        rows += [f"| {n} | {a or '-'} | {b or '-'} |" for n, (a, b) in self.headline().items()]
        counts = ["| section | same | changed | only ours | only reference |", "| --- | --- | --- | --- | --- |"]
        counts += [
            f"| {t} | {d['same']} | {len(d['changed'])} | {len(d['only_ours'])} | {len(d['only_reference'])} |"
            for t, d in self.sections.items()
        ]
        details = "\n".join(self.text()[3:])
        vet = ""
        if self.vet:
            table = ["| check | ours | reference |", "| --- | --- | --- |"]
            table += [f"| {n} | {a} | {b} |" for n, a, b in self.vet["rows"]]
            vet = "\n\n" + "\n".join(_vet_text(self.vet)[-3:]) + "\n\n" + "\n".join(table)
        return (
            f"### `{self.ours}` vs `{self.reference}`\n\n"
            + "\n".join(rows)
            + "\n\n"
            + "\n".join(counts)
            + vet
            + f"\n\n<details><summary>every difference</summary>\n\n```\n{details}\n```\n</details>\n"
        )

    def text(self) -> list[str]:
        """The summary first, then every difference."""
        lines = self.summary()
        for title, d in self.sections.items():
            lines.append(f"{title}:")
            lines += [f"  ~ {k}: {a} -> {b} (reference)" for k, a, b in d["changed"]]
            lines += [f"  + {k} {v} (only ours)" for k, v in d["only_ours"]]
            lines += [f"  - {k} {v} (only in the reference)" for k, v in d["only_reference"]]
        return lines


def compare(engine, ours: str, reference: str) -> Comparison:
    from builder.engine.seam import image_config

    ca, cb = image_config(engine, ours), image_config(engine, reference)  # bad or unserved refs refused first
    a, b = inventory.read(engine, ours), inventory.read(engine, reference)

    def cuda(cfg) -> dict[str, str]:
        found = compat.image_cuda(cfg.labels, cfg.env, contract.keys_in(cfg.labels).cuda)
        return {"cuda": found[0]} if found else {}

    sections = {
        "python distributions": _diff({normalize(n): v for n, v in a.dists}, {normalize(n): v for n, v in b.dists}),
        "os packages": _diff({d.name: d.version for d in a.debs}, {d.name: d.version for d in b.debs}),
        "cuda": _diff(cuda(ca), cuda(cb)),
        "labels": _diff(ca.labels, cb.labels),
    }
    return Comparison(ours, reference, sections)
