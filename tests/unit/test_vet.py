"""`build vet` (issue 37): the scorecard a foreign image gets, its n/a and advisory rows, the exit
codes on a FakeEngine, the n/a marks through a real pytest run, the reference in the matrix, the
side-by-side of `build compare --vet` and the decision record's section."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from builder.checks import runner, vet
from builder.cli import main
from builder.config import contract, matrix
from builder.errors import BuildError, ConfigError, RegistryUnavailable
from builder.host import compare, decisionmd
from tests.conftest import REPO
from tests.unit.fakeengine import FakeEngine

IMAGE = "127.0.0.1:5000/k3/foreign:v1"


class Checks:
    """runner.run without a container: the n/a plugin's skips, ``failing`` checks fail, the rest pass."""

    def __init__(self, monkeypatch) -> None:
        self.failing: dict[str, str] = {}
        self.skipping: dict[str, str] = {}  # what the target gives nothing to check
        self.calls: list[tuple[str, runner.Expectations]] = []
        monkeypatch.setattr(runner, "run", self.run)

    def run(self, engine, ref, expect, junit, plugins=()):
        self.calls.append((ref, expect))
        results = []
        for name in contract.CHECKS:
            na = next((p.skip_reason(name) for p in plugins if p.skip_reason(name)), None)
            if na or name in self.skipping:
                results.append(runner.CheckResult(name, False, na or self.skipping[name], skipped=True))
            else:
                results.append(runner.CheckResult(name, name not in self.failing, self.failing.get(name, "")))
        return runner.Report(image=ref, results=results, junit=junit, warnings=["a note"], facts={"gpu": {"x": 1}})


@pytest.fixture()
def checks(monkeypatch):
    return Checks(monkeypatch)


@pytest.fixture()
def checkout(tmp_path, monkeypatch):
    """The repository's matrix in a directory of its own (artifacts/ land there), and a FakeEngine
    serving IMAGE."""
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    engine = FakeEngine()
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": ["CUDA_VERSION=12.9.1"]}}  # no labels
    engine.registry.push("127.0.0.1:5000/k3/foreign", "v1", config, [b"layer"])
    monkeypatch.setattr("builder.commands.vet.docker_engine", lambda: engine)
    monkeypatch.setattr("builder.commands.compare.docker_engine", lambda: engine)
    return tmp_path / "matrix.yaml", engine


def _vet(matrix_path: Path, *extra: str, capsys) -> tuple[int, dict]:
    args = ["--matrix", str(matrix_path), "vet", "--json", "--no-source", "--prefix", "/usr/lib/py", *extra]
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr().out
    return int(info.value.code), json.loads(out) if out.strip() else {}


def test_a_fit_image_exits_0_and_lists_every_na_row_with_its_reason(checkout, checks, capsys):
    path, engine = checkout
    code, doc = _vet(path, "--target", "cu129", "--image", IMAGE, capsys=capsys)
    assert code == 0, doc
    rows = {c["name"]: c for c in doc["checks"]}
    assert list(rows) == list(contract.CHECKS)  # every check has a row, in the contract's order
    for name, why in contract.VET_NOT_APPLICABLE.items():
        assert rows[name]["status"] == "n/a"
        assert rows[name]["finding"] == f"not applicable to a foreign image: {why}"
    # --no-source: the modules the matrix adds are checked, and the scorecard says only those were
    assert rows["compiled_modules"]["status"] == "pass"
    assert doc["warnings"][0].startswith("compiled_modules: only the 4 module(s) the matrix adds were checked")
    assert doc["fit"] and doc["verdict"].startswith("fit for cu129's hosts")
    assert doc["counts"]["n/a"] == len(contract.VET_NOT_APPLICABLE)
    assert doc["pinned"].startswith(IMAGE + "@sha256:")  # checked by the digest the registry serves
    ref, expect = checks.calls[0]
    assert ref == doc["pinned"]
    # the expectations are the matrix's alone: no lock, no labels, the foreign prefix
    assert (expect.lock, expect.labels, expect.app_prefix) == ({}, {}, "/usr/lib/py")
    target = matrix.load(path).target("cu129")
    assert expect.cuda_version == target.cuda.version and expect.gpu == target.gpu
    assert expect.recipe and expect.recipe["architecture"] == target.runtime.recipe.architecture


