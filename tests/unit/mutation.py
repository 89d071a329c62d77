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
    # The kernel plan (issues 49 and 52): the per-family mapping and the preflight's verdict whole;
    # in the replay, the reading and the static refusal (cmake_binary and the sandbox are I/O).
    "source.kernelmap": None,
    "source.kernelplan": (
        "_functions",
        "_check_safe",
        "_include_target",
        "_branch_gates",
        "_walk",
        "_select",
        "_replayed",
        "_prelude",
        "run_cmake",
    ),
}

# Module -> the unit test files that test it. A module listed here runs in its own copy of the
# checkout (mutants/isolated/<module>/) whose [tool.mutmut] mutates that module only and runs only these
# files: mutmut's first step runs the whole selection once to learn which tests reach which function,
# and a per-module selection keeps that step (and every mutant's run) to seconds. The copy is needed
# because mutmut discards every cached result when its test selection changes.
TESTS: dict[str, tuple[str, ...]] = {
    "records.verify": ("test_verify_rows.py", "test_records.py", "test_verify_tampers.py"),
    "records.provsign": (
        "test_provsign.py",
        "test_provsign_envelope.py",
        "test_attest.py",
        "test_verify_rows.py",
        "test_provsign_pae.py",
    ),
    "records.store": ("test_records.py", "test_store_fields.py", "test_journal_order.py", "test_store_journal.py"),
    "checks.secretscan": (
        "test_secretscan.py",
        "test_secretscan_props.py",
        "test_secretscan_scan.py",
        "test_secretscan_boundaries.py",
    ),
    "deps.oslock": ("test_oslock.py", "test_oslock_format.py", "test_oslock_refusals.py", "test_oslock_resolve.py"),
    "source.kernelmap": ("test_kernel_preflight.py", "test_kernel_plan.py", "test_track.py"),
    "source.kernelplan": ("test_kernel_plan.py", "test_kernel_preflight.py"),
}

KILLED = {1, 3, 36, 24, -24, 152, 255, 37}  # a failing test, pytest's internal error, a timeout, a type check
# Everything else that ran is a survivor: 0 (the tests passed), 5 and 33 (no test covers it).


def _globs(module: str, only: list[str] | None = None) -> list[str]:
    functions = only or SCOPE[module]
    if functions is None:
        return [f"builder.{module}.*"]
    return [f"builder.{module}.{f if f.startswith('xǁ') else 'x_' + f}__mutmut_*" for f in functions]


def _in_scope(module: str, name: str) -> bool:
    functions = SCOPE[module]
    if functions is None:
        return True
    short = name.removeprefix(f"builder.{module}.").rsplit("__mutmut_", 1)[0]
    return any(short == (f if f.startswith("xǁ") else f"x_{f}") for f in functions)


def workdir(module: str) -> Path:
    return REPO / "mutants" / "isolated" / module if module in TESTS else REPO


def _isolate(module: str) -> Path:
    """A copy of this checkout's files (committed or not, minus ignored ones) whose [tool.mutmut]
    mutates `module` only and selects TESTS[module]; an earlier run's mutants/ there is kept (the cache)."""
    work = workdir(module)
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src, dst = REPO / os.fsdecode(name), work / os.fsdecode(name)
        if src.is_file() and (not dst.exists() or dst.read_bytes() != src.read_bytes()):
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    text = (REPO / "pyproject.toml").read_text()
    selection = ", ".join(f'"tests/unit/{t}"' for t in TESTS[module])
    only = f'only_mutate = ["builder/{module.replace(".", "/")}.py"]\n'
    lines, skip = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("only_mutate ="):
            lines.append(only)
            skip = not line.rstrip().endswith("]")
        elif skip:
            skip = not line.rstrip().endswith("]")
        elif line.startswith("pytest_add_cli_args_test_selection"):
            lines.append(f"pytest_add_cli_args_test_selection = [{selection}]\n")
        else:
            lines.append(line)
    (work / "pyproject.toml").write_text("".join(lines))
    return work


