"""The build's preflight computes the kernel plan per platform before any compile (issue 52): a
required kernel that misses a claimed family stops the build in seconds (KernelPlanFailed, exit 1,
as `build plan` exits for it), naming platform, kernel, family, file and line, with nothing built,
pushed, recorded or written under artifacts/. cmake -P really runs (the pinned cmake wheel, on this
machine only for the tests' own trees and vLLM's sdist: tests/unit/cmakehost.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from builder.config import matrix
from builder.config.matrix import parse
from builder.config.options import BuildOptions
from builder.errors import EngineUnavailable, KernelPlanFailed
from builder.pipeline import build as pipeline
from builder.pipeline import context
from builder.pipeline.plan import Plan
from builder.smoke import smoke
from builder.source import kernelmap
from tests.conftest import REPO
from tests.unit.cmakehost import HostCMake, host_cmake  # noqa: F401 - fixture
from tests.unit.fakeengine import FakeEngine
from tests.unit.test_kernel_plan import (  # noqa: F401 - fixtures
    CMAKELISTS,
    DECODE,
    GPU,
    UTILS,
    _run,
    _tree,
    upstream,
    vllm_sdist,
)
from tests.unit.test_pipeline_ordering import _recorded, checks, plan, smoke_repos  # noqa: F401 - fixtures

AMD64, ARM64 = "linux/amd64", "linux/arm64"
WITH_103 = ["8.0", "9.0", "10.0", "10.3", "12.0"]
WITHOUT_103 = ["8.0", "9.0", "10.0", "12.0"]
TREE = {"CMakeLists.txt": CMAKELISTS.replace("%DECODE%", DECODE), "cmake/utils.cmake": UTILS}


def _target(amd64: list[str], arm64: list[str] | None, required: dict | None = None):
    """matrix.yaml's cu129 (both platforms) with the fixture's families, K3_DECODE_ARCHS required on
    every one, and the two arch lists given (``arm64`` None: arm64 keeps the target's list)."""
    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    t = doc["targets"]["cu129"]
    t["cuda"]["arch_list"] = list(amd64)
    t["gpu"] = {"families": dict(GPU["families"]), "driver_floor": GPU["driver_floor"]}
    t["kernels"] = {
        "required": yaml.safe_load(yaml.safe_dump(required if required is not None else {"K3_DECODE_ARCHS": "all"}))
    }
    if arm64 is None:
        t["platforms"][ARM64].pop("arch_list", None)
    else:
        t["platforms"][ARM64]["arch_list"] = list(arm64)
    return parse(yaml.safe_dump(doc, sort_keys=False, width=4096), REPO / "matrix.yaml").target("cu129")


def _preflight(target, tmp_path, platform: str | None = None, tree=None) -> tuple[list, HostCMake]:
    sandbox = HostCMake()
    at = Plan.at(target, tmp_path, platform)
    return context.kernel_preflight(at, tree or _tree(TREE), lambda: sandbox), sandbox


# --- per platform, both directions ----------------------------------------------------------------


def test_every_platform_covered_passes_and_each_runs_its_own_arch_list(tmp_path):
    target = _target(WITH_103, ["8.0", "9.0", "10.0", "10.3", "12.0"])
    plans, sandbox = _preflight(target, tmp_path)
    assert [(p.platform, p.ok) for p in plans] == [(AMD64, True), (ARM64, True)]
    assert [p.origin for p in plans] == [target.source.commit[:12]] * 2  # the pin each plan was read at
    assert len(sandbox.scripts) == 2  # one cmake -P per platform
    assert all(p.fetches == [] for p in plans)  # the preflight's fetch check is fetches.check's, not repeated
    decode = plans[1].kernel("K3_DECODE_ARCHS")[0]
    assert decode.on("10.3") == "10.3a" and decode.archs == ("9.0a", "10.0a", "10.3a", "12.0a")


@pytest.mark.parametrize(
    "amd64,arm64,missing",
    [
        (WITHOUT_103, WITH_103, [AMD64]),  # the target's own list (the first platform)
        (WITH_103, WITHOUT_103, [ARM64]),  # the second platform's own list
        (WITHOUT_103, WITHOUT_103, [AMD64, ARM64]),
    ],
)
def test_a_platform_without_10_3_fails_naming_platform_kernel_family_file_and_line(tmp_path, amd64, arm64, missing):
    with pytest.raises(KernelPlanFailed) as info:
        _preflight(_target(amd64, arm64), tmp_path)
    msg = info.value.message
    assert info.value.exit_code == 1
    for platform in (AMD64, ARM64):
        named = f"{platform}: kernels.required.K3_DECODE_ARCHS: nothing loads on 10.3 (B300)" in msg
        assert named == (platform in missing), msg
    assert "(CMakeLists.txt:K3_DECODE_ARCHS:9)" in msg  # the selection's file and line
    assert "nothing loads on 9.0" not in msg and "nothing loads on 12.0" not in msg
    assert "\n" not in msg and "`build plan --target cu129` shows the plan per platform" in msg


def test_whichever_platform_a_build_makes_every_platform_is_held_before_any_compile(tmp_path):
    # the amd64 build of an index whose arm64 list lacks 10.3: refused before amd64 compiles
    target = _target(WITH_103, WITHOUT_103)
    for platform in (AMD64, ARM64):
        with pytest.raises(KernelPlanFailed, match=rf"{ARM64}: kernels\.required\.K3_DECODE_ARCHS"):
            _preflight(target, tmp_path, platform)


def test_a_platform_inheriting_the_target_list_is_planned_with_it(tmp_path):
    plans, _ = _preflight(_target(WITH_103, None), tmp_path)
    assert [p.arch_list for p in plans] == [tuple(WITH_103), tuple(WITH_103)]
    with pytest.raises(KernelPlanFailed, match=rf"{AMD64}: .*; {ARM64}: "):
        _preflight(_target(WITHOUT_103, None), tmp_path)


def test_one_platform_target_has_no_platform_prefix(tmp_path):
    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    t = doc["targets"]["cu129"]
    t.pop("platforms")
    t["cpu"].pop(ARM64)  # a claim names only platforms the target builds
    t["cuda"]["arch_list"] = list(WITHOUT_103)
    t["gpu"] = {"families": dict(GPU["families"]), "driver_floor": GPU["driver_floor"]}
    t["kernels"] = {"required": {"K3_DECODE_ARCHS": ["10.3"]}}
    target = parse(yaml.safe_dump(doc, sort_keys=False, width=4096), REPO / "matrix.yaml").target("cu129")
    with pytest.raises(KernelPlanFailed) as info:
        _preflight(target, tmp_path)
    assert "before any compile: kernels.required.K3_DECODE_ARCHS: nothing loads on 10.3" in info.value.message
    assert "linux/" not in info.value.message.split("shows the plan")[0]


# --- the families a kernel is held to: at the edges -----------------------------------------------


@pytest.mark.parametrize(
    "families,fails",
    [
        (["9.0"], False),
        (["12.0"], False),
        (["10.3"], True),  # the one family the list without 10.3 misses
        (["9.0", "10.3"], True),
    ],
)
def test_only_the_families_a_kernel_is_required_on_count(tmp_path, families, fails):
    target = _target(WITHOUT_103, WITH_103, {"K3_DECODE_ARCHS": families})
    if fails:
        with pytest.raises(KernelPlanFailed, match=r"nothing loads on 10\.3"):
            _preflight(target, tmp_path)
    else:
        assert all(p.ok for p in _preflight(target, tmp_path)[0])


def test_no_required_kernel_runs_no_cmake_and_asks_no_sandbox(tmp_path):
    asked: list = []
    at = Plan.at(_target(WITHOUT_103, WITHOUT_103, {}), tmp_path, None)
    assert context.kernel_preflight(at, _tree(TREE), lambda: asked.append(1)) == []
    assert asked == []


def test_check_itself_runs_no_cmake_without_a_required_kernel(tmp_path):
    # kernelmap.check's own guard (the preflight's is before it asks for a sandbox)
    sandbox = HostCMake()
    targets = Plan.at(_target(WITHOUT_103, WITHOUT_103, {}), tmp_path, None).compiled_targets()
    assert kernelmap.check(_tree(TREE), targets, "pin", sandbox) == [] and sandbox.scripts == []
    required = Plan.at(_target(WITH_103, WITH_103), tmp_path, None).compiled_targets()
    assert [p.ok for p in kernelmap.check(_tree(TREE), required, "pin", sandbox)] == [True, True]
    assert len(sandbox.scripts) == 2


def test_a_required_kernel_the_build_files_lack_fails(tmp_path):
    target = _target(WITH_103, WITH_103, {"K3_GONE_ARCHS": "all"})
    with pytest.raises(KernelPlanFailed, match=r"kernels\.required\.K3_GONE_ARCHS: no arch selection of that name"):
        _preflight(target, tmp_path)


def test_a_plan_that_cannot_be_computed_fails_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    utils = UTILS.replace("  set(_out)\n", f'  set(_out)\n  file(WRITE "{marker}" x)\n')
    tree = _tree({**TREE, "cmake/utils.cmake": utils})
    with pytest.raises(KernelPlanFailed, match=r"K3_DECODE_ARCHS: the kernel plan cannot be computed") as info:
        _preflight(_target(WITH_103, WITH_103), tmp_path, tree=tree)
    assert f"{AMD64}: " in info.value.message and f"{ARM64}: " in info.value.message
    assert not marker.exists()


def test_a_utils_that_would_run_a_command_is_refused_saying_why_and_runs_nothing(tmp_path):
    # a hostile bump: upstream's helper tries to run a command; the refusal names what and where,
    # so the operator need not run `build plan` to learn why the build stopped
    marker = tmp_path / "ran"
    utils = UTILS.replace("  set(_out)\n", f'  set(_out)\n  execute_process(COMMAND touch "{marker}")\n')
    sandbox_asked: list = []
    at = Plan.at(_target(WITH_103, WITH_103), tmp_path, None)
    with pytest.raises(KernelPlanFailed) as info:
        context.kernel_preflight(at, _tree({**TREE, "cmake/utils.cmake": utils}), lambda: sandbox_asked.append(1))
    msg = info.value.message
    assert "K3_DECODE_ARCHS: the kernel plan cannot be computed (" in msg and "execute_process" in msg, msg
    assert "cmake/utils.cmake" in msg and "\n" not in msg
    assert not marker.exists() and list(tmp_path.iterdir()) == []


def test_an_engine_without_a_sandbox_is_exit_3_never_the_host():
    class Bare:  # an Engine that offers no sandbox
        pass

    with pytest.raises(EngineUnavailable, match="upstream's CMake never runs on the build host") as info:
        context.cmake_sandbox(Bare())  # type: ignore[arg-type]
    assert info.value.exit_code == 3


def test_missed_keeps_only_required_kernel_failures():
    one = kernelmap.SourcePlan("o", "12.9.1", ("9.0",), ("9.0",), platform=AMD64)
    one.failures = ["unpinned fetch: x", "kernels.required.A_ARCHS: nothing loads on 9.0 (H100)"]
    assert kernelmap.missed([one]) == ["kernels.required.A_ARCHS: nothing loads on 9.0 (H100)"]
    two = kernelmap.SourcePlan("o", "12.9.1", ("9.0",), ("9.0",), platform=ARM64)
    assert kernelmap.missed([one, two]) == [f"{AMD64}: kernels.required.A_ARCHS: nothing loads on 9.0 (H100)"]
    assert kernelmap.missed([]) == []


# --- vLLM 0.30.0 at the pin: the done-when -----------------------------------------------


def _cu129(amd64: list[str] | None = None, arm64: list[str] | None = None):
    """matrix.yaml's cu129 as committed (its families, kernels.required, both platforms), with an
    arch list edited."""
    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    t = doc["targets"]["cu129"]
    if amd64 is not None:
        t["cuda"]["arch_list"] = list(amd64)
    if arm64 is not None:
        t["platforms"][ARM64]["arch_list"] = list(arm64)
    return parse(yaml.safe_dump(doc, sort_keys=False, width=4096), REPO / "matrix.yaml").target("cu129")


def test_vllm_030_both_platforms_pass_as_committed(vllm_sdist, tmp_path):  # noqa: F811
    plans, _ = _preflight(_cu129(), tmp_path, tree=vllm_sdist)
    assert [(p.platform, p.ok) for p in plans] == [(AMD64, True), (ARM64, True)], [p.failures for p in plans]
    for p in plans:
        assert p.kernel("FLASH_KDA_ARCHS")[0].on("10.3") == "10.3a"
        assert p.kernel("DSV3_FUSED_A_GEMM_ARCHS")[0].on("10.3") == "10.3a"


def test_vllm_030_without_10_3_fails_naming_flashkda_and_dsv3_on_b300(vllm_sdist, tmp_path):  # noqa: F811
    amd64 = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]
    with pytest.raises(KernelPlanFailed) as info:
        _preflight(_cu129(amd64=amd64), tmp_path, tree=vllm_sdist)
    msg = info.value.message
    flashkda = f"{AMD64}: kernels.required.FLASH_KDA_ARCHS: nothing loads on 10.3 (B300, GB300)"
    dsv3 = f"{AMD64}: kernels.required.DSV3_FUSED_A_GEMM_ARCHS: nothing loads on 10.3 (B300, GB300)"
    assert flashkda in msg and dsv3 in msg
    assert "cmake/external_projects/flashkda.cmake:FLASH_KDA_ARCHS:" in msg
    assert "CMakeLists.txt:DSV3_FUSED_A_GEMM_ARCHS:748" in msg  # the below-CUDA-13 selection's line
    assert ARM64 + ":" not in msg  # arm64 keeps 10.3


