"""The decision record as Markdown: what `build doctor --record` writes beside its JSON, for a
person to read and complete (the lines marked TO FILL)."""

from __future__ import annotations

TO_FILL = "TO FILL (a person)"
BLANKS = {
    "decided_by": "who decided",
    "approved_by": "the platform lead who approved",
    "affected": "teams and services that run on these hosts",
    "driver_window": "when the hosts can move to driver r580+ (maintenance window)",
    "previous_image": "the image to roll back to",
}


def _gpu_summary(gpus: list[str]) -> str:
    counted = {name: gpus.count(name) for name in dict.fromkeys(gpus)}
    return ", ".join(f"{n} x {name}" if n > 1 else name for name, n in counted.items()) or "none listed"


def _blank(value, name: str) -> str:
    return f"**{TO_FILL}: {BLANKS[name]}**" if value is None else str(value)


def decision_markdown(doc: dict) -> str:
    lines = [
        f"# Decision record: {doc['image']}",
        "",
        f"Created {doc['created']} by `build doctor --record`. "
        f"Lines marked **{TO_FILL}** are for a person to complete.",
        "",
        *_evidence_lines(doc["fault_evidence"]),
        "",
        "## Paths",
        "",
    ]
    lines += [f"- {'**chosen**' if o['chosen'] else 'not chosen'}: {o['path']}: {o['why']}" for o in doc["paths"]]
    lines += [
        "",
        f"Chosen: {doc['chosen']} (doctor's recommendation; **{TO_FILL}: confirm or change it**)"
        if doc["chosen"]
        else f"Chosen: none yet: {doc['chosen_why']}",
        "",
        *_verification_lines(doc["verification"]),
        "",
        *_vet_lines(doc.get("vet") or []),
        *_launch_lines(doc.get("launch") or []),
        *_exit_lines(doc["exit_conditions"]),
        "",
        "## Rollback",
        "",
        f"- {doc['rollback']}",
        "",
        "## Next review",
        "",
        f"- {doc['next_review']}",
        "",
        "## For a person",
        "",
    ]
    lines += [f"- {BLANKS[name]}: {_blank(value, name)}" for name, value in doc["to_fill"].items()]
    return "\n".join(lines) + "\n"


def _evidence_lines(ev: dict) -> list[str]:
    host, archive = ev["host"], ev["evidence_archive"]
    return [
        "## Fault evidence",
        "",
        f"- verdict: {ev['verdict']}",
        f"- route: {ev['route']}",
        f"- host: driver {host['host_driver']} ({host['host_branch']}, {host['platform']}), CUDA "
        f"{host['host_cuda'] or 'not reported'}, GPUs: {_gpu_summary(host['gpus'])}"
        f"{' (data-center)' if host['data_center'] else ''}",
        f"- host kind: {host['host_kind']}; CPU: {_cpu_text(host['cpu'])}; image platforms: "
        f"{', '.join(host['cpu']['image']) or 'unknown'}",
        *[
            f"- GPU {g['name']}: cc {g['cc'] or '?'}, {g['class']}, image coverage {g['coverage'] or 'not declared'}"
            for g in host["gpu_findings"]
        ],
        f"- nvidia-smi: {host['nvidia_smi']} ({host['nvidia_smi_form'] or 'a failure message'})",
        *[f"- note: {n}" for n in ev["notes"]],
        *([f"- save first: {ev['save_first']}"] if ev["save_first"] else []),
        "- evidence archive: "
        + (
            f"{archive['archive']} (sha256 {archive['sha256']})"
            if archive
            else f"**{TO_FILL}: run `build evidence --out DIR` and name its archive**"
        ),
    ]


def _cpu_text(cpu: dict) -> str:
    return f"{cpu['host']} ({cpu['from']})" if cpu["host"] else "unknown (give --evidence ARCHIVE: its uname says it)"


def _verification_lines(ver: dict) -> list[str]:
    lines = [
        "## Verification",
        "",
        f"- doctor: {'compatible' if ver['compatible'] else 'INCOMPATIBLE'} (image CUDA {ver['image_cuda']})",
        "- image checks: "
        + (
            f"{ver['checks']} (build record {ver['build_record']['record']}, digest {ver['build_record']['digest']})"
            if ver["build_record"]
            else "unknown: no build record names this image (run `build test --image REF`)"
        ),
    ]
    return lines + [f"- label {k}: {v if v is not None else '(absent)'}" for k, v in ver["labels"].items()]


def _exit_lines(ex: dict) -> list[str]:
    return [
        "## Exit conditions",
        "",
        f"- bridge: {'yes' if ex['bridge'] else 'no'}",
        f"- owner: {ex['owner'] or '(no owner label)'}",
        f"- expires: {ex['expires'] or '(no expiry label)'}",
        f"- status: {ex['status']}",
        *([f"- exit when: {ex['exit_when']}"] if ex.get("exit_when") else []),
    ]


def _vet_lines(cards: list[dict]) -> list[str]:
    """The `build vet --decision` scorecards added to this record (issue 37), one table each."""
    lines = []
    for card in cards:
        lines += [f"## Vet scorecard: {card['pinned']}", "", f"- target: {card['target']}", f"- {card['verdict']}", ""]
        lines += ["| check | status | finding |", "| --- | --- | --- |"]
        for c in card["checks"]:
            finding = " ".join(str(c["finding"]).split()).replace("|", "\\|")[:300]
            lines.append(f"| {c['name']} | {c['status']}{' (advisory)' if c['advisory'] else ''} | {finding} |")
        lines.append("")
    return lines


SIGNS = {
    "original_error_recurs": "does the original error recur",
    "prefix_caching_as_expected": "does prefix caching behave as expected",
    "agent_tools_work": "do the agent tools work",
    "manual_steps": "how many manual steps the environment needs",
}


def _outcome(step: dict | None) -> str:
    if step is None:
        return "not run"
    cause = f" (cause: {step['cause']})" if step.get("cause") else ""
    return f"{step['outcome']}: {step['reason']}{cause}"


def _numbers(numbers: dict) -> str:
    return "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in numbers.items())


def _launch_lines(runs: list[dict]) -> list[str]:
    """The `build accept --record` runs added to this record (issue 47); a marked blank before any."""
    if not runs:
        return [
            "## Launch verification",
            "",
            f"- **{TO_FILL}: launch the server, then run `build accept --endpoint URL --record DIR`**",
            "",
        ]
    lines = []
    for run in runs:
        lines += [
            f"## Launch verification: {run['endpoint']} ({run['created']})",
            "",
            f"- outcome: {run['outcome']}; load step reached: {run['load_step_reached']}; report: {run['report']}",
            "- launch command (recipe): "
            + (f"`{run['launch_command']}`" if run["launch_command"] else "no --target given"),
            f"- server reports: {run['server_reports']}",
            *[f"- {c['what']}: recipe {c['recipe']}, server {c['server']}" for c in run["comparison"]],
            *[f"- smoke, {name.replace('_', ' ')}: {_outcome(step)}" for name, step in run["smoke"].items()],
            f"- prefix caching: {_outcome(run['prefix_caching'])}",
            *([f"- prefix caching, measured: {_numbers(run['prefix_numbers'])}"] if run.get("prefix_numbers") else []),
            f"- concurrency: {_outcome(run['concurrency'])}",
            f"- agent: {_outcome(run['agent'])}",
            f"- cross-node: {_outcome(run['cross_node'])}",
            *[
                f"- sign, {SIGNS[k]}: {v if v is not None else f'**{TO_FILL}: {SIGNS[k]}**'}"
                for k, v in run["signs"].items()
            ],
            "",
        ]
    return lines