def test_a_failing_deciding_check_exits_1_and_is_named(checkout, checks, capsys):
    path, _ = checkout
    checks.failing = {"no_other_cuda_major": "expected only CUDA 12 libraries, found: libcudart.so.13"}
    code, doc = _vet(path, "--target", "cu129", "--image", IMAGE, capsys=capsys)
    assert code == 1
    assert not doc["fit"] and "no_other_cuda_major failed" in doc["verdict"]
    row = next(c for c in doc["checks"] if c["name"] == "no_other_cuda_major")
    assert (row["status"], row["finding"]) == ("fail", checks.failing["no_other_cuda_major"])


def test_an_advisory_failure_is_shown_but_does_not_decide(checkout, checks, capsys):
    path, _ = checkout
    checks.failing = {"non_root": "expected a non-root default user, found root"}
    code, doc = _vet(path, "--target", "cu129", "--image", IMAGE, capsys=capsys)
    assert code == 0 and doc["fit"]
    row = next(c for c in doc["checks"] if c["name"] == "non_root")
    assert row["status"] == "fail" and row["advisory"]


def test_nothing_that_decides_ran_is_not_fit(checkout, checks, capsys):
    path, _ = checkout
    checks.skipping = {n: "nothing to check" for n in contract.CHECKS if n not in contract.VET_ADVISORY}
    code, doc = _vet(path, "--target", "cu129", "--image", IMAGE, capsys=capsys)
    assert code == 1 and not doc["fit"]


def test_the_default_image_is_the_targets_reference(checkout, checks, capsys, monkeypatch):
    path, engine = checkout
    seen = []
    monkeypatch.setattr("builder.checks.vetrun.pin", lambda engine, ref: seen.append(ref) or ref)
    code, doc = _vet(path, "--target", "cu129", capsys=capsys)
    assert code == 0, doc
    assert seen == [matrix.load(path).target("cu129").reference.image.ref]
    assert doc["image"].startswith("vllm/vllm-openai:v0.30.0-cu129@sha256:58fdb6bb")


@pytest.mark.parametrize(
    "extra,message",
    [
        (("--target", "smoke"), "unknown target"),  # not in the repository's matrix
        (("--target", "cu129", "--image", "127.0.0.1:5000/k3/absent:v1"), "the registry does not serve it"),
        (("--target", "cu129", "--image", "not a ref"), "not an image reference"),
        (("--target", "cu129", "--image", IMAGE, "--decision", "/nonexistent.json"), "no such decision record"),
    ],
)
def test_bad_input_exits_2_with_one_line(checkout, checks, capsys, extra, message):
    path, _ = checkout
    code, doc = _vet(path, *extra, capsys=capsys)
    assert code == 2, doc
    assert message in doc["error"].lower() and "\n" not in doc["error"]
    assert not checks.calls  # nothing ran


def test_an_unreachable_registry_exits_3(checkout, checks, capsys, monkeypatch):
    path, engine = checkout

    def down(ref, arch="amd64"):
        raise RegistryUnavailable("127.0.0.1:5000: connection refused")

    monkeypatch.setattr(engine.registry, "image_config", down)
    code, doc = _vet(path, "--target", "cu129", "--image", IMAGE, capsys=capsys)
    assert code == 3 and not checks.calls


def test_a_pull_that_cannot_reach_its_registry_exits_3(checkout, checks, capsys, monkeypatch):
    path, engine = checkout

    def pull(ref):  # what the Docker engine says on this machine, which has no Docker Hub
        raise BuildError(
            f"cannot pull or inspect {ref}: Error response from daemon: Get "
            '"https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: no such host'
        )

    monkeypatch.setattr(engine, "image_config", pull)
    code, doc = _vet(path, "--target", "cu129", capsys=capsys)  # the reference: Docker Hub
    assert code == 3 and "out of reach" in doc["error"] and not checks.calls
    for said, want in (("manifest for x not found: manifest unknown", 2), ("no space in the image store", 1)):
        monkeypatch.setattr(engine, "image_config", lambda ref, said=said: (_ for _ in ()).throw(BuildError(said)))
        code, doc = _vet(path, "--target", "cu129", capsys=capsys)
        assert code == want and said in doc["error"]  # not served: bad input; anything else: the engine's exit


def test_a_target_without_reference_needs_image(tmp_path):
    loaded = matrix.load(REPO / "matrix.yaml")
    bare = loaded.target("cu129").model_copy(update={"reference": None})
    with pytest.raises(ConfigError, match=r"targets\.cu129\.reference is not set; pass --image"):
        from builder.checks.vetrun import default_image

        default_image(bare, None)