# --- the smoke takes the same path: a whole build on the fake engine -------------------------------


def test_smoke_without_10_3_stops_before_any_compile_and_writes_nothing(plan, checks):  # noqa: F811
    path = plan.matrix_path
    text = path.read_text()
    assert text.count("      - 10.3f\n") == 1
    path.write_text(text.replace("      - 10.3f\n", ""))
    loaded = matrix.load(path)
    assert pipeline.render_all(loaded, ["smoke"], check=False) == {"smoke": "written"}
    dropped = Plan.of(loaded, "smoke")
    engine = FakeEngine()
    with pytest.raises(KernelPlanFailed) as info:
        pipeline.build(dropped, engine, BuildOptions())
    msg = info.value.message
    assert "kernels.required.FUSED_ADD_RMS_NORM_ARCHS: nothing loads on 10.3 (B300, GB300)" in msg
    assert "(CMakeLists.txt:FUSED_ADD_RMS_NORM_ARCHS:146)" in msg and "required.RMS_NORM_ARCHS" not in msg
    assert [e[0] for e in engine.events] == ["preflight", "kernel plan"]  # no build, export or push
    assert _recorded(dropped) is None
    # nothing written for the refused build: no build directory, no log (the writable-probe's
    # empty directories are all there is)
    assert [p for p in (dropped.root / "artifacts").rglob("*") if not p.is_dir()] == []
    assert list((dropped.root / "artifacts" / "smoke").iterdir()) == []


