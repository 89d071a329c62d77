"""`build doctor --record`: the decision record from captured hosts and the built smoke image (no
build of its own: the session's `built` smoke)."""

from __future__ import annotations

import hashlib
import json

from tests.conftest import REPO
from tests.integration.conftest import cli

SMI = REPO / "tests" / "fixtures" / "nvidia-smi"


def test_the_decision_record_from_a_captured_host_and_the_demo_image(built, tmp_path):
    smoke, ref = built
    made = cli(
        "evidence",
        "--image",
        ref,
        "--out",
        str(tmp_path / "evidence"),
        "--nvidia-smi-file",
        str(SMI / "r575-h100.txt"),
    )
    assert made.code == 0, made.err
    archive = made.out.strip().splitlines()[-1]
    r = cli(
        "--matrix",
        str(smoke.matrix),
        "doctor",
        "--target",
        "smoke",
        "--nvidia-smi-file",
        str(SMI / "r575-h100.txt"),
        "--record",
        str(tmp_path / "records"),
        "--evidence",
        archive,
    )
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    # An r575 host: the smoke's GPU code (PTX ISA 8.8) needs the 575.51.03 floor its label states, so
    # the r565 capture this test once used is now below the floor (test_field, tests/unit/test_doctor_gpus).
    assert lines[0].startswith(f"compatible: {ref}: CUDA 12.9.1 ") and "575.57.08 (r575)" in lines[0]
    md_path = tmp_path / "records" / lines[-1].removeprefix("record: ").rsplit("/", 1)[-1]
    doc = json.loads(md_path.with_suffix(".json").read_text())
    assert doc["image"] == ref and doc["chosen"] == "the cu129 bridge"
    assert doc["fault_evidence"]["evidence_archive"] == {
        "archive": archive.rsplit("/", 1)[-1],
        "sha256": hashlib.sha256(open(archive, "rb").read()).hexdigest(),
    }
    assert doc["fault_evidence"]["host"]["gpus"] == ["NVIDIA H100 80GB HBM3"] * 2
    ver = doc["verification"]
    assert ver["checks"] == "passed" and ver["build_record"]["digest"] == ref.split("@", 1)[1]
    assert ver["labels"]["io.k3-cu129.cuda-version"] == "12.9.1"
    assert ver["labels"]["org.opencontainers.image.version"].startswith("0.1.0")
    assert doc["exit_conditions"]["owner"] == "gpu-platform@example.org" == ver["labels"]["io.k3-cu129.owner"]
    assert doc["exit_conditions"]["expires"] == ver["labels"]["io.k3-cu129.expires"]
    assert doc["next_review"] <= doc["exit_conditions"]["expires"]
    text = md_path.read_text()
    assert f"- image checks: passed (build record {ver['build_record']['record']}" in text
    assert "**TO FILL (a person): the platform lead who approved**" in text


def test_a_broken_host_and_smi_L_get_records_that_choose_nothing(built, tmp_path):
    smoke, ref = built
    r = cli(
        "--matrix",
        str(smoke.matrix),
        "doctor",
        "--target",
        "smoke",
        "--nvidia-smi-file",
        str(SMI / "nvml-mismatch-570.txt"),
        "--record",
        str(tmp_path),
        "--json",
    )
    assert r.code == 1, r.err
    out = json.loads(r.out)
    assert out["fault"] == "nvml-mismatch" and out["nvml_library"] == "570.124"
    assert out["route"].startswith("reboot the host") and out["save"].startswith("/proc/driver/nvidia/version")
    doc = json.loads(open(out["record_json"]).read())
    assert doc["chosen"] is None and doc["image"] == ref
    listed = cli(
        "--matrix",
        str(smoke.matrix),
        "doctor",
        "--target",
        "smoke",
        "--nvidia-smi-file",
        str(SMI / "r590-h100-mig-L.txt"),
        "--record",
        str(tmp_path / "none"),
    )
    # nvidia-smi output without a driver version is a verdict (driver-unknown), not bad input: its record
    # chooses no path and says what to capture
    assert listed.code == 1 and "capture `nvidia-smi` or `nvidia-smi -q` instead" in listed.out
    assert "verdict: driver-unknown" in listed.out
    record = json.loads(next((tmp_path / "none").glob("k3-decision-*.json")).read_text())
    assert record["chosen"] is None and "driver-unknown" in record["chosen_why"]
