"""`build vet`: the image checks on an image this pipeline did not build (issue 37), as a scorecard.

The expectations come from the matrix target alone (CUDA version, GPU families and driver floor,
ops, recipe, pins, waivers), never from a lock, a record or our labels. The checks that need those
(``contract.VET_NOT_APPLICABLE``) are marked skipped before they run and shown as rows "n/a" with
the reason; a check the target gives nothing to check (no pins, no ``gpu`` block) is "n/a" too, with
its own reason. The advisory checks (``contract.VET_ADVISORY``) run and are shown, but only the
others decide whether the image is fit for the target's hosts.

The whole-image checks scan the foreign image's own Python prefix (``prefix_of``): ``sys.prefix``
of its interpreter, or its site-packages when that interpreter is the system's (/usr).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from builder.checks import boundary, probes, runner
from builder.config import contract
from builder.config.matrix import Target
from builder.deps.lock import normalize
from builder.engine.buildx import Engine
from builder.errors import BuildError
from builder.source import extensions
from builder.source.pinned import PinnedSource

NOT_APPLICABLE = "not applicable to a foreign image"
STATUSES = ("pass", "fail", "n/a")

# Printed by the image's own interpreter, isolated as the probes run it (no .pth, no sitecustomize).
_PREFIX_SCRIPT = (
    "import json, sysconfig\nprint(json.dumps({'prefix': _isys.prefix, 'purelib': sysconfig.get_paths()['purelib']}))\n"
)
_PYTHON = 'exec "$(command -v python3 || command -v python)" -I -S -c "$0"'


def prefix_of(engine: Engine, ref: str) -> str:
    """Where the image's Python environment lives: its ``sys.prefix``, unless that is the system's
    (/usr, /usr/local or /), whose packages are then its site-packages (upstream vLLM installs into
    /usr/local/lib/python3.12/dist-packages with uv --system); scanning all of /usr would judge the
    OS and the CUDA toolkit as if they were the application."""
    script = (probes.HERE / "_isolated.py").read_text() + "\n" + _PREFIX_SCRIPT
    out = engine.containers.run_capture(ref, "sh", ["-c", _PYTHON, script])
    try:
        found = json.loads(out.strip().splitlines()[-1])
        prefix, purelib = str(found["prefix"]), str(found["purelib"])
    except (ValueError, IndexError, KeyError, TypeError):
        raise BuildError(f"{ref}: cannot read its Python prefix (no Python in the image?): {out[-200:]!r}") from None
    return purelib if prefix.rstrip("/") in ("", "/usr", "/usr/local") else prefix


def expectations(
    target: Target, prefix: str, pinned: PinnedSource | None, today: dt.date | None = None
) -> runner.Expectations:
    """What a foreign image must hold for ``target``'s hosts: the matrix's values, no lock, no
    record, no labels. Without ``pinned`` the compiled modules are those the matrix adds."""
    policy = target.source.extensions
    if pinned is not None:
        modules = extensions.plan({path: pinned.read(path) for path in policy.declared_in}, policy)
    else:
        modules = extensions.ModulePlan(tuple(sorted(policy.add)), (), tuple(sorted(policy.waive.items())))
    day = today or dt.date.today()
    return runner.Expectations(
        **runner.target_fields(target),
        modules=modules,
        labels={},
        build_date=day,
        today=day,
        lock={},
        overrides=frozenset(normalize(re.split(r"[<>=!~;\[ ]", r)[0]) for r in target.overrides),
        app_prefix=prefix,
    )


class NotApplicable:
    """A pytest plugin: the checks named in ``reasons`` are skipped before they run, the skip
    saying "n/a: not applicable to a foreign image: <reason>"."""

    def __init__(self, reasons: dict[str, str]) -> None:
        self.reasons = reasons

    def skip_reason(self, check: str) -> str | None:
        why = self.reasons.get(check)
        return f"n/a: {NOT_APPLICABLE}: {why}" if why else None

    def pytest_collection_modifyitems(self, items) -> None:
        import pytest

        for item in items:
            reason = self.skip_reason(item.name.removeprefix("test_"))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # one of STATUSES
    finding: str
    advisory: bool = False  # shown, does not decide fitness (contract.VET_ADVISORY)

    @property
    def decides(self) -> bool:
        return self.status != "n/a" and not self.advisory

    @property
    def basis(self) -> str:
        """Who answered: "host", "cross-checked" or "image" (boundary.Basis: whether the image could influence it)."""
        return boundary.basis(self.check).value


@dataclass
class Scorecard:
    image: str  # the reference as given
    pinned: str  # what was checked: name@sha256:..., or the local image ID
    target: str
    prefix: str
    rows: list[Row]
    warnings: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # gpu (derived driver floor), gpu_coverage
    prefix_given: bool = False  # --prefix; else the image's interpreter named it (prefix_of)

    @property
    def fit(self) -> bool:
        """No deciding check failed, and at least one ran and passed."""
        deciding = [r for r in self.rows if r.decides]
        return bool(deciding) and all(r.status == "pass" for r in deciding)

    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status == "fail" and not r.advisory]

    def passed(self) -> set[str]:
        return {r.check for r in self.rows if r.status == "pass"}

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.rows) for s in STATUSES}

    def verdict(self) -> str:
        c = self.counts()
        head = f"fit for {self.target}'s hosts" if self.fit else f"NOT fit for {self.target}'s hosts"
        why = f": {', '.join(r.check for r in self.failed())} failed" if self.failed() else ""
        return f"{head}{why} ({c['pass']} pass, {c['fail']} fail, {c['n/a']} n/a)"

    def to_json(self) -> dict:
        return {
            "image": self.image,
            "pinned": self.pinned,
            "target": self.target,
            "prefix": self.prefix,
            "fit": self.fit,
            "verdict": self.verdict(),
            "counts": self.counts(),
            "checks": [
                {"name": r.check, "status": r.status, "advisory": r.advisory, "basis": r.basis, "finding": r.finding}
                for r in self.rows
            ],
            "warnings": list(self.warnings),
            "facts": self.facts,
        }

    def text(self) -> list[str]:
        lines = [f"vet {self.pinned} for {self.target} (prefix {self.prefix})"]
        for r in self.rows:
            said = " ".join(x for x in (r.finding, "(advisory)" if r.advisory else "") if x)
            lines.append(f"  {r.status:<5} {r.check:<20} {said}".rstrip())
        lines += [f"  note: {w}" for w in self.warnings]
        return [*lines, *self.influence(), *self.gpu_lines(), self.verdict()]

    def influence(self) -> list[str]:
        """Which rows the image could influence (docs/checks.md#who-answers-each-row), the ones that ran."""
        ran = [r for r in self.rows if r.status != "n/a"]
        said = {
            "host": "read on the host, the image cannot influence",
            "cross-checked": "the image's interpreter, isolated, held to the host's reading",
            "image": "answered by the image's own programs, it could influence",
        }
        lines = []
        for basis, what in said.items():
            names = [r.check for r in ran if r.basis == basis]
            if names:
                lines.append(f"  {what}: {', '.join(names)}")
        if not self.prefix_given:  # the host's rows read under it: what lies outside is not read
            lines.append(
                f"  the prefix {self.prefix} is the image's interpreter's answer (sys.prefix); --prefix fixes it"
            )
        return lines

    def gpu_lines(self) -> list[str]:
        """The GPU-code inventory the checks proved: the derived driver floor, coverage per family."""
        gpu, coverage = self.facts.get("gpu"), self.facts.get("gpu_coverage") or {}
        lines = []
        if gpu:
            floor, cuda = gpu.get("derived_floor") or "none (no GPU code)", gpu.get("derived_cuda")
            lines.append(f"  gpu: derived driver floor {floor} (CUDA {cuda}), claimed {gpu.get('driver_floor')}")
        for ext, table in sorted(coverage.items()):
            lines.append(f"  coverage {ext}: " + ", ".join(f"{cc} {how}" for cc, how in sorted(table.items())))
        return lines

    def markdown(self) -> str:
        """A table for $GITHUB_STEP_SUMMARY and the decision record; findings cut to one cell."""
        rows = ["| check | status | finding | answered by |", "| --- | --- | --- | --- |"]
        for r in self.rows:
            cell = _cell(r.finding) + (" *(advisory: does not decide)*" if r.advisory else "")
            rows.append(f"| {r.check} | {'**FAIL**' if r.status == 'fail' else r.status} | {cell} | {r.basis} |")
        gpu = "".join(f"- {line.strip()}\n" for line in self.gpu_lines())
        head = f"### vet `{self.pinned}` for {self.target}\n\n**{self.verdict()}**\n\n"
        return head + (gpu + "\n" if gpu else "") + "\n".join(rows) + "\n"


def _cell(text: str, limit: int = 400) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def scorecard(report: runner.Report, *, image: str, target: str, prefix: str) -> Scorecard:
    """The report of a vet run as rows: a skipped check is "n/a" with its reason."""
    rows = []
    for r in report.results:
        status = "pass" if r.passed else "n/a" if r.skipped else "fail"
        finding = r.message.removeprefix("n/a: ") if r.skipped else r.message
        rows.append(Row(r.name, status, finding, r.name in contract.VET_ADVISORY))
    order = list(contract.CHECKS)
    rows.sort(key=lambda row: order.index(row.check) if row.check in order else len(order))
    return Scorecard(image, report.image, target, prefix, rows, list(report.warnings), dict(report.facts))


def not_applicable(pinned: PinnedSource | None, why_no_source: str = "") -> dict[str, str]:
    """The checks marked n/a for a foreign image: the contract's, and compiled_modules when the
    pinned source (which declares the modules) is out of reach and the matrix adds none."""
    reasons = dict(contract.VET_NOT_APPLICABLE)
    if pinned is None:
        reasons["compiled_modules"] = f"the pinned source declares the modules and is out of reach ({why_no_source})"
    return reasons


def vet(
    engine: Engine,
    ref: str,
    pinned_ref: str,
    target: Target,
    *,
    source: PinnedSource | None,
    out_dir: Path,
    prefix: str | None = None,
    why_no_source: str = "",
) -> Scorecard:
    """Run the checks that apply to a foreign image on ``pinned_ref`` (``ref`` pinned by digest)."""
    where = prefix or prefix_of(engine, pinned_ref)
    expect = expectations(target, where, source)
    reasons = not_applicable(source, why_no_source)
    if source is None and expect.modules.required:
        reasons.pop("compiled_modules")  # the matrix's own list is enough to check
    report = runner.run(
        engine, pinned_ref, expect, out_dir / contract.CHECK_REPORT_NAME, plugins=(NotApplicable(reasons),)
    )
    card = scorecard(report, image=ref, target=target.name, prefix=where)
    card.prefix_given = prefix is not None
    if source is None and expect.modules.required:
        card.warnings.insert(
            0,
            f"compiled_modules: only the {len(expect.modules.required)} module(s) the matrix adds were checked; "
            f"the ones the pinned source declares are unknown ({why_no_source})",
        )
    return card
