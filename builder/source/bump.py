"""The bump report: what moving the pin from one commit to another changes in what the compile will
fetch and build, read from the build files at both commits (builder/source/kernelmap.py) before
anything compiles. `build track` writes it to its output, the job summary and the pin-bump pull
request's body; ``blocking`` (a required kernel that loses a claimed family, an unpinned fetch)
makes the workflow open that pull request as a draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from builder.config.matrix import Target
from builder.errors import BuilderError
from builder.source import extensions
from builder.source.cmakefile import printable
from builder.source.kernelmap import SourcePlan
from builder.source.requirements import SourceTree, requirement_lines, resolve_includes


@dataclass
class BumpReport:
    old: str
    new: str
    new_fetches: list[str] = field(default_factory=list)
    removed_fetches: list[str] = field(default_factory=list)
    new_gates: list[str] = field(default_factory=list)
    arch_changes: list[tuple[str, str, str, str]] = field(default_factory=list)  # kernel, family, was, now
    new_modules: list[str] = field(default_factory=list)
    removed_modules: list[str] = field(default_factory=list)
    new_requirements: list[str] = field(default_factory=list)
    blocking: list[str] = field(default_factory=list)  # why the pull request is not ready
    not_computed: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not self.blocking

    def to_json(self) -> dict:
        doc = dict(self.__dict__)
        doc["arch_changes"] = [{"kernel": k, "family": cc, "was": a, "now": b} for k, cc, a, b in self.arch_changes]
        doc["ready"] = self.ready
        return doc

    def lines(self) -> list[str]:
        """The report as plain lines (the terminal; each names its file and line where it has one)."""
        out = [f"bump report {self.old[:12]} -> {self.new[:12]}:"]
        out += [f"  BLOCKING: {b}" for b in self.blocking]
        out += [f"  new fetch: {f}" for f in self.new_fetches]
        out += [f"  removed fetch: {f}" for f in self.removed_fetches]
        out += [f"  new CUDA gate: {g}" for g in self.new_gates]
        out += [f"  archs on {cc}: {k}: {a or '-'} -> {b or '-'}" for k, cc, a, b in self.arch_changes]
        out += [f"  new extension module: {m}" for m in self.new_modules]
        out += [f"  removed extension module: {m}" for m in self.removed_modules]
        out += [f"  new requirement: {r}" for r in self.new_requirements]
        out += [f"  not computed: {n}" for n in self.not_computed]
        if len(out) == 1:
            out.append("  no change to fetches, CUDA gates, planned archs, extension modules or requirements")
        return out

    def markdown(self) -> str:
        """The report for the job summary and the pull request body (every upstream string escaped)."""
        md = [f"### What the compile will fetch and build (`{self.old[:12]}` -> `{self.new[:12]}`)", ""]
        if self.blocking:
            md += ["**Not ready:** the plan at the new commit fails:", ""]
            md += [f"- {_md(b)}" for b in self.blocking] + [""]
        sections = [
            ("New fetches", self.new_fetches),
            ("Removed fetches", self.removed_fetches),
            ("New CUDA gates", self.new_gates),
            ("New extension modules", self.new_modules),
            ("Removed extension modules", self.removed_modules),
            ("New requirements", self.new_requirements),
            ("Not computed", self.not_computed),
        ]
        for title, items in sections:
            if items:
                md += [f"**{title}** ({len(items)})", ""] + [f"- {_md(i)}" for i in items[:100]] + [""]
        if self.arch_changes:
            md += [
                "**Planned archs changed, per family**",
                "",
                "| kernel | family | was | now |",
                "| --- | --- | --- | --- |",
            ]
            md += [
                f"| {_md(k)} | {cc} | {_md(a) or '-'} | {_md(b) or '-'} |" for k, cc, a, b in self.arch_changes[:200]
            ]
            md.append("")
        if len(md) == 2:
            md += ["No change to fetches, CUDA gates, planned archs, extension modules or requirements.", ""]
        return "\n".join(md)


def _md(text: str) -> str:
    """Upstream text as plain Markdown: markup escaped, no mentions."""
    out = printable(text, 300)
    for ch in "\\*_[]<>#~":
        out = out.replace(ch, "\\" + ch)
    return out.replace("@", "@\u200b")


def _fetch_id(f) -> tuple[str, str, str, str]:
    return (f.file, f.kind, f.name, f.detail)


def _gates(plan: SourcePlan) -> dict[tuple[str, str], str]:
    """(kernel, gate without its line) -> the gate as shown, for every CUDA gate of every selection."""
    out = {}
    for k in plan.kernels:
        for r in k.results:
            for g in r.selection.gates:
                if g.cuda:
                    out[(k.name, ("NOT " if g.negated else "") + " ".join(g.condition.split()))] = (
                        f"{k.name} (line {r.selection.line}): {g.describe()}"
                    )
    return out


def _modules(tree: SourceTree, target: Target) -> set[str]:
    found: set[str] = set()
    for path in target.source.extensions.declared_in:
        data = tree.read(path)
        try:
            found |= {d.module for d in extensions.declared(data, path)} if data is not None else set()
        except BuilderError:  # an unparseable setup.py is the lock's and the build's to refuse
            continue
    return found


def _requirements(tree: SourceTree, target: Target) -> set[str]:
    out: set[str] = set()
    paths = (*target.source.requirements, *target.source.build_requirements)
    try:
        files = resolve_includes(tree, paths)
    except BuilderError:  # a broken requirement file is `build lock`'s to refuse, not the report's
        return out
    for path, data in files.items():
        out |= {" ".join(r.value.split()) for r in requirement_lines(path, data) if r.kind == "requirement"}
    return out


def compare(old: SourcePlan, new: SourcePlan, trees: tuple[SourceTree, SourceTree], target: Target) -> BumpReport:
    report = BumpReport(old.origin, new.origin)
    was = {_fetch_id(f): f for f in old.fetches}
    now = {_fetch_id(f): f for f in new.fetches}
    report.new_fetches = [f"{now[k].status}: {now[k].describe()}" for k in now if k not in was]
    report.removed_fetches = [was[k].describe() for k in was if k not in now]
    old_gates, new_gates = _gates(old), _gates(new)
    report.new_gates = [text for key, text in new_gates.items() if key not in old_gates]
    before = {k.name: k for k in old.kernels}
    # An edit that drops the branch below CUDA 13 adds no condition, yet gates the kernel out.
    report.new_gates += [
        f"{k.name} (line {k.lines()}): no longer built under CUDA {new.cuda_version}: " + "; ".join(k.cuda_gates())
        for k in new.kernels
        if not k.reached and k.name in before and before[k.name].reached
    ]
    for k in new.kernels:
        prev = before.pop(k.name, None)
        for cc in new.families:
            a, b = prev.on(cc) if prev else "", k.on(cc)
            if a != b:
                report.arch_changes.append((k.name, cc, a, b))
    for gone in before.values():
        report.arch_changes += [(gone.name, cc, gone.on(cc), "") for cc in new.families if gone.on(cc)]
    old_mods, new_mods = _modules(trees[0], target), _modules(trees[1], target)
    report.new_modules = sorted(new_mods - old_mods)
    report.removed_modules = sorted(old_mods - new_mods)
    report.new_requirements = sorted(_requirements(trees[1], target) - _requirements(trees[0], target))
    report.blocking = list(new.failures)
    report.not_computed = list(new.not_computed)
    return report
