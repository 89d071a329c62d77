"""Mutation testing of the rule modules: break the rules one small change at a time (mutmut) and count
how many breaks the unit tests catch.

    .venv/bin/python -m tests.unit.mutation              # every module below (slow: tens of minutes)
    .venv/bin/python -m tests.unit.mutation lock log     # some of them
    .venv/bin/python -m tests.unit.mutation --report     # the last results again, no run

Configuration is `[tool.mutmut]` in pyproject.toml; results are cached in ./mutants/ (disposable:
delete it for a fresh run). Prints, per module, killed / checked and the kill ratio, then every
surviving mutant's name (`.venv/bin/mutmut show NAME` shows its diff). Exit 1 when the total kill
ratio is below --threshold (default 0.85). Not part of the default test run (this file is not
collected: its name does not start with test_).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MUTMUT = Path(sys.executable).with_name("mutmut")

# Module -> the functions whose mutants count (None: every function and method in the module).
# Modules are named below builder/ (config.matrix is builder/config/matrix.py). deps.lock: the two
# rules the build relies on; log: redaction; cli and commands._common: the exit mapping.
SCOPE: dict[str, tuple[str, ...] | None] = {
    "config.matrix": None,
    "config.schema": None,
    "config.patterns": None,
    "config.cascade": None,
    "deps.lock": ("check_torch_build", "parse_lock", "_split_header", "entries_of"),
    "dockerfile.render": None,
    "checks.checklist": None,
    "host.compat": None,
    "host.doctor": None,
    "log": ("register_secret", "redact"),
    "errors": None,
    "cli": ("main", "_terminate"),
    "commands._common": ("xǁOutputǁfinish",),
    "config.cudamajor": None,
    # The newest rules (issue 38): the auditor's rows, the DSSE questions, the record journal, the
    # secret scan, the OS lock. The probes (checks/probes/*.py) are not here: they run as text in
    # another interpreter (`python -c`), where mutmut's switch between mutants does not reach.
    "records.verify": None,
    "records.provsign": None,
    "records.store": None,
    "checks.secretscan": None,
    "deps.oslock": None,
}

KILLED = {1, 3, 36, 24, -24, 152, 255, 37}  # a failing test, pytest's internal error, a timeout, a type check
# Everything else that ran is a survivor: 0 (the tests passed), 5 and 33 (no test covers it).


def _globs(module: str) -> list[str]:
    functions = SCOPE[module]
    if functions is None:
        return [f"builder.{module}.*"]
    return [f"builder.{module}.{f if f.startswith('xǁ') else 'x_' + f}__mutmut_*" for f in functions]


def _in_scope(module: str, name: str) -> bool:
    functions = SCOPE[module]
    if functions is None:
        return True
    short = name.removeprefix(f"builder.{module}.").rsplit("__mutmut_", 1)[0]
    return any(short == (f if f.startswith("xǁ") else f"x_{f}") for f in functions)


def results(module: str) -> dict[str, int | None]:
    meta = REPO / "mutants" / "builder" / f"{module.replace('.', '/')}.py.meta"
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: code for name, code in codes.items() if _in_scope(module, name)}


def report(modules: list[str], threshold: float) -> int:
    total_killed = total_checked = 0
    survivors: list[str] = []
    print(f"{'module':<18} {'killed':>7} {'checked':>8} {'ratio':>7}  not run")
    for module in modules:
        codes = results(module)
        # Not run: no result yet (None) or skipped (34). A mutant no test reaches (33, 5) counts: it survives.
        checked = {n: c for n, c in codes.items() if c is not None and c != 34}
        killed = sum(c in KILLED for c in checked.values())
        survivors += sorted(n for n, c in checked.items() if c not in KILLED)
        ratio = killed / len(checked) if checked else 0.0
        print(f"{module:<18} {killed:>7} {len(checked):>8} {ratio:>7.1%}  {len(codes) - len(checked)}")
        total_killed += killed
        total_checked += len(checked)
    ratio = total_killed / total_checked if total_checked else 0.0
    print(f"{'total':<18} {total_killed:>7} {total_checked:>8} {ratio:>7.1%}")
    if survivors:
        print("\nsurviving mutants (.venv/bin/mutmut show NAME):")
        for name in survivors:
            print(f"  {name}")
    return 0 if ratio >= threshold else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.unit.mutation", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "modules",
        nargs="*",
        choices=[[], *SCOPE],
        default=[],
        metavar="MODULE",
        help=f"modules to mutate (default: all of {', '.join(SCOPE)})",
    )
    parser.add_argument("--report", action="store_true", help="print the last results; run nothing")
    parser.add_argument("--threshold", type=float, default=0.85, help="minimum total kill ratio (default 0.85)")
    parser.add_argument("--max-children", type=int, default=None, help="parallel mutmut workers")
    args = parser.parse_args(argv)
    modules = args.modules or list(SCOPE)
    if not args.report:
        cmd = [str(MUTMUT), "run", *(g for m in modules for g in _globs(m))]
        if args.max_children:
            cmd[2:2] = ["--max-children", str(args.max_children)]
        # The generated-input tests run once per mutant: a few examples each (the fixed seed keeps
        # them the same every run); the deterministic tests do the killing.
        env = {**os.environ, "K3_HYPOTHESIS_EXAMPLES": os.environ.get("K3_HYPOTHESIS_EXAMPLES", "10")}
        with tempfile.TemporaryDirectory(prefix="k3-mutation-") as prebuilt:
            # test_verify_rows.py's clean record set and the SBOMs that validate, made once from the
            # unmutated sources (its PREBUILT): otherwise every mutant's run would make them again.
            env["K3_VERIFY_ROWS_PREBUILT"] = prebuilt
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "tests/unit/test_verify_rows.py",
                ],
                cwd=REPO,
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
            )
            subprocess.run(cmd, cwd=REPO, check=False, env=env)
    return report(modules, args.threshold)


if __name__ == "__main__":
    sys.exit(main())
