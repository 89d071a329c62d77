"""The probe scripts themselves (builder/checks/probes/), run on this machine the way the checks run them
in an image (`python -c <script> <request>`), against trees these tests make: real ELF files
from the C compiler, real symlinks and packages, a real argparse CLI with registries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.checks import probes
from builder.config import contract

CC = shutil.which("cc") or shutil.which("gcc")


RUNS_MAIN = '\nif __name__ == "__main__":\n    report(main)'


def probe_script(name: str, scan_root: Path | None = None, sys_path_under: Path | None = None) -> str:
    """The probe's script; with ``scan_root``, its search for CUDA runtimes (facts, loaded) starts
    there instead of at / (on the host, / is the whole machine: tens of seconds per run). With
    ``sys_path_under``, sys.path keeps only the entries under that directory once the probe's own
    imports are done: the privilege probe walks every sys.path directory recursively, and on the host
    those are the standard library and the venv (138,000 paths, 2.5 s of CPU a run)."""
    script = probes.script(name)
    if scan_root is not None:
        assert '\nSCAN_ROOT = "/"\n' in script, "the probe no longer starts its search at SCAN_ROOT"
        script = script.replace('\nSCAN_ROOT = "/"\n', f"\nSCAN_ROOT = {str(scan_root)!r}\n", 1)
    if sys_path_under is not None:
        assert script.endswith(RUNS_MAIN + "\n"), "the probe no longer ends by running main"
        keep = f"\n_sys.path[:] = [p for p in _sys.path if p.startswith({str(sys_path_under) + '/'!r})]\n"
        script = script.removesuffix(RUNS_MAIN + "\n") + keep + RUNS_MAIN + "\n"
    return script


def run(
    name: str,
    request: dict,
    env: dict | None = None,
    *,
    python: str | None = None,
    scan_root: Path | None = None,
    sys_path_under: Path | None = None,
) -> dict:
    """The probe ``name`` run on the host, as the checks run it in an image. ``python``: another
    interpreter (an empty venv: the host's own venv has dozens of console scripts, each imported by
    `starts`); ``scan_root``: where the CUDA-runtime search starts instead of the host's whole /;
    ``sys_path_under``: the only sys.path entries the probe sees (probe_script says why)."""
    script = probe_script(name, scan_root, sys_path_under)
    proc = subprocess.run(
        [python or sys.executable, "-c", script, json.dumps(request)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        # A bound, not a speed target: without ``scan_root`` the `loaded` probe walks the whole
        # file system it runs on (an image's; here the host's: 50 s idle on the CI machine).
        timeout=600,
    )
    found = probes.parse(proc.stdout)
    assert found is not None, proc.stderr
    return found


def compile_so(out: Path, *, soname: str | None = None, needs: tuple[Path, ...] = (), runpath: str | None = None):
    if CC is None:
        pytest.skip("no C compiler on this machine")
    src = out.with_suffix(".c")
    src.write_text(f"int {out.stem.replace('.', '_').replace('-', '_')}_fn(void) {{ return 1; }}\n")
    cmd = [CC, "-shared", "-fPIC", "-o", str(out), str(src)]
    if soname:
        cmd.append(f"-Wl,-soname,{soname}")
    for lib in needs:  # link against the file itself: NEEDED is its soname
        cmd += ["-Wl,--no-as-needed", str(lib)]
    if runpath:
        cmd.append(f"-Wl,--enable-new-dtags,-rpath,{runpath}")
    subprocess.run(cmd, check=True, capture_output=True)
    src.unlink()
    return out


def elf_request(root: Path, **kw) -> dict:
    return {
        "roots": [str(root)],
        "ld_library_path": "",
        "cuda_major": 12,
        "tracking": list(contract.CUDA_TRACKING_LIBS),
        **kw,
    }


def test_marker_parsing_ignores_what_packages_print():
    assert probes.parse('INFO vllm: hello\nK3-PROBE {"a": 1}\n') == {"a": 1}
    assert probes.parse('K3-PROBE {"a": 1}\nK3-PROBE {"a": 2}') == {"a": 2}
    assert probes.parse("Traceback ...") is None
    assert probes.parse("K3-PROBE not json") is None
    assert probes.parse("K3-PROBE [1]") is None


def test_the_cuda_runtime_search_starts_at_scan_root_and_finds_what_is_under_it(tmp_path):
    """What the probe tests with ``scan_root`` rely on: the facts probe lists the CUDA runtimes under
    SCAN_ROOT (a file that does not load is listed with its error) and nothing outside it."""
    inside, outside = tmp_path / "image", tmp_path / "outside"
    for top in (inside / "usr/lib", outside):
        top.mkdir(parents=True)
        (top / "libcudart.so.12").write_bytes(b"not an ELF file")
    found = run("facts", {"modules": [], "ops": [], "absent": []}, scan_root=inside)
    assert set(found["libs"]) == {str(inside / "usr/lib/libcudart.so.12")}, found["errors"]
    assert "OSError" in found["libs"][str(inside / "usr/lib/libcudart.so.12")]["error"]


def test_elf_resolves_runpath_origin_and_reports_what_nothing_provides(tmp_path):
    lib = tmp_path / "pkg" / "lib"
    lib.mkdir(parents=True)
    dep = compile_so(lib / "libk3dep.so.1", soname="libk3dep.so.1")
    compile_so(tmp_path / "pkg" / "ok.so", needs=(dep,), runpath="$ORIGIN/lib")
    # The same library needed without a RUNPATH: found only because the image carries it (torch's
    # preload pattern), which counts.
    compile_so(tmp_path / "pkg" / "preloaded.so", needs=(dep,))
    gone = compile_so(tmp_path / "libk3gone.so.2", soname="libk3gone.so.2")
    compile_so(tmp_path / "pkg" / "broken.so", needs=(gone,))
    gone.unlink()
    found = run("elf", elf_request(tmp_path / "pkg"))
    assert found["elves"] == 4 and found["preloaded"] == 1
    assert found["unresolved"] == [
        {"path": str(tmp_path / "pkg" / "broken.so"), "needed": "libk3gone.so.2", "dist": None}
    ]
    assert found["other_major"] == []


def test_elf_flags_a_cuda_library_of_another_major_even_when_present(tmp_path):
    cudart13 = compile_so(tmp_path / "libcudart.so.13", soname="libcudart.so.13")
    nvrtc_builtins = compile_so(tmp_path / "libnvrtc-builtins.so.13.0", soname="libnvrtc-builtins.so.13.0")
    cufft11 = compile_so(tmp_path / "libcufft.so.11", soname="libcufft.so.11")  # cufft numbers its own
    compile_so(tmp_path / "ext.so", needs=(cudart13, nvrtc_builtins, cufft11), runpath="$ORIGIN")
    found = run("elf", elf_request(tmp_path))
    assert sorted(e["needed"] for e in found["other_major"]) == ["libcudart.so.13", "libnvrtc-builtins.so.13.0"]
    assert found["unresolved"] == []
    assert run("elf", elf_request(tmp_path, cuda_major=13))["other_major"] == []


def test_elf_follows_ld_library_path_and_the_ld_cache(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dep = compile_so(elsewhere / "libk3far.so.3", soname="libk3far.so.3")
    app = tmp_path / "app"
    app.mkdir()
    compile_so(app / "ext.so", needs=(dep,))
    assert [e["needed"] for e in run("elf", elf_request(app))["unresolved"]] == ["libk3far.so.3"]
    assert run("elf", elf_request(app, ld_library_path=str(elsewhere)))["unresolved"] == []
    libc = compile_so(app / "libc_user.so", needs=())  # libc.so.6 comes from the ld cache / default dirs
    assert libc.exists() and run("elf", elf_request(app, ld_library_path=str(elsewhere)))["unresolved"] == []


def test_hygiene_finds_dangling_links_links_into_build_paths_and_named_build_paths(tmp_path):
    root = tmp_path / "opt"
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    os.symlink("/third_party/fa/flash_attn/cute", root / "lib" / "cute")  # FA4's developer-mode symlink
    os.symlink("../bin", root / "lib" / "fine")
    build = tmp_path / "src"  # stands in for a build-only root that exists here
    build.mkdir()
    os.symlink(str(build), root / "lib" / "into-build")
    tool = root / "bin" / "tool"
    tool.write_text("#!/build/venv/bin/python\nprint(1)\n")
    tool.chmod(0o755)
    (root / "lib" / "x.pth").write_text("/src/k3smoke\n")
    (root / "lib" / "direct_url.json").write_text('{"url": "file:///build/dist/k3smoke-0.1.0.whl"}')
    # Not build paths: a relative one, one after a variable, one inside a longer path.
    (root / "lib" / "ok.cmake").write_text("set(A ${ROOT}/src/x)\nset(B vllm/third_party/y)\n")
    (root / "lib" / "RECORD").write_text("vllm/third_party/x.py,sha256=...,1\n")
    found = run("hygiene", {"roots": [str(root)], "build_roots": ["/third_party", "/src", "/build", str(build)]})
    assert found["dangling"] == [[str(root / "lib" / "cute"), "/third_party/fa/flash_attn/cute"]]
    assert found["outside"] == [[str(root / "lib" / "into-build"), str(build)]]
    named = {Path(p).name: (r, line) for p, r, line in found["named"]}
    assert named == {
        "tool": ("/build", "#!/build/venv/bin/python"),
        "x.pth": ("/src", "/src/k3smoke"),
        "direct_url.json": ("/build", '{"url": "file:///build/dist/k3smoke-0.1.0.whl"}'),
    }
    assert found["counts"] == {"dangling": 1, "outside": 1, "named": 3}


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_trees_imports_every_module_and_names_what_fails(tmp_path):
    _package(
        tmp_path,
        {
            "k3p/__init__.py": "",
            "k3p/third_party/__init__.py": "",
            "k3p/third_party/good.py": "from k3p.third_party import helper\n",
            "k3p/third_party/helper.py": "X = 1\n",
            "k3p/third_party/cute/bad.py": "import k3kernels_py.interface\n",  # an unrewritten FA4-style import
            "k3p/third_party/tests/test_x.py": "import pytest_not_here\n",
            "k3p/third_party/include/k.h": "int k;\n",  # data only: no module
        },
    )
    req = {
        "trees": ["k3p.third_party", "k3p.missing"],
        "skip": ["k3p.third_party.tests.*"],
        "setup": ["k3p:__name__.upper"],
    }
    found = run("trees", req, env={"PYTHONPATH": str(tmp_path)})
    assert found["trees"] == {
        "k3p.third_party": None,
        "k3p.missing": "ModuleNotFoundError: no module named 'k3p.missing'",
    }
    assert found["setup"] == {"k3p:__name__.upper": None}
    assert found["imported"] == {
        "k3p.third_party": None,
        "k3p.third_party.cute": None,
        "k3p.third_party.cute.bad": "ModuleNotFoundError: No module named 'k3kernels_py'",
        "k3p.third_party.good": None,
        "k3p.third_party.helper": None,
    }
    assert found["skipped"] == {
        "k3p.third_party.tests": "k3p.third_party.tests.*",
        "k3p.third_party.tests.test_x": "k3p.third_party.tests.*",
    }


CLI = {
    "k3cli/__init__.py": "",
    "k3cli/args.py": (
        "import argparse\n"
        "class Parser(argparse.ArgumentParser):\n    pass\n"
        "def make(parser):\n"
        "    parser.add_argument('model_tag', nargs='?')\n"
        "    parser.add_argument('--tensor-parallel-size', type=int, default=1)\n"
        "    parser.add_argument('--tool-call-parser')\n"
        "    parser.add_argument('--load-format', default='auto')\n"
        "    parser.add_argument('--enable-auto-tool-choice', action='store_true')\n"
        "    return parser\n"
        "def validate(ns):\n"
        "    if ns.enable_auto_tool_choice and not ns.tool_call_parser:\n"
        "        raise TypeError('--enable-auto-tool-choice requires --tool-call-parser')\n"
    ),
    "k3cli/registry.py": (
        "LOADERS = {'auto': 1, 'fastsafetensors': 2}\n"
        "class Tools:\n"
        "    @classmethod\n"
        "    def get(cls, name):\n"
        "        if name != 'kimi_k3':\n            raise KeyError(f'Tool parser {name!r} not found.')\n"
        "        return object\n"
        "import logging\nlog = logging.getLogger('k3cli')\nlog.addHandler(logging.NullHandler())\n"
        "def model(arch):\n"
        "    if arch == 'K3ForConditionalGeneration':\n        return object\n"
        "    log.warning('Error in loading model architecture %r', arch)\n    return None\n"
    ),
}


def _recipe(argv, **kw):
    return {
        "argv": argv,
        "parser": "k3cli.args:make",
        "parser_class": "k3cli.args:Parser",
        "validator": "k3cli.args:validate",
        "resolve": {"tool_call_parser": "k3cli.registry:Tools.get", "load_format": "k3cli.registry:LOADERS"},
        "architecture": "K3ForConditionalGeneration",
        "architecture_resolver": "k3cli.registry:model",
        **kw,
    }


def test_recipe_parses_validates_and_resolves_through_the_cli_s_own_registries(tmp_path):
    env = {"PYTHONPATH": str(_package(tmp_path, CLI))}
    good = [
        "m/K3",
        "--tensor-parallel-size",
        "8",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "kimi_k3",
        "--load-format",
        "fastsafetensors",
    ]
    assert run("recipe", _recipe(good), env) == {
        "parse": None,
        "validate": None,
        "architecture": None,
        "options": {"load_format": None, "tool_call_parser": None},
    }
    found = run(
        "recipe",
        _recipe(good[:4] + ["--tool-call-parser", "kimi_k9", "--load-format", "runai"], architecture="K9ForCausalLM"),
        env,
    )
    assert found["parse"] is None
    assert found["options"]["tool_call_parser"] == "'kimi_k9': KeyError: \"Tool parser 'kimi_k9' not found.\""
    assert found["options"]["load_format"].startswith("'runai': not one of ['auto', 'fastsafetensors']")
    assert found["architecture"] == (
        "the registry returned nothing (it said: Error in loading model architecture 'K9ForCausalLM')"
    )
    found = run("recipe", _recipe(["m/K3", "--reasoning-parser", "kimi_k3"]), env)
    assert found["parse"] == "ValueError: error: unrecognized arguments: --reasoning-parser kimi_k3"
    found = run("recipe", _recipe(["m/K3", "--enable-auto-tool-choice"]), env)
    assert found["validate"] == "TypeError: --enable-auto-tool-choice requires --tool-call-parser"
    assert found["options"]["tool_call_parser"] == "None: the option is not set"


def test_trees_imports_each_module_in_its_own_process(tmp_path):
    """vLLM's unused flash_linear_attention.ops.fused_norm_gate registers the custom-op name that
    ops.kda registers too, and the registry asserts on a second registration: imported one after
    the other in one process, the second would fail. Each module gets a process of its own, so
    only a module that fails on its own fails; one that crashes the interpreter or hangs is named."""
    _package(
        tmp_path,
        {
            "k3reg/__init__.py": "NAMES = set()\ndef register(name):\n    assert name not in NAMES, name\n    NAMES.add(name)\n",
            "k3t/__init__.py": "",
            "k3t/a_first.py": "import k3reg\nk3reg.register('fused_rms_norm_gated')\n",
            "k3t/b_second.py": "import k3reg\nk3reg.register('fused_rms_norm_gated')\n",
            "k3t/c_path.py": "import sys, os\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'root'))\nimport hidden\n",
            "k3t/root/hidden.py": "X = 1\n",
            "k3t/d_needs_path.py": "import hidden\n",  # importable only after c_path ran in the same process
            "k3t/e_crash.py": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
            "k3t/f_hang.py": "import time\ntime.sleep(60)\n",
        },
    )
    found = run(
        "trees",
        {"trees": ["k3t"], "skip": ["k3t.root.*"], "setup": ["k3reg", "json:dumps.__name__.upper"], "timeout": 3},
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert found["setup"] == {"k3reg": None, "json:dumps.__name__.upper": None}
    assert found["imported"] == {
        "k3t": None,
        "k3t.a_first": None,
        "k3t.b_second": None,
        "k3t.c_path": None,
        "k3t.d_needs_path": "ModuleNotFoundError: No module named 'hidden'",
        "k3t.e_crash": f"the import crashed the interpreter (signal {int(__import__('signal').SIGSEGV)})",
        "k3t.f_hang": "timed out",
    }


def test_elf_loads_by_name_what_packages_dlopen(tmp_path):
    found = run("elf", elf_request(tmp_path, dlopen=["libc.so.6", "libk3nope.so.1"]))
    assert found["dlopen"]["libc.so.6"] is None
    assert "libk3nope.so.1" in found["dlopen"]["libk3nope.so.1"]


def test_trees_shows_the_error_a_package_re_raised(tmp_path):
    _package(
        tmp_path,
        {
            "k3fa/__init__.py": (
                "try:\n    import k3fa_missing_C\nexcept ImportError as e:\n"
                "    raise ImportError('k3fa requires its compiled extension') from e\n"
            ),
        },
    )
    found = run("trees", {"trees": ["k3fa"], "skip": [], "setup": []}, env={"PYTHONPATH": str(tmp_path)})
    assert found["imported"]["k3fa"] == (
        "ImportError: k3fa requires its compiled extension (from ModuleNotFoundError: No module named 'k3fa_missing_C')"
    )


def test_files_lists_the_installed_package_with_execute_bits_and_without_bytecode(tmp_path):
    site = tmp_path / "site"
    pkg = site / "k3smoke"
    (pkg / "utils").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__pycache__" / "__init__.cpython-312.pyc").write_bytes(b"")
    wrapper = pkg / "utils" / "numa_wrapper.sh"
    wrapper.write_text('#!/bin/sh\nexec "$@"\n')
    wrapper.chmod(0o755)
    os.symlink("numa_wrapper.sh", pkg / "utils" / "link.sh")  # a link is not a file the source carries
    info = site / "k3smoke-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: k3smoke\nVersion: 0.1.0\n")
    found = run("files", {"distribution": "k3smoke", "package": "k3smoke"}, env={"PYTHONPATH": str(site)})
    assert found["root"] == str(pkg.resolve())
    assert found["files"] == {"k3smoke/__init__.py": False, "k3smoke/utils/numa_wrapper.sh": True}
    missing = run("files", {"distribution": "k3smoke", "package": "nothere"}, env={"PYTHONPATH": str(site)})
    assert "no such directory" in missing["error"]
