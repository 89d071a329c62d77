"""The kernel plan per GPU family: each arch selection's computed archs (builder/source/kernelplan.py)
mapped onto the families the target claims (``gpu.families``), held to ``kernels.required``, and
read together with the fetch inventory into one ``SourcePlan`` (what `build plan` prints, what
`build track` compares across a bump).

The loading rules, as the GPU-code check applies them to the binaries: SASS for ``X.Ya`` loads only
on compute capability X.Y; ``X.Yf`` on X.Z for every Z >= Y (its family); a generic ``X.Y`` on the
same major from minor Y on; ``+PTX`` also on anything newer, JIT-compiled by the driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from builder.config.matrix import Target
from builder.source import kernelplan
from builder.source.cmakefile import printable
from builder.source.fetches import Fetch, inventory, listing, stale_waivers
from builder.source.kernelplan import Result, Selection
from builder.source.requirements import SourceTree

_ARCH = re.compile(r"(\d+)\.(\d+)([af]?)(\+PTX)?")


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def covers(arch: str, cc: str) -> str | None:
    """ "sass" when code built for ``arch`` loads on compute capability ``cc``, "ptx" when only its
    PTX does (JIT), else None."""
    m = _ARCH.fullmatch(arch)
    if not m:
        return None
    a_major, a_minor, suffix, ptx = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
    major, minor = _cc(cc)
    if suffix == "a":
        sass = (major, minor) == (a_major, a_minor)
    else:  # family and generic SASS: the same major, from its minor on
        sass = major == a_major and minor >= a_minor
    if sass:
        return "sass"
    return "ptx" if ptx and (major, minor) >= (a_major, a_minor) else None


@dataclass
class Kernel:
    """One arch variable of one build file: every selection of it, and what the reached ones give."""

    var: str
    file: str
    results: list[Result]
    extension: str | None

    @property
    def name(self) -> str:
        return f"{self.file}:{self.var}"

    @property
    def archs(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for r in self.results:
            seen.update(dict.fromkeys(r.archs or ()))
        return tuple(seen)

    @property
    def reached(self) -> bool:
        return any(r.reached for r in self.results)

    def lines(self) -> str:
        return ",".join(str(r.selection.line) for r in self.results if r.reached) or ",".join(
            str(r.selection.line) for r in self.results
        )

    def cuda_gates(self, reached_only: bool = False) -> list[str]:
        """The CUDA-version gates around this variable's selections (or only the reached ones), as
        written, negations kept."""
        out: dict[str, None] = {}
        for r in self.results:
            if reached_only and not r.reached:
                continue
            out.update(dict.fromkeys(g.describe() for g in r.selection.gates if g.cuda))
        return list(out)

    def on(self, cc: str) -> str:
        """What covers ``cc``: the arch ("10.3a"; code built for exactly ``cc`` first), "8.0+PTX (JIT)",
        or "" when nothing does."""
        sass = [a for a in self.archs if covers(a, cc) == "sass"]
        if sass:
            return max(sass, key=lambda a: (a.split("+")[0].rstrip("af") == cc, _cc(a.split("+")[0].rstrip("af"))))
        ptx = [a for a in self.archs if covers(a, cc) == "ptx"]
        return f"{ptx[-1]} (JIT)" if ptx else ""


@dataclass
class SourcePlan:
    """What the build files at one commit will fetch and compile for one target."""

    origin: str
    cuda_version: str
    arch_list: tuple[str, ...]
    families: tuple[str, ...]
    kernels: list[Kernel] = field(default_factory=list)
    fetches: list[Fetch] = field(default_factory=list)
    not_computed: list[str] = field(default_factory=list)  # why parts of the plan are missing
    failures: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    cmake: str = ""
    platform: str | None = None  # the platform whose arch list this is (None: a one-platform target)

    @property
    def ok(self) -> bool:
        return not self.failures

    def kernel(self, name: str) -> list[Kernel]:
        """The kernels ``name`` means: VAR (in any file) or file:VAR."""
        return [k for k in self.kernels if name in (k.var, k.name)]


def _kernels(rp: kernelplan.Replay, values: dict[int, tuple[str, ...]]) -> list[Kernel]:
    by: dict[tuple[str, str], Kernel] = {}
    for i, sel in enumerate(rp.selections):
        reached = i in values
        r = Result(sel, values.get(i), reached, "" if reached else _why_not(sel))
        k = by.setdefault((sel.file, sel.var), Kernel(sel.var, sel.file, [], sel.extension))
        k.results.append(r)
    return list(by.values())


def _why_not(sel: Selection) -> str:
    gates = [g.describe() for g in sel.gates]
    return "not reached: " + (" and ".join(gates[-2:]) if gates else "no gate (cmake did not report it)")


def _required(plan: SourcePlan, target: Target) -> None:
    for name in sorted(target.kernels.required):
        families = target.kernels.families_of(name, target.gpu)
        found = plan.kernel(name)
        if not found:
            plan.failures.append(f"kernels.required.{name}: no arch selection of that name in the build files")
            continue
        for cc in families:
            if not any(k.on(cc) for k in found):
                what = ", ".join(k.archs and " ".join(k.archs) or "not built" for k in found)
                gates = "; ".join(g for k in found for g in k.cuda_gates(reached_only=k.reached))
                gpus = printable(target.gpu.families[cc]) if target.gpu else cc
                plan.failures.append(
                    f"kernels.required.{name}: nothing loads on {cc} ({gpus})"
                    f": planned {what} ({', '.join(k.name + ':' + k.lines() for k in found)})"
                    + (f"; gates: {gates}" if gates else "")
                )


def compute(
    tree: SourceTree,
    target: Target,
    origin: str,
    sandbox: kernelplan.Sandbox,
    *,
    platform: str | None = None,
    fetch_inventory: bool = True,
) -> SourcePlan:
    """The fetch inventory and the kernel plan of ``tree`` for ``target`` (its ``cuda.arch_list``:
    ``platform``'s, when the target is narrowed to one), held to its matrix entry; upstream's CMake
    runs in ``sandbox`` (builder/engine/sandbox.py), never on the host. ``fetch_inventory=False``:
    the kernel plan alone (the inventory does not depend on the arch list)."""
    from builder.errors import SourceError

    plan = SourcePlan(
        origin=origin,
        cuda_version=target.cuda.version,
        arch_list=target.cuda.arch_list,
        families=target.gpu.capabilities if target.gpu else (),
        platform=platform,
    )
    if fetch_inventory:
        _fetch_part(plan, tree, target)
    try:
        rp, utils = kernelplan.replay(tree)
        values = kernelplan.run_cmake(rp, utils, target.cuda.version, target.cuda.arch_list, sandbox)
        plan.cmake = kernelplan.cmake_binary()[1]
    except SourceError as exc:
        plan.not_computed.append(exc.message)
        why = printable(exc.message, 300)  # the refusal's own words: the build's preflight prints no plan
        plan.failures += [
            f"kernels.required.{k}: the kernel plan cannot be computed ({why})" for k in target.kernels.required
        ]
        return plan
    plan.kernels = _kernels(rp, values)
    plan.not_computed += [f"{f}:{line}: {why}" for f, line, why in rp.skipped]
    _required(plan, target)
    return plan


def _fetch_part(plan: SourcePlan, tree: SourceTree, target: Target) -> None:
    from builder.errors import SourceError

    try:
        plan.fetches = inventory(tree, listing(tree), target)
        plan.stale = stale_waivers(plan.fetches, target)
    except SourceError as exc:  # a build file this reader refuses (unclosed, oversized): nothing is unread silently
        plan.not_computed.append(exc.message)
        plan.failures.append(f"the fetch inventory cannot be computed: {exc.message}")
    plan.failures += [f"unpinned fetch: {f.describe()}" for f in plan.fetches if f.status == "UNPINNED"]


def per_platform(
    tree: SourceTree,
    targets: list[tuple[str | None, Target]],
    origin: str,
    sandbox: kernelplan.Sandbox,
    *,
    fetch_inventory: bool = True,
) -> list[SourcePlan]:
    """One plan per platform (``targets``: each platform and the target as it sees it, as
    ``Plan.compiled_targets`` gives them), each with its own arch list; the fetch inventory, the same
    for every platform, only in the first."""
    return [
        compute(tree, t, origin, sandbox, platform=p, fetch_inventory=fetch_inventory and i == 0)
        for i, (p, t) in enumerate(targets)
    ]


def missed(plans: list[SourcePlan]) -> list[str]:
    """Every ``kernels.required`` failure of ``plans``, each prefixed with its platform when there
    are several: what the build's preflight refuses."""
    several = len(plans) > 1
    return [
        (f"{p.platform}: " if several and p.platform else "") + f
        for p in plans
        for f in p.failures
        if f.startswith("kernels.required.")
    ]


def check(
    tree: SourceTree, targets: list[tuple[str | None, Target]], origin: str, sandbox: kernelplan.Sandbox
) -> list[SourcePlan]:
    """The build's preflight: every platform's kernel plan, before any compile. A required kernel
    that misses a claimed family (or a plan that cannot be computed) raises KernelPlanFailed (exit
    1, as `build plan` exits for it), naming platform, kernel, family, file and line. A target that
    requires no kernel runs no CMake: there is nothing to hold the plan to."""
    from builder.errors import KernelPlanFailed

    if not any(t.kernels.required for _, t in targets):
        return []
    plans = per_platform(tree, targets, origin, sandbox, fetch_inventory=False)
    failures = missed(plans)
    if failures:
        name = targets[0][1].name
        raise KernelPlanFailed(
            f"{name}: the kernel plan at the pin misses what kernels.required asks, before any compile: "
            + "; ".join(printable(f, 600) for f in failures)
            + f"; `build plan --target {name}` shows the plan per platform"
        )
    return plans


def render_lines(plan: SourcePlan, target: Target) -> list[str]:
    """One plan as `build plan` prints it: its kernel rows, then the fetch inventory."""
    return kernel_lines(plan, target) + fetch_lines(plan)


def render_platforms(plans: list[SourcePlan], target: Target) -> list[str]:
    """Every platform's kernel rows, each under its own arch list, then the fetch inventory once
    (the same for every platform: the first plan's)."""
    out = [line for p in plans for line in kernel_lines(p, target)]
    return out + (fetch_lines(plans[0]) if plans else [])


def kernel_lines(plan: SourcePlan, target: Target) -> list[str]:
    """One row per arch variable, a column per claimed family."""
    fam = plan.families
    of = f" ({plan.platform})" if plan.platform else ""
    out = [
        f"kernel plan{of}: {plan.origin}; CUDA {plan.cuda_version}, arch {' '.join(plan.arch_list)}; "
        f"computed by cmake {plan.cmake or '(not run)'} -P on upstream's cmake/utils.cmake",
    ]
    if not fam:
        out.append("  (the target has no gpu block: no families claimed, kernels.required not checked)")
    width = max([len(k.name) for k in plan.kernels] + [10])
    out.append(f"    {'kernel (file:arch variable)':<{width}}  {'archs':<24} " + " ".join(f"{cc:>9}" for cc in fam))
    for k in plan.kernels:
        mark = "* " if any(k in plan.kernel(name) for name in target.kernels.required) else "  "
        archs = " ".join(k.archs) if k.reached else "(not built)"
        cells = " ".join(f"{(k.on(cc).replace(' (JIT)', '~') or '-'):>9}" for cc in fam)
        where = f"line {k.lines()}" + ("" if k.reached else "; " + "; ".join(k.cuda_gates()))
        out.append(f"  {mark}{k.name:<{width}}  {printable(archs, 60):<24} {cells}  {printable(where, 200)}")
    out.append("  (* kernels.required; X~: only PTX for X, JIT-compiled by the driver; -: no code for that family)")
    out += [f"  not computed: {printable(n, 300)}" for n in plan.not_computed]
    return out


def fetch_lines(plan: SourcePlan) -> list[str]:
    out = [f"fetches: {len(plan.fetches)} in the build files"]
    out += [f"  {f.status:<8} {f.describe()}" for f in plan.fetches]
    out += [f"  stale waiver: kernels.fetch_waivers.{printable(k)} matches no fetch" for k in plan.stale]
    return out


def to_json(plan: SourcePlan) -> dict:
    return {
        "origin": plan.origin,
        "platform": plan.platform,
        "cuda": plan.cuda_version,
        "arch_list": list(plan.arch_list),
        "families": list(plan.families),
        "cmake": plan.cmake,
        "ok": plan.ok,
        "failures": plan.failures,
        "not_computed": plan.not_computed,
        "kernels": [
            {
                "name": k.name,
                "extension": k.extension,
                "lines": k.lines(),
                "archs": list(k.archs),
                "built": k.reached,
                "cuda_gates": k.cuda_gates(),
                "families": {cc: k.on(cc) for cc in plan.families},
            }
            for k in plan.kernels
        ],
        "fetches": [f.to_json() for f in plan.fetches],
        "stale_waivers": plan.stale,
    }