def results(module: str) -> dict[str, int | None]:
    meta = workdir(module) / "mutants" / "builder" / f"{module.replace('.', '/')}.py.meta"
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


def recheck(module: str, tests: list[str], env: dict[str, str], functions: list[str] | None = None) -> int:
    """Each survivor of ``module``'s last run against ``tests`` as they are now (copied into the
    run's mutants/): one pytest per mutant, with mutmut's switch set to it. For tests written after
    a run, without a whole new run; nothing is written to mutmut's results."""
    work = workdir(module) / "mutants"
    for test in (REPO / "tests" / "unit").glob("*.py"):
        (work / "tests" / "unit" / test.name).write_bytes(test.read_bytes())
    survivors = sorted(n for n, c in results(module).items() if c is not None and c != 34 and c not in KILLED)
    if functions:  # these functions' mutants, whatever the last run said (or did not run)
        prefixes = [g.removesuffix("*") for g in _globs(module, functions)]
        survivors = sorted(n for n in results(module) if any(n.startswith(p) for p in prefixes))
    still = []
    for name in survivors:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                *tests,
                *env.get("K3_RECHECK_ARGS", "").split(),
            ],
            cwd=work,
            env={**env, "MUTANT_UNDER_TEST": name},
            capture_output=True,
        )
        print(f"{'killed  ' if run.returncode == 1 else 'SURVIVES' if run.returncode == 0 else run.returncode}  {name}")
        if run.returncode == 0:
            still.append(name)
    print(f"{module}: {len(survivors) - len(still)} of {len(survivors)} survivors killed by {' '.join(tests)}")
    return 0 if not still else 1


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
    parser.add_argument(
        "--functions",
        nargs="+",
        metavar="FUNCTION",
        help="mutate only these functions of the (single) module: name, or mutmut's xǁClassǁmethod",
    )
    parser.add_argument("--max-children", type=int, default=None, help="parallel mutmut workers")
    parser.add_argument(
        "--recheck",
        nargs="+",
        metavar="TEST",
        help="run the (single) module's survivors against these test files as they are now; nothing else",
    )
    args = parser.parse_args(argv)
    modules = args.modules or list(SCOPE)
    if args.recheck:
        env = {**os.environ, "K3_HYPOTHESIS_EXAMPLES": os.environ.get("K3_HYPOTHESIS_EXAMPLES", "10")}
        return recheck(modules[0], args.recheck, env, args.functions)
    if not args.report:
        cmd = [str(MUTMUT), "run"]
        if args.max_children:
            cmd[2:2] = ["--max-children", str(args.max_children)]
        # The generated-input tests run once per mutant: a few examples each (the fixed seed keeps
        # them the same every run); the deterministic tests do the killing.
        env = {**os.environ, "K3_HYPOTHESIS_EXAMPLES": os.environ.get("K3_HYPOTHESIS_EXAMPLES", "10")}
        rows = any(m not in TESTS or "test_verify_rows.py" in TESTS[m] for m in modules)
        with tempfile.TemporaryDirectory(prefix="k3-mutation-") as prebuilt:
            # test_verify_rows.py's clean record set and the SBOMs that validate, made once from the
            # unmutated sources (its PREBUILT): otherwise every mutant's run would make them again.
            env["K3_VERIFY_ROWS_PREBUILT"] = prebuilt
            subprocess.run(
                [sys.executable, "-c", ""]
                if not rows
                else [
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
            shared = [m for m in modules if m not in TESTS]
            if shared:
                subprocess.run([*cmd, *(g for m in shared for g in _globs(m))], cwd=REPO, check=False, env=env)
            for module in (m for m in modules if m in TESTS):
                globs = _globs(module, args.functions)
                subprocess.run([*cmd, *globs], cwd=_isolate(module), check=False, env=env)
    return report(modules, args.threshold)


if __name__ == "__main__":
    sys.exit(main())