def test_a_hostile_smoke_bump_is_refused_in_the_preflight_running_nothing(plan, checks, smoke_repos, tmp_path):  # noqa: F811
    # the smoke's source moves to a commit whose cmake/utils.cmake runs a command inside the arch
    # selection: the build stops at the kernel plan, naming it; nothing runs, nothing is written
    import git

    src = tmp_path / "hostile-src"
    repo = git.Repo.clone_from(smoke_repos["url"], src, branch=smoke.BRANCH)
    marker = tmp_path / "ran"
    utils = src / "cmake" / "utils.cmake"
    head, sep, rest = utils.read_text().partition("function(cuda_archs_loose_intersection")
    body_start = rest.index(")\n") + 2
    hostile = f'  execute_process(COMMAND touch "{marker}")\n'
    utils.write_text(head + sep + rest[:body_start] + hostile + rest[body_start:])
    repo.index.add(["cmake/utils.cmake"])
    bumped = repo.index.commit("utils: run a command").hexsha
    text = plan.matrix_path.read_text()
    assert text.count(smoke_repos["commit"]) == 1 and smoke_repos["url"] in text
    plan.matrix_path.write_text(text.replace(smoke_repos["commit"], bumped).replace(smoke_repos["url"], src.as_uri()))
    loaded = matrix.load(plan.matrix_path)
    pipeline.render_all(loaded, ["smoke"], check=False)
    moved = Plan.of(loaded, "smoke")
    engine = FakeEngine()
    with pytest.raises(KernelPlanFailed) as info:
        pipeline.build(moved, engine, BuildOptions())
    msg = info.value.message
    assert "the kernel plan cannot be computed (" in msg and "execute_process" in msg, msg
    assert [e[0] for e in engine.events] == ["preflight", "kernel plan"]  # no build, export or push
    assert engine.sandbox.scripts == []  # refused before the sandbox ran anything
    assert not marker.exists() and _recorded(moved) is None
    assert [p for p in (moved.root / "artifacts").rglob("*") if not p.is_dir()] == []