def test_the_reference_is_validated_like_every_matrix_value(tmp_path):
    text = (REPO / "matrix.yaml").read_text()
    good = "@sha256:58fdb6bb123a81aa53f46fa4652ad8cc87e817bd1077c9832c6258ef12c1c688"
    assert text.count(good) == 1
    for bad, key in (
        (text.replace(good, ""), "targets.cu129.reference.image"),  # not pinned by digest
        (text.replace("platform: linux/amd64", "platform: windows/amd64"), "targets.cu129.reference.platform"),
        (text.replace("      note: ", "      notes: "), "targets.cu129.reference"),
    ):
        (tmp_path / "matrix.yaml").write_text(bad)
        with pytest.raises(ConfigError) as info:
            matrix.load(tmp_path / "matrix.yaml")
        assert key in info.value.message and "\n" not in info.value.message


def test_the_reference_is_not_an_input_of_the_image():
    target = matrix.load(REPO / "matrix.yaml").target("cu129")
    assert target.reference is not None
    assert target.as_input() == target.model_copy(update={"reference": None}).as_input()


def test_prefix_is_sys_prefix_or_the_system_pythons_site_packages():
    class Containers:
        def __init__(self, out: str) -> None:
            self.out = out

        def run_capture(self, ref, entrypoint, args):
            # isolated: the image's .pth files and sitecustomize never run before the script
            assert entrypoint == "sh" and " -I -S -c " in args[1] and args[2].startswith("# Prepended first")
            return self.out

    class Engine:
        def __init__(self, out: str) -> None:
            self.containers = Containers(out)

    venv = json.dumps({"prefix": "/opt/k3/venv", "purelib": "/opt/k3/venv/lib/python3.11/site-packages"})
    system = json.dumps({"prefix": "/usr", "purelib": "/usr/local/lib/python3.12/dist-packages"})
    assert vet.prefix_of(Engine(venv), "x") == "/opt/k3/venv"
    assert vet.prefix_of(Engine("noise\n" + system), "x") == "/usr/local/lib/python3.12/dist-packages"
    with pytest.raises(Exception, match="cannot read its Python prefix"):
        vet.prefix_of(Engine("sh: python3: not found"), "x")


def test_the_na_marks_hold_through_a_real_pytest_run_and_its_junit(tmp_path):
    """The plugin on a checklist of stand-in checks (one per contract.CHECKS, each passing): the
    n/a ones are skipped before they run, and the JUnit report reads back as the scorecard."""
    listing = tmp_path / "checklist_standin.py"
    listing.write_text("".join(f"def test_{name}():\n    pass\n\n\n" for name in contract.CHECKS))
    junit = tmp_path / "checks.xml"
    plugin = vet.NotApplicable(vet.not_applicable(None, "offline"))
    code = pytest.main(
        [str(listing), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), f"--junitxml={junit}"],
        plugins=[plugin],
    )
    assert code == pytest.ExitCode.OK
    assert len(list(ET.parse(junit).getroot().iter("testcase"))) == len(contract.CHECKS)
    report = runner.Report(image="img@sha256:" + "a" * 64, results=runner._parse_junit(junit))
    card = vet.scorecard(report, image="img", target="cu129", prefix="/p")
    na = {r.check for r in card.rows if r.status == "n/a"}
    assert na == set(contract.VET_NOT_APPLICABLE) | {"compiled_modules"}
    assert all(r.status == "pass" for r in card.rows if r.check not in na)
    assert card.fit


def _card(**status: str) -> dict:
    rows = [vet.Row(n, status.get(n, "pass"), f"finding of {n}", n in contract.VET_ADVISORY) for n in contract.CHECKS]
    return vet.Scorecard("img", "img@sha256:" + "b" * 64, "cu129", "/p", rows).to_json()


def test_the_text_and_markdown_forms_show_every_row():
    card = vet.Scorecard(
        "img",
        "img@sha256:" + "c" * 64,
        "cu129",
        "/p",
        [vet.Row("cuda_runtime", "fail", "expected 12090, found 13000 | at x"), vet.Row("labels", "n/a", "why")],
    )
    text = "\n".join(card.text())
    assert "fail  cuda_runtime" in text and "n/a   labels" in text and text.endswith("1 n/a)")
    md = card.markdown()
    assert "| cuda_runtime | **FAIL** | expected 12090, found 13000 \\| at x |" in md
    assert "NOT fit for cu129's hosts: cuda_runtime failed" in md
    card.facts = {
        "gpu": {"driver_floor": "575.51.03", "derived_floor": "580.65.06", "derived_cuda": "13.0"},
        "gpu_coverage": {"vllm._C": {"9.0": "sass", "10.3": "none: no code"}},
    }
    assert card.gpu_lines() == [
        "  gpu: derived driver floor 580.65.06 (CUDA 13.0), claimed 575.51.03",
        "  coverage vllm._C: 10.3 none: no code, 9.0 sass",
    ]
    assert "- gpu: derived driver floor 580.65.06" in card.markdown() and card.text()[-2] == card.gpu_lines()[-1]


