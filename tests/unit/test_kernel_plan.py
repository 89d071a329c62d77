"""The kernel plan, the fetch inventory and the bump report on small upstream-shaped git repositories
(a vLLM-shaped CMakeLists.txt with an `a`-list intersection under a CUDA-version gate, a FetchContent
dependency, a setup.py): cmake -P really runs (the pinned cmake wheel), git really moves the branch."""

from __future__ import annotations

import contextlib
import io
import json

import git
import pytest
import yaml

from builder import cli
from builder.config.matrix import parse
from builder.errors import ConfigError, SourceError
from builder.source import fetches, kernelmap, kernelplan
from builder.source.cmakefile import commands, printable
from builder.source.sdist import SdistSource
from tests.conftest import REPO
from tests.unit.cmakehost import HostCMake, host_cmake  # noqa: F401 - the module's fixture

# An upstream-shaped helper (the fixture's own, not vLLM's): keep x.ya / x.yf when x.y was asked for.
UTILS = """\
function(cuda_archs_loose_intersection OUT_CUDA_ARCHS SRC_CUDA_ARCHS TGT_CUDA_ARCHS)
  set(_out)
  foreach(_arch ${SRC_CUDA_ARCHS})
    string(REGEX REPLACE "[af]$" "" _base "${_arch}")
    if("${_base}" IN_LIST TGT_CUDA_ARCHS)
      list(APPEND _out "${_arch}")
    endif()
  endforeach()
  set(${OUT_CUDA_ARCHS} ${_out} PARENT_SCOPE)
endfunction()
"""