# --- `build plan`: a kernel plan per platform, a column per family ---------------------------------


def _plan_json(matrix_path, *extra: str) -> tuple[int, dict, str]:
    code, out, err = _run("--matrix", str(matrix_path), "--json", "plan", "--target", "cu129", *extra)
    return code, json.loads(out), err


def test_plan_shows_every_platform_s_kernel_plan(upstream, host_cmake):  # noqa: F811
    code, doc, err = _plan_json(upstream["matrix"], "--source")
    assert code == 0, err
    plans = doc["kernel_plans"]
    assert list(plans) == [AMD64, ARM64]
    arm = yaml.safe_load(upstream["matrix"].read_text())["targets"]["cu129"]["platforms"][ARM64]["arch_list"]
    assert plans[ARM64]["arch_list"] == arm and plans[ARM64]["platform"] == ARM64
    assert plans[AMD64]["arch_list"] == ["8.0", "9.0", "10.0", "10.3", "12.0"]
    for p in plans.values():
        decode = {k["name"]: k for k in p["kernels"]}["CMakeLists.txt:K3_DECODE_ARCHS"]
        assert sorted(decode["families"]) == ["10.0", "10.3", "12.0", "9.0"]  # a column per claimed family
    assert doc["kernel_plan"] == plans[AMD64]  # the first platform's, as before, with the fetches
    assert plans[AMD64]["fetches"] and plans[ARM64]["fetches"] == []
    _, out, _ = _run("--matrix", str(upstream["matrix"]), "plan", "--target", "cu129")
    heads = [line.split(":")[0] for line in out.splitlines() if line.startswith("kernel plan (")]
    assert heads == [f"kernel plan ({AMD64})", f"kernel plan ({ARM64})"]
    assert out.count("fetches: ") == 1