def test_side_by_side_says_whether_the_reference_passes_what_ours_passes():
    ours = _card(labels="n/a")
    theirs = _card(labels="n/a", no_other_cuda_major="fail", non_root="fail")
    vs = compare.side_by_side(ours, theirs)
    assert vs["reference_short_of_ours"] == ["no_other_cuda_major"]  # non_root is advisory
    assert not vs["reference_as_fit"]
    assert ["no_other_cuda_major", "pass", "fail"] in vs["rows"]
    same = compare.side_by_side(ours, _card(labels="n/a", non_root="fail"))
    assert same["reference_as_fit"] and same["reference_short_of_ours"] == []


def test_the_decision_record_gets_the_scorecard(checkout, checks, capsys, tmp_path, monkeypatch):
    path, engine = checkout
    monkeypatch.setattr("builder.commands.doctor.docker_engine", lambda: engine)
    smi = REPO / "tests" / "fixtures" / "nvidia-smi" / "r575-h100.txt"
    with pytest.raises(SystemExit):
        main(["doctor", "--image", IMAGE, "--nvidia-smi-file", str(smi), "--record", str(tmp_path / "rec")])
    capsys.readouterr()
    (record,) = (tmp_path / "rec").glob("*.json")
    code, out = _vet(path, "--target", "cu129", "--image", IMAGE, "--decision", str(record), capsys=capsys)
    assert code == 0, out
    saved = json.loads(record.read_text())
    assert saved["vet"][0]["pinned"] == out["pinned"] and "fault_evidence" in saved  # the record kept
    md = record.with_suffix(".md").read_text()
    assert f"## Vet scorecard: {out['pinned']}" in md and "## Fault evidence" in md
    na = "not applicable to a foreign image: compares this pipeline's labels with the matrix"
    assert f"| labels | n/a | {na} |" in md
    assert decisionmd._vet_lines(saved["vet"])[0] == f"## Vet scorecard: {out['pinned']}"
    record.write_text("[]")
    code, out = _vet(path, "--target", "cu129", "--image", IMAGE, "--decision", str(record), capsys=capsys)
    assert code == 2 and "not a decision record" in out["error"]


def test_build_compare_vet_shows_both_scorecards_side_by_side(checkout, checks, capsys, monkeypatch):
    path, engine = checkout
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": ["CUDA_VERSION=12.9.1"]}}
    engine.registry.push("127.0.0.1:5000/k3/upstream", "cu129", config, [b"other layer"])
    monkeypatch.setattr(vet, "prefix_of", lambda engine, ref: "/usr/local/lib/python3.12/dist-packages")
    real = checks.run

    def run(engine, ref, expect, junit, plugins=()):  # upstream's carries a CUDA 13 runtime
        checks.failing = {"no_other_cuda_major": "found libcudart.so.13"} if "upstream" in ref else {}
        return real(engine, ref, expect, junit, plugins)

    monkeypatch.setattr(runner, "run", run)
    upstream = "127.0.0.1:5000/k3/upstream:cu129"
    argv = ["--matrix", str(path), "compare", "--target", "cu129", "--image", IMAGE, "--against", upstream]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--vet", "--no-source"])
    assert info.value.code == 0  # compare reports; it does not judge
    text = capsys.readouterr().out
    assert "  no_other_cuda_major  pass   fail" in text
    assert "the reference fails what ours passes: no_other_cuda_major" in text
    with pytest.raises(SystemExit):
        main([*argv, "--vet", "--no-source", "--json"])
    doc = json.loads(capsys.readouterr().out)["vet"]
    assert doc["ours"]["fit"] and not doc["reference"]["fit"] and not doc["reference_as_fit"]
    assert doc["reference"]["pinned"].startswith(upstream + "@sha256:")
    assert [r for r in doc["rows"] if r[0] == "labels"] == [["labels", "n/a", "n/a"]]


def test_the_scorecard_says_the_prefix_is_the_image_s_word_unless_given():
    """The host's rows read under the prefix; when the image's interpreter named it, they are not
    beyond the image's influence, and the scorecard says so."""
    rows = [vet.Row("gpu_code", "pass", "")]
    told = vet.Scorecard("img", "img@sha256:" + "b" * 64, "cu129", "/p", rows)
    assert any("/p is the image's interpreter's answer" in line for line in told.influence())
    told.prefix_given = True
    assert not any("interpreter's answer" in line for line in told.influence())