DECODE = """\
if(${CMAKE_CUDA_COMPILER_VERSION} VERSION_GREATER_EQUAL 13.0)
  cuda_archs_loose_intersection(K3_DECODE_ARCHS "9.0a;10.0f;12.0f" "${CUDA_ARCHS}")
else()
  cuda_archs_loose_intersection(K3_DECODE_ARCHS "9.0a;10.0a;10.3a;12.0a" "${CUDA_ARCHS}")
endif()
"""

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.26)
project(k3smoke LANGUAGES CXX)
include(${CMAKE_CURRENT_LIST_DIR}/cmake/utils.cmake)
include(FetchContent)
FetchContent_Declare(k3kernels GIT_REPOSITORY https://example.org/k3kernels.git GIT_TAG v1)
%DECODE%
cuda_archs_loose_intersection(K3_GEMM_ARCHS "8.0;9.0a" "${CUDA_ARCHS}")
if(VLLM_GPU_LANG STREQUAL "CUDA")
  include(cmake/external_projects/extra.cmake)
endif()
"""

SETUP = 'from setuptools import setup\nsetup(ext_modules=[CMakeExtension(name="vllm._C_stable_libtorch")])\n'

EXTRA = "# nothing fetched yet\nset(EXTRA_SUPPORT_ARCHS)\n"

GPU = {
    "families": {"9.0": "H100", "10.0": "B200", "10.3": "B300", "12.0": "RTX PRO 6000"},
    "driver_floor": "575.51.03",
}
K3KERNELS = {
    "url": "https://example.org/k3kernels.git",
    "ref": "v1",
    "commit": "0123456789abcdef0123456789abcdef01234567",
    "declared_in": "CMakeLists.txt",
    "fetchcontent": "k3kernels",
}
ARCHS_103 = ["8.0", "9.0", "10.0", "10.3", "12.0"]

pytestmark = pytest.mark.usefixtures("host_cmake")


def _cu129_doc(arch_list: list[str]) -> dict:
    """matrix.yaml as data, cu129 with ``arch_list`` and the families above (whatever main's entry says)."""
    doc = yaml.safe_load((REPO / "matrix.yaml").read_text())
    t = doc["targets"]["cu129"]
    t["cuda"]["arch_list"] = arch_list
    t["gpu"] = {"families": dict(GPU["families"]), "driver_floor": GPU["driver_floor"]}
    return doc


def _matrix_text(url: str, commit: str, arch_list: list[str] = ARCHS_103) -> str:
    doc = _cu129_doc(arch_list)
    src = doc["targets"]["cu129"]["source"]
    src.update(url=url, branch="k3", commit=commit)
    src["third_party"] = {**src.get("third_party", {}), "k3kernels": K3KERNELS}
    doc["targets"]["cu129"]["kernels"] = {
        "required": {"K3_DECODE_ARCHS": ["9.0", "10.0", "10.3", "12.0"]},
        "fetch_waivers": {"setup.py:urlopen": "precompiled wheels only"},
    }
    return yaml.safe_dump(doc, sort_keys=False, width=4096)


@pytest.fixture()
def upstream(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("K3_ALLOW_FILE_URLS", "1")
    git.Repo.init(tmp_path / "upstream.git", bare=True, initial_branch="k3")
    work_dir = tmp_path / "work"
    work = git.Repo.clone_from(str(tmp_path / "upstream.git"), work_dir)
    work.git.checkout("-q", "-b", "k3")

    def commit(message: str, files: dict[str, str]) -> str:
        for rel, text in files.items():
            (work_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (work_dir / rel).write_text(text)
        work.git.add(A=True)
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.org", "GIT_COMMITTER_NAME": "t"}
        with work.git.custom_environment(**env, GIT_COMMITTER_EMAIL="t@e.org"):
            work.git.commit("-q", "-m", message)
        work.git.push("-q", "origin", "HEAD:refs/heads/k3", "--force")
        return work.head.commit.hexsha

    first = commit(
        "K3: base",
        {
            "CMakeLists.txt": CMAKELISTS.replace("%DECODE%", DECODE),
            "cmake/utils.cmake": UTILS,
            "cmake/external_projects/extra.cmake": EXTRA,
            "setup.py": SETUP,
            "requirements/cuda.txt": "numpy==2.0.0\n",
            "requirements/build/cuda.txt": "cmake>=3.26.1\n",
        },
    )
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(_matrix_text(f"file://{tmp_path}/upstream.git", first))
    assert _run("--matrix", str(matrix), "render")[0] == 0
    return {"matrix": matrix, "commit": commit, "first": first}


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _track(matrix) -> tuple[int, str, dict]:
    code, _, err = _run("--matrix", str(matrix), "track", "--target", "cu129", "--check")
    _, out, _ = _run("--matrix", str(matrix), "--json", "track", "--target", "cu129", "--check")
    return code, err, json.loads(out)["report"]


def test_plan_at_the_pin_runs_the_upstream_helper(upstream):
    code, out, err = _run("--matrix", str(upstream["matrix"]), "--json", "plan", "--target", "cu129", "--source")
    assert code == 0, err
    plan = json.loads(out)["kernel_plan"]
    kernels = {k["name"]: k for k in plan["kernels"]}
    decode = kernels["CMakeLists.txt:K3_DECODE_ARCHS"]
    assert decode["archs"] == ["9.0a", "10.0a", "10.3a", "12.0a"] and decode["built"]
    assert decode["families"] == {"9.0": "9.0a", "10.0": "10.0a", "10.3": "10.3a", "12.0": "12.0a"}
    assert kernels["CMakeLists.txt:K3_GEMM_ARCHS"]["families"] == {"9.0": "9.0a", "10.0": "", "10.3": "", "12.0": ""}
    assert [f["status"] for f in plan["fetches"]] == ["pinned"]
    assert plan["stale_waivers"] == ["setup.py:urlopen"]


def test_bump_with_an_unpinned_fetch_is_named_with_file_and_line(upstream):
    extra = (
        EXTRA + "FetchContent_Declare(\n  newdep\n  GIT_REPOSITORY https://example.org/newdep.git\n  GIT_TAG main)\n"
    )
    upstream["commit"]("K3: a new dependency", {"cmake/external_projects/extra.cmake": extra})
    code, err, report = _track(upstream["matrix"])
    assert code == 1
    assert "cmake/external_projects/extra.cmake:3: FetchContent_Declare newdep" in err
    assert report["new_fetches"][0].startswith("UNPINNED: cmake/external_projects/extra.cmake:3")
    assert not report["ready"] and report["blocking"][0].startswith("unpinned fetch")
    assert report["new_gates"] == [] and report["arch_changes"] == []


def test_bump_gating_a_required_kernel_behind_cuda_13(upstream):
    gated = DECODE.split("else()")[0] + "endif()\n"
    upstream["commit"]("K3: decode needs CUDA 13", {"CMakeLists.txt": CMAKELISTS.replace("%DECODE%", gated)})
    code, err, report = _track(upstream["matrix"])
    assert code == 1
    assert "kernels.required.K3_DECODE_ARCHS: nothing loads on 9.0" in err
    assert "VERSION_GREATER_EQUAL 13.0) at CMakeLists.txt:6" in err
    assert any(
        "K3_DECODE_ARCHS (line 7): no longer built under CUDA 12.9.1" in g and "GREATER_EQUAL 13.0" in g
        for g in report["new_gates"]
    )
    changes = {(c["family"], c["was"], c["now"]) for c in report["arch_changes"]}
    assert ("10.3", "10.3a", "") in changes and ("9.0", "9.0a", "") in changes
    assert not report["ready"]


def test_bump_dropping_an_arch_loses_b300(upstream):
    dropped = DECODE.replace("9.0a;10.0a;10.3a;12.0a", "9.0a;10.0a;12.0a")
    upstream["commit"](
        "K3: trim the decode list",
        {
            "CMakeLists.txt": CMAKELISTS.replace("%DECODE%", dropped),
            "requirements/cuda.txt": "numpy==2.0.0\nk3-extra==1.0\n",
            "setup.py": SETUP.replace("]", ', CMakeExtension(name="vllm._k3_new_C")]'),
        },
    )
    code, err, report = _track(upstream["matrix"])
    assert code == 1
    assert "kernels.required.K3_DECODE_ARCHS: nothing loads on 10.3 (B300)" in err
    assert "CMakeLists.txt:K3_DECODE_ARCHS:9" in err
    assert report["arch_changes"] == [
        {"kernel": "CMakeLists.txt:K3_DECODE_ARCHS", "family": "10.3", "was": "10.3a", "now": ""}
    ]
    assert report["new_modules"] == ["vllm._k3_new_C"] and report["new_requirements"] == ["k3-extra==1.0"]


def test_bump_report_goes_to_the_file_and_the_job_summary(upstream, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    dropped = DECODE.replace("9.0a;10.0a;10.3a;12.0a", "9.0a;10.0a;12.0a")
    upstream["commit"]("K3: trim", {"CMakeLists.txt": CMAKELISTS.replace("%DECODE%", dropped)})
    code, out, err = _run(
        "--matrix", str(upstream["matrix"]), "--json", "track", "--target", "cu129", "--report", str(tmp_path / "r.md")
    )
    assert code == 0, err
    assert json.loads(out)["ready"] is False
    body = (tmp_path / "r.md").read_text()
    assert "**Not ready:**" in body and "| CMakeLists.txt:K3\\_DECODE\\_ARCHS | 10.3 | 10.3a | - |" in body
    assert summary.read_text() == body


def test_plain_bump_is_ready(upstream):
    upstream["commit"]("K3: docs", {"README.md": "hello\n"})
    code, _, report = _track(upstream["matrix"])
    assert code == 1 and report["ready"] and report["blocking"] == []
    assert report["new_fetches"] == report["new_gates"] == report["arch_changes"] == []


def test_preflight_refuses_an_unpinned_fetch(upstream):
    matrix = parse(upstream["matrix"].read_text(), upstream["matrix"])
    target = matrix.target("cu129")
    tree = SdistSource(target.source.commit, {"setup.py": b'import os\nos.system("curl -o x https://e.org/x")\n'}, "u")
    with pytest.raises(SourceError, match=r"setup\.py:2: python curl .* not in source\.third_party"):
        fetches.check(tree, target)


def test_a_required_family_must_be_claimed(upstream):
    doc = yaml.safe_load(upstream["matrix"].read_text())
    doc["targets"]["cu129"]["kernels"]["required"]["K3_DECODE_ARCHS"] = ["8.6"]
    with pytest.raises(ConfigError, match=r"kernels\.required\.K3_DECODE_ARCHS: 8\.6 is not a family in gpu\.families"):
        parse(yaml.safe_dump(doc, sort_keys=False), upstream["matrix"])


def _tree(files: dict[str, str]) -> SdistSource:
    return SdistSource("x", {k: v.encode() for k, v in files.items()}, "u")


def test_utils_that_would_run_a_command_is_never_run(tmp_path):
    marker = tmp_path / "ran"
    utils = UTILS.replace("  set(_out)\n", f'  set(_out)\n  file(WRITE "{marker}" x)\n')
    tree = _tree({"CMakeLists.txt": CMAKELISTS.replace("%DECODE%", DECODE), "cmake/utils.cmake": utils})
    with pytest.raises(SourceError, match=r"cmake/utils\.cmake:3: cuda_archs_loose_intersection\(\) runs file\(\)"):
        kernelplan.replay(tree)
    top = _tree({"CMakeLists.txt": "x()\n", "cmake/utils.cmake": 'execute_process(COMMAND touch "x")\n' + UTILS})
    with pytest.raises(SourceError, match=r"cmake/utils\.cmake:1: top-level command execute_process"):
        kernelplan.replay(top)
    assert not marker.exists()


# The second line behind the sandbox (issue 49): every command that runs, downloads, reads or
# writes outside the script is refused, at any depth of helpers, before anything runs.
FORBIDDEN = [
    'execute_process(COMMAND touch "{m}")',
    'exec_program(touch ARGS "{m}")',
    'file(WRITE "{m}" x)',
    'file(DOWNLOAD "https://example.org/x" "{m}")',
    'file(READ "/etc/passwd" _x)',
    'file(GLOB _x "/*")',
    'include("/etc/hosts")',
    "include(FetchContent)",
    'cmake_language(CALL execute_process COMMAND touch "{m}")',
    'cmake_language(EVAL CODE "file(WRITE {m} x)")',
    'configure_file("/etc/passwd" "{m}")',
    'try_run(_r _c "{m}" "/etc/x.c")',
    'add_custom_command(OUTPUT "{m}" COMMAND touch "{m}")',
    'load_cache("/tmp" READ_WITH_PREFIX x A)',
    "find_package(Python)",
    'make_directory("{m}")',
    'write_file("{m}" x)',
    'ctest_run_script("{m}")',
    'get_filename_component(_x "/etc/passwd" REALPATH)',
]


def _nested(body: str, depth: int) -> str:
    """UTILS whose public helper calls ``depth`` levels of helpers, the deepest running ``body``."""
    levels = [f"function(k3_level_{depth})\n  {body}\nendfunction()\n"]
    for i in range(depth - 1, 0, -1):
        levels.append(f"function(k3_level_{i})\n  k3_level_{i + 1}()\nendfunction()\n")
    call = "  k3_level_1()\n" if depth else f"  {body}\n"
    return "".join(levels if depth else []) + UTILS.replace("  set(_out)\n", "  set(_out)\n" + call)


@pytest.mark.parametrize("body", FORBIDDEN)
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_every_command_that_leaves_the_script_is_refused_at_any_depth(tmp_path, body, depth):
    marker = tmp_path / "ran"
    utils = _nested(body.replace("{m}", str(marker)), depth)
    tree = _tree({"CMakeLists.txt": CMAKELISTS.replace("%DECODE%", DECODE), "cmake/utils.cmake": utils})
    name = body.split("(")[0]
    with pytest.raises(SourceError, match=rf"\(\) runs {name}\(\), which the kernel plan does not run"):
        kernelplan.replay(tree)
    assert not marker.exists()


def test_a_helper_named_like_a_command_cannot_hide_one():
    # a function the tree defines may be called; its own body is checked like every other
    utils = "function(safe_name)\n  execute_process(COMMAND true)\nendfunction()\n" + UTILS.replace(
        "  set(_out)\n", "  set(_out)\n  SAFE_NAME()\n"
    )
    tree = _tree({"CMakeLists.txt": CMAKELISTS.replace("%DECODE%", DECODE), "cmake/utils.cmake": utils})
    with pytest.raises(SourceError, match=r"safe_name\(\) runs execute_process\(\)"):
        kernelplan.replay(tree)


def test_the_script_reaches_the_sandbox_on_stdin_with_utils_inlined():
    tree = _tree({"CMakeLists.txt": CMAKELISTS.replace("%DECODE%", DECODE), "cmake/utils.cmake": UTILS})
    rp, utils = kernelplan.replay(tree)
    sandbox = HostCMake()
    values = kernelplan.run_cmake(rp, utils, "12.9.1", ("9.0", "10.0"), sandbox)
    (sent,) = sandbox.scripts
    assert UTILS.encode() in sent and b"include(" not in sent  # no file of the tree is needed where it runs
    assert values


def test_no_engine_means_no_plan_exit_3_and_cmake_never_runs_here(monkeypatch, tmp_path):
    from builder.engine.sandbox import CMakeSandbox
    from builder.errors import EngineUnavailable

    ran: list = []
    monkeypatch.setattr("builder.engine.sandbox.run_capped", lambda *a, **k: ran.append(a))
    sandbox = CMakeSandbox(["docker", "-H", f"unix://{tmp_path}/no-engine.sock"], kernelplan.cmake_data())
    with pytest.raises(EngineUnavailable) as info:
        sandbox.run(b"message(STATUS x)\n", 10)
    assert info.value.exit_code == 3 and not ran


def test_cmake_text_is_bounded_and_shown_escaped():
    with pytest.raises(SourceError, match=r"x\.cmake:2: unclosed parenthesis"):
        commands(b"set(A 1)\nset(B\n", "x.cmake")
    with pytest.raises(SourceError, match=r"x\.cmake:1: unclosed quoted argument"):
        commands(b'set(A "1)\n', "x.cmake")
    cmds = commands(b'#[[ set(NO 1) ]]\nset(A "x;y" [=[z]=]) # c\n', "x.cmake")
    assert [(c.name, c.words(), c.line) for c in cmds] == [("set", ["A", "x;y", "z"], 2)]
    assert printable("a\x1b[31m|b\n") == "a\\x1b[31m\\|b\\n"


def test_loading_rules():
    assert kernelmap.covers("10.0a", "10.3") is None and kernelmap.covers("10.3a", "10.3") == "sass"
    assert kernelmap.covers("10.0f", "10.3") == "sass" and kernelmap.covers("10.3f", "10.0") is None
    assert kernelmap.covers("8.0", "8.6") == "sass" and kernelmap.covers("8.0", "9.0") is None
    assert kernelmap.covers("8.0+PTX", "9.0") == "ptx" and kernelmap.covers("9.0+PTX", "8.0") is None


def _kernel(*archs: str) -> kernelmap.Kernel:
    """One reached selection of a variable whose computed archs are ``archs``, in that order."""
    sel = kernelplan.Selection("K_ARCHS", "CMakeLists.txt", 7, 1, "cuda_archs_loose_intersection", "", (), None)
    return kernelmap.Kernel("K_ARCHS", "CMakeLists.txt", [kernelplan.Result(sel, archs, True)], None)


@pytest.mark.parametrize(
    "archs,cc,named",
    [
        # several SASS archs load on one family: code built for exactly that one is named, in either order
        (("10.0f", "10.3a"), "10.3", "10.3a"),
        (("10.3a", "10.0f"), "10.3", "10.3a"),
        (("10.0", "10.3a"), "10.3", "10.3a"),
        (("10.0+PTX", "10.3a"), "10.3", "10.3a"),
        (("10.3a", "10.0+PTX"), "10.3", "10.3a"),
        # no exact one: the newest that loads, in either order
        (("10.0f", "10.1f"), "10.3", "10.1f"),
        (("10.1f", "10.0f"), "10.3", "10.1f"),
        # one that loads, its +PTX kept; SASS before any PTX
        (("10.0+PTX",), "10.3", "10.0+PTX"),
        (("9.0+PTX", "10.0f"), "10.3", "10.0f"),
        (("10.0f", "9.0+PTX"), "10.3", "10.0f"),
        # only PTX: the last listed (upstream lists ascending: the newest), JIT
        (("8.0+PTX",), "10.0", "8.0+PTX (JIT)"),
        (("8.0+PTX", "9.0+PTX"), "10.0", "9.0+PTX (JIT)"),
        # nothing loads
        (("12.0a",), "12.1", ""),
        (("10.0a", "10.1a"), "10.3", ""),
        (("10.3f",), "10.0", ""),
        ((), "10.3", ""),
    ],
)
def test_kernel_on_names_what_loads_exact_first(archs, cc, named):
    assert _kernel(*archs).on(cc) == named


def test_fetch_inventory_kinds():
    files = {
        "CMakeLists.txt": (
            "FetchContent_Declare(local SOURCE_DIR /x)\n"
            "ExternalProject_Add(ep URL https://e.org/ep.tgz)\n"
            "file(DOWNLOAD https://e.org/f f)\n"
            "execute_process(COMMAND ${GIT_EXECUTABLE} clone https://e.org/r WORKING_DIRECTORY x)\n"
            "execute_process(COMMAND git rev-parse HEAD)\n"
        ),
        "setup.py": "import requests\nrequests.get('https://e.org')\ncmd = ['wget', 'u']\n",
        "tools/broken.py": "def (:\n",
    }
    target = parse((REPO / "matrix.yaml").read_text(), REPO / "matrix.yaml").target("cu129")
    found = [(f.file, f.line, f.kind, f.name) for f in fetches.inventory(_tree(files), sorted(files), target)]
    assert found == [
        ("CMakeLists.txt", 2, "ExternalProject_Add", "ep"),
        ("CMakeLists.txt", 3, "file(DOWNLOAD)", "DOWNLOAD"),
        ("CMakeLists.txt", 4, "execute_process", "git-clone"),
        ("setup.py", 2, "python", "requests.get"),
        ("setup.py", 3, "python", "wget"),
        ("tools/broken.py", 1, "python", "unreadable"),
    ]


@pytest.fixture(scope="module")
def vllm_sdist():
    """vLLM 0.30.0's sdist from PyPI (cached under ~/.cache/k3-builder/sdist), tied to the pin."""
    from builder.errors import Unreachable
    from builder.source.sdist import sdist_source

    target = parse((REPO / "matrix.yaml").read_text(), REPO / "matrix.yaml").target("cu129")
    try:
        return sdist_source(target.source)
    except Unreachable as exc:
        pytest.skip(f"PyPI unreachable: {exc.message}")


def _cu129(arch_list: list[str]):
    """matrix.yaml's cu129 as it is (its pin, its fetch waivers), with families and two required kernels."""
    doc = _cu129_doc(arch_list)
    kernels = doc["targets"]["cu129"].setdefault("kernels", {})
    families = ["9.0", "10.0", "10.3", "12.0"]
    kernels["required"] = {"FLASH_KDA_ARCHS": list(families), "DSV3_FUSED_A_GEMM_ARCHS": list(families)}
    return parse(yaml.safe_dump(doc, sort_keys=False, width=4096), REPO / "matrix.yaml").target("cu129")


def test_vllm_030_sdist_plan_with_and_without_10_3(vllm_sdist):
    with_103 = _cu129(["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0"])
    plan = kernelmap.compute(vllm_sdist, with_103, "sdist", HostCMake())
    flashkda = plan.kernel("FLASH_KDA_ARCHS")[0]
    dsv3 = plan.kernel("DSV3_FUSED_A_GEMM_ARCHS")[0]
    assert flashkda.file == "cmake/external_projects/flashkda.cmake"
    assert flashkda.archs == dsv3.archs == ("9.0a", "10.0a", "10.3a", "12.0a")
    assert flashkda.on("10.3") == dsv3.on("10.3") == "10.3a"
    assert not plan.kernel("KIMI_K3_ATTN_RES_ARCHS")[0].reached  # CUDA >= 13.0 only at v0.30.0
    assert plan.kernel("FLASH_MLA_ARCHS")[0].on("10.3") == "10.0f"
    # Every fetch at the pin is pinned (the ten third-party trees) or waived in matrix.yaml.
    assert sorted({f.pinned_by for f in plan.fetches if f.pinned_by}) == sorted(with_103.source.third_party)
    assert [f.key for f in plan.fetches if f.status == "UNPINNED"] == [] and plan.stale == []
    assert plan.ok, plan.failures
    without = kernelmap.compute(
        vllm_sdist, _cu129(["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]), "sdist", HostCMake()
    )
    lost = [f for f in without.failures if f.startswith("kernels.required")]
    assert len(lost) == 2 and all("nothing loads on 10.3 (B300)" in f for f in lost)
    assert without.kernel("FLASH_KDA_ARCHS")[0].archs == ("9.0a", "10.0a", "12.0a")


@pytest.mark.parametrize(
    "smuggled",
    [
        # '#' mid-word starts a comment to CMake too: the arguments run on into the next lines.
        'set(X_ARCHS b#c)\nexecute_process(COMMAND touch "{m}")\n)\n',
        # A quoted run inside an unquoted word hides ')' from a reader that splits at spaces.
        'set(X_ARCHS b"c "\n) execute_process(COMMAND touch "{m}") #")\n',
    ],
)
def test_no_command_is_smuggled_past_the_reader(tmp_path, smuggled):
    marker = tmp_path / "ran"
    cmake = CMAKELISTS.replace("%DECODE%", DECODE) + smuggled.replace("{m}", str(marker))
    tree = _tree({"CMakeLists.txt": cmake, "cmake/utils.cmake": UTILS})
    try:
        rp, utils = kernelplan.replay(tree)
    except SourceError as exc:
        assert "quotes inside an unquoted argument" in exc.message
    else:
        # CMake reads the text as this reader does: set()'s arguments, never a command of its own.
        values = kernelplan.run_cmake(rp, utils, "12.9.1", ("9.0", "10.0"), HostCMake())
        assert values
    assert not marker.exists()


def test_oversized_and_hostile_text_is_bounded_and_escaped():
    with pytest.raises(SourceError, match=r"4194305 bytes, over the 4194304 a CMake file may have"):
        commands(b" " * (4 * 1024 * 1024 + 1), "CMakeLists.txt")
    target = parse((REPO / "matrix.yaml").read_text(), REPO / "matrix.yaml").target("cu129")
    tree = _tree(
        {"CMakeLists.txt": 'FetchContent_Declare("evil\x1b]0;x\x07" GIT_REPOSITORY "https://e.org/\x1b[2J")\n'}
    )
    (found,) = fetches.inventory(tree, ["CMakeLists.txt"], target)
    shown = found.describe()
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;x\\x07" in shown


def test_a_build_file_the_reader_refuses_blocks_the_bump(upstream):
    upstream["commit"]("K3: broken", {"cmake/external_projects/extra.cmake": "FetchContent_Declare(x GIT_REPOSITORY\n"})
    code, err, report = _track(upstream["matrix"])
    assert code == 1 and not report["ready"]
    assert any(
        "fetch inventory cannot be computed" in b and "extra.cmake:1: unclosed parenthesis" in b
        for b in report["blocking"]
    )


def test_plain_plan_reads_the_pin_and_then_stays_offline(upstream, tmp_path):
    """Plain `build plan` prints the kernel plan: fetched on first use, then from the local mirror
    with the git host gone (no network), and the mirror's copy is still upstream's own files."""
    matrix = str(upstream["matrix"])
    code, out, err = _run("--matrix", matrix, "--json", "plan", "--target", "cu129")
    assert code == 0, err
    first = json.loads(out)["kernel_plan"]
    assert first["origin"].startswith("git file://") and "(local mirror)" not in first["origin"]
    (tmp_path / "upstream.git").rename(tmp_path / "gone.git")
    code, out, err = _run("--matrix", matrix, "--json", "plan", "--target", "cu129")
    assert code == 0, err
    again = json.loads(out)["kernel_plan"]
    assert again["origin"].endswith("(local mirror)")
    assert again["kernels"] == first["kernels"] and again["fetches"] == first["fetches"]
    # --source insists on the git host: gone, it says so (exit 2: a file:// path is input, not the network).
    assert _run("--matrix", matrix, "plan", "--target", "cu129", "--source")[0] == 2


def test_plain_plan_without_the_pin_in_the_mirror_needs_the_host(upstream, tmp_path):
    """A pin the mirror does not hold, from a host out of reach: exit 3, one line naming --rehearse;
    --no-source reads only local files and says the kernel plan was not read."""
    text = upstream["matrix"].read_text().replace(f"file://{tmp_path}/upstream.git", "https://127.0.0.1:9/k3.git")
    upstream["matrix"].write_text(text)
    code, _, err = _run("--matrix", str(upstream["matrix"]), "plan", "--target", "cu129")
    assert code == 3, err
    (line,) = [ln for ln in err.splitlines() if "127.0.0.1:9" in ln]
    assert "`build plan --target cu129 --rehearse` reads it from PyPI's sdist" in line and "--no-source" in line
    code, out, err = _run("--matrix", str(upstream["matrix"]), "plan", "--target", "cu129", "--no-source")
    assert code == 0, err
    assert "kernel plan" in out and "not read (--no-source)" in out