def test_plan_fails_naming_the_platform_whose_list_misses_a_family(upstream, host_cmake):  # noqa: F811
    doc = yaml.safe_load(upstream["matrix"].read_text())
    doc["targets"]["cu129"]["platforms"][ARM64]["arch_list"] = ["8.0", "9.0", "10.0", "12.0"]
    upstream["matrix"].write_text(yaml.safe_dump(doc, sort_keys=False, width=4096))
    assert _run("--matrix", str(upstream["matrix"]), "render")[0] == 0
    code, plans, err = _plan_json(upstream["matrix"])
    assert code == 1
    assert plans["kernel_plans"][AMD64]["ok"] and not plans["kernel_plans"][ARM64]["ok"]
    assert f"FAIL: {ARM64}: kernels.required.K3_DECODE_ARCHS: nothing loads on 10.3 (B300)" in err
    assert f"FAIL: {AMD64}" not in err


def test_plan_rehearse_shows_both_platforms_of_cu129(vllm_sdist, host_cmake):  # noqa: F811
    code, doc, err = _plan_json(REPO / "matrix.yaml", "--rehearse")
    assert code == 0, err
    plans = doc["kernel_plans"]
    assert list(plans) == [AMD64, ARM64] and all(p["ok"] for p in plans.values())
    assert "8.6" not in plans[ARM64]["arch_list"] and "7.5" not in plans[ARM64]["arch_list"]
    for p in plans.values():
        kda = {k["name"]: k for k in p["kernels"]}["cmake/external_projects/flashkda.cmake:FLASH_KDA_ARCHS"]
        assert kda["families"]["10.3"] == "10.3a"


# --- what the docs cite at the pin (docs/cu129.md "Known CUDA-12 compile-outs") --------------------


def _line(tree, path: str, number: int) -> str:
    return tree.read(path).decode().splitlines()[number - 1]


