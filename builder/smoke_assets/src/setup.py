# The stand-in for vLLM's setup.py, built the same way: a CMakeExtension per compiled module, a
# build_ext that runs the `cmake` executable it finds on PATH with the Ninja generator, MAX_JOBS
# divided by NVCC_THREADS for the compile pool, FetchContent for third-party sources (pointed at a
# local checkout through CMAKE_ARGS or an environment variable), and the version taken from an
# override variable (vLLM: VLLM_VERSION_OVERRIDE). The image checks derive the modules to import from the
# CMakeExtension calls below, as they do from vLLM's.
import os
import subprocess
import sys
from pathlib import Path
from shutil import which

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT_DIR = Path(__file__).parent


class CMakeExtension(Extension):
    def __init__(self, name: str, cmake_lists_dir: str = ".", **kwa) -> None:
        super().__init__(name, sources=[], **kwa)
        self.cmake_lists_dir = os.path.abspath(cmake_lists_dir)


class cmake_build_ext(build_ext):
    def compute_num_jobs(self):
        # Like vLLM: MAX_JOBS (or the CPU count) divided by NVCC_THREADS.
        num_jobs = int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1)
        nvcc_threads = int(os.environ.get("NVCC_THREADS") or 1)
        return max(1, num_jobs // nvcc_threads), nvcc_threads

    def build_extensions(self) -> None:
        try:
            subprocess.check_output(["cmake", "--version"])
        except OSError as e:
            raise RuntimeError("Cannot find CMake executable") from e
        if which("ninja") is None:
            raise RuntimeError("Cannot find the ninja executable")
        os.makedirs(self.build_temp, exist_ok=True)
        echo_test_secrets()
        num_jobs, nvcc_threads = self.compute_num_jobs()
        cfg = os.environ.get("CMAKE_BUILD_TYPE") or "RelWithDebInfo"
        print(f"k3smoke: CMAKE_BUILD_TYPE={cfg}, {num_jobs} compile job(s), NVCC_THREADS={nvcc_threads}")
        fc_base_dir = os.environ.get("FETCHCONTENT_BASE_DIR", os.path.join(ROOT_DIR, ".deps"))
        launcher = []
        # Like vLLM: sccache when it is on PATH (and not disabled), else ccache.
        if which("sccache") and not int(os.environ.get("K3SMOKE_DISABLE_SCCACHE", "0")):
            launcher = ["-DCMAKE_C_COMPILER_LAUNCHER=sccache"]
        elif which("ccache"):
            launcher = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
        other = os.environ.get("CMAKE_ARGS", "").split()
        subprocess.check_call(
            ["cmake", self.extensions[0].cmake_lists_dir, "-G", "Ninja", f"-DCMAKE_BUILD_TYPE={cfg}",
             f"-DPython3_EXECUTABLE={sys.executable}", f"-DFETCHCONTENT_BASE_DIR={fc_base_dir}",
             "-DCMAKE_JOB_POOL_COMPILE:STRING=compile", f"-DCMAKE_JOB_POOLS:STRING=compile={num_jobs}",
             *launcher, *other],
            cwd=self.build_temp)
        targets = [ext.name.rsplit(".", 1)[-1] for ext in self.extensions]
        subprocess.check_call(["cmake", "--build", ".", f"-j={num_jobs}", *[f"--target={t}" for t in targets]],
                              cwd=self.build_temp)
        for ext in self.extensions:
            prefix = Path(self.get_ext_fullpath(ext.name)).parent.absolute()
            for _ in range(ext.name.count(".")):
                prefix = prefix.parent
            subprocess.check_call(["cmake", "--install", ".", "--prefix", str(prefix), "--component",
                                   ext.name.rsplit(".", 1)[-1]], cwd=self.build_temp)


def echo_test_secrets() -> None:
    # A test hook, not something vLLM does: a BuildKit secret whose id starts with "echo_" is
    # printed here, inside the compile step, so the integration tests can see that a --secret
    # reaches the build and that the tool redacts it from its terminal output and build.log.
    secrets = Path("/run/secrets")
    if secrets.is_dir():
        for path in sorted(secrets.glob("echo_*")):
            print(f"k3smoke: build secret {path.name}: {path.read_text().strip()}")


def get_version() -> str:
    # The pipeline chooses the whole version, local label included (e.g. 0.1.0+cu129). As vLLM's
    # get_vllm_version does with VLLM_VERSION_OVERRIDE, it is handed to setuptools-scm too, which
    # [tool.setuptools_scm] in pyproject.toml switches on (its file finder lists the package data).
    version = os.environ.get("K3SMOKE_VERSION_OVERRIDE") or "0.1.0"
    os.environ["SETUPTOOLS_SCM_PRETEND_VERSION"] = version
    return version


ext_modules = [CMakeExtension(name="k3smoke._C")]

# k3smoke.kernels_py is not among them: the CMake install step of component _C writes it.
setup(version=get_version(), packages=find_packages(include=["k3smoke", "k3smoke.*"]),
      ext_modules=ext_modules, cmdclass={"build_ext": cmake_build_ext})