def test_the_cited_lines_say_what_the_docs_say(vllm_sdist):  # noqa: F811
    kda, attn = "vllm/models/kimi_k3/nvidia/kda.py", "vllm/models/kimi_k3/nvidia/ops/attn_res.py"
    gemm = "vllm/models/kimi_k3/nvidia/low_latency_gemm.py"
    # KDA decode: auto by default; native needs the op; FlashInfer only when asked; else Triton
    assert "def resolve_kda_decode_backend(" in _line(vllm_sdist, kda, 215)
    assert '"kda_decode_backend", "auto"' in _line(vllm_sdist, kda, 668)
    assert 'hasattr(torch.ops._C, "fused_kda_decode")' in _line(vllm_sdist, kda, 176)
    assert 'backend == "flashinfer"' in _line(vllm_sdist, kda, 258)
    assert _line(vllm_sdist, kda, 267).strip() == 'return "triton"'
    assert _line(vllm_sdist, kda, 261).strip() == 'if backend == "flashinfer":' and "raise RuntimeError(" in _line(
        vllm_sdist, kda, 262
    )
    assert "(10, 0), (10, 3)" in _line(vllm_sdist, kda, 203)
    assert "capability.major in (9, 10, 12)" in _line(vllm_sdist, kda, 281)
    # AttnRes: the native op only on SM100 with the op present; else the Triton kernel, any family
    assert _line(vllm_sdist, attn, 34).strip() == "@triton.jit"
    assert "def _attn_res_kernel(" in _line(vllm_sdist, attn, 35)
    assert 'hasattr(torch.ops._C, "kimi_k3_attn_res")' in _line(vllm_sdist, attn, 200)
    assert "_attn_res_kernel[(num_tokens,)](" in _line(vllm_sdist, attn, 222)
    # CUDA >= 13 gates of both in CMakeLists.txt
    assert "VERSION_GREATER_EQUAL 13.0" in _line(vllm_sdist, "CMakeLists.txt", 1121)
    assert "FUSED_KDA_DECODE_ARCHS" in _line(vllm_sdist, "CMakeLists.txt", 1122)
    assert "VERSION_GREATER_EQUAL 13.0" in _line(vllm_sdist, "CMakeLists.txt", 1152)
    assert "KIMI_K3_ATTN_RES_ARCHS" in _line(vllm_sdist, "CMakeLists.txt", 1153)
    # the low-latency tables: SM103/SM107, SM100, SM90; none for 12.x
    table = "\n".join(_line(vllm_sdist, gemm, n) for n in range(670, 680))
    assert "def _low_latency_table()" in table and "(10, 0)" in table and "(9, 0)" in table
    assert "(12" not in table and _line(vllm_sdist, gemm, 679).strip() == "return None"
    assert "ops.dsv3_fused_a_gemm(g1" in _line(vllm_sdist, gemm, 792)
    assert "_enable_kda_projection_overlap(module)" in _line(vllm_sdist, gemm, 1047)
    # dsv3_fused_a_gemm's other callers: DeepSeek's fused QKV-A projection on 9.0 and 10.x only, GLM-5.2 on 10.3
    dsv2 = "\n".join(_line(vllm_sdist, "vllm/model_executor/models/deepseek_v2.py", n) for n in range(967, 978))
    assert "_use_min_latency_gemm" in dsv2 and "is_device_capability(90)" in dsv2 and "(12" not in dsv2
    assert "is_device_capability_family(100)" in dsv2
    glm = "vllm/models/deepseek_v32/nvidia/glm52_low_latency_gemm.py"
    assert "return current_platform.is_device_capability((10, 3))" in _line(vllm_sdist, glm, 89)
    # FlashMLA: no GIT_SUBMODULES in its FetchContent_Declare, and the compile includes csrc/cutlass
    flashmla = vllm_sdist.read("cmake/external_projects/flashmla.cmake").decode()
    assert "GIT_SUBMODULES" not in flashmla and "${flashmla_SOURCE_DIR}/csrc/cutlass/include" in flashmla


def test_cu129_requires_each_kernel_only_on_the_families_k3_runs_it_on():
    t = _cu129()
    assert t.kernels.families_of("DSV3_FUSED_A_GEMM_ARCHS", t.gpu) == ("9.0", "10.0", "10.3")
    assert t.kernels.families_of("FLASH_KDA_ARCHS", t.gpu) == ("9.0", "10.0", "10.3", "12.0")
    assert t.kernels.families_of("MLA_ARCHS", t.gpu) == ("10.0", "10.3")
    assert t.kernels.families_of("FLASH_MLA_ARCHS", t.gpu) == ("9.0",)
    assert t.source.third_party["flashmla"].submodules == "all"  # as FetchContent does without GIT_SUBMODULES


# --- the per-platform pieces at their edges --------------------------------------------------------


def test_compiled_targets_are_every_platform_whichever_a_plan_builds(tmp_path):
    whole = _target(WITH_103, WITHOUT_103)
    for platform in (None, AMD64, ARM64):
        got = Plan.at(whole, tmp_path, platform).compiled_targets()
        assert [(p, t.cuda.arch_list) for p, t in got] == [(AMD64, tuple(WITH_103)), (ARM64, tuple(WITHOUT_103))]
    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    doc["targets"]["cu129"].pop("platforms")
    doc["targets"]["cu129"]["cpu"].pop(ARM64)  # a claim names only platforms the target builds
    one = parse(yaml.safe_dump(doc, sort_keys=False, width=4096), REPO / "matrix.yaml").target("cu129")
    ((platform, target),) = Plan.at(one, tmp_path, None).compiled_targets()
    assert platform is None and target is one


def test_per_platform_puts_the_fetch_inventory_in_the_first_plan_only(upstream, host_cmake):  # noqa: F811
    from builder.source import planread

    target = parse(upstream["matrix"].read_text(), upstream["matrix"]).target("cu129")
    tree, origin = planread.read_source(target, planread.GIT)
    compiled = Plan.at(target, upstream["matrix"].parent, None).compiled_targets()
    plans = kernelmap.per_platform(tree, compiled, origin, HostCMake())
    assert [bool(p.fetches) for p in plans] == [True, False] and plans[0].stale == ["setup.py:urlopen"]
    bare = kernelmap.per_platform(tree, compiled, origin, HostCMake(), fetch_inventory=False)
    assert [p.fetches for p in bare] == [[], []] and all(p.ok for p in bare)
    assert kernelmap.per_platform(tree, [], origin, HostCMake()) == []


def test_rendering_per_platform(tmp_path):
    plans, _ = _preflight(_target(WITH_103, WITHOUT_103, {"K3_DECODE_ARCHS": ["9.0"]}), tmp_path)
    target = _target(WITH_103, WITHOUT_103, {"K3_DECODE_ARCHS": ["9.0"]})
    lines = kernelmap.render_platforms(plans, target)
    heads = [line for line in lines if line.startswith("kernel plan")]
    assert [h.split(":")[0] for h in heads] == [f"kernel plan ({AMD64})", f"kernel plan ({ARM64})"]
    assert "arch 8.0 9.0 10.0 12.0;" in heads[1] and "arch 8.0 9.0 10.0 10.3 12.0;" in heads[0]
    assert sum(line.startswith("fetches: ") for line in lines) == 1
    decode = [line for line in lines if "K3_DECODE_ARCHS" in line]
    assert decode[0].split()[-6:-2] == ["9.0a", "10.0a", "10.3a", "12.0a"]  # one column per family
    assert decode[1].split()[-6:-2] == ["9.0a", "10.0a", "-", "12.0a"]
    assert all(line.lstrip().startswith("* ") for line in decode)  # marked required
    assert kernelmap.render_platforms([], target) == []
    plans[0].platform = None
    assert kernelmap.kernel_lines(plans[0], target)[0].startswith("kernel plan: ")


def test_missed_with_several_plans_and_no_platform_name():
    a = kernelmap.SourcePlan("o", "12.9.1", ("9.0",), ("9.0",))
    a.failures = ["kernels.required.A_ARCHS: x"]
    b = kernelmap.SourcePlan("o", "12.9.1", ("9.0",), ("9.0",), platform=ARM64)
    b.failures = ["kernels.required.B_ARCHS: y", "the fetch inventory cannot be computed: z"]
    assert kernelmap.missed([a, b]) == ["kernels.required.A_ARCHS: x", f"{ARM64}: kernels.required.B_ARCHS: y"]


def test_the_docker_engine_s_sandbox_is_a_container_on_that_engine():
    from builder.engine.buildx import DockerEngine
    from builder.engine.sandbox import CMakeSandbox

    engine = DockerEngine()
    sandbox = context.cmake_sandbox(engine)
    assert isinstance(sandbox, CMakeSandbox)
    assert sandbox._cli == engine.docker.client_config.docker_cmd  # the build's own engine, not another
    fake = FakeEngine()
    assert isinstance(context.cmake_sandbox(fake), HostCMake) and fake.events == [("kernel plan",)]
