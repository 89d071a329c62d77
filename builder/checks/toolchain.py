"""The shell script runtime_toolchain runs inside the image (kept apart from the checklist: it is
data the check sends, not a check)."""

# Run inside the image: what code that compiles at run time needs. Triton builds its driver stub
# on first use with $CC, else gcc, else clang (triton/runtime/build.py; never plain `cc`), as
# `cc src.c -O3 -shared -fPIC -I<sysconfig include>`; FlashInfer and DeepGEMM JIT with nvcc and
# the toolkit's headers (FlashInfer's kernels include nvrtc.h; vLLM's image installs nvrtc-dev,
# curand-dev and cublas-dev for them).
TOOLCHAIN = r"""
set -u
work=$(mktemp -d)
cd "$work"
cc=${CC:-}
[ -n "$cc" ] || cc=$(command -v gcc || command -v clang || true)
echo "cc=$cc"
includepy=$(python -I -S -c 'import sysconfig; print(sysconfig.get_config_var("INCLUDEPY"))')
echo "includepy=$includepy"
[ -f "$includepy/Python.h" ] && echo "python_h=yes" || echo "python_h=no"
pyinclude=$(python -I -S -c 'import sysconfig as s; n = s.get_default_scheme(); print(s.get_paths(scheme="posix_prefix" if n == "posix_local" else n)["include"])')
echo "pyinclude=$pyinclude"
if [ -n "$cc" ]; then
  printf '#include <stdio.h>\nint main(void){puts("k3-toolchain-ok");return 0;}\n' > t.c
  if "$cc" -o t t.c > cc.log 2>&1 && [ "$(./t)" = k3-toolchain-ok ]; then echo "cc_link=yes"; else echo "cc_link=no: $(tail -n 2 cc.log | tr '\n' ' ')"; fi
  printf '#include <Python.h>\nint k3(void){return Py_IsInitialized();}\n' > p.c
  if "$cc" p.c -O3 -shared -fPIC -o p.so -I"$pyinclude" > p.log 2>&1; then echo "cc_python=yes"; else echo "cc_python=no: $(tail -n 2 p.log | tr '\n' ' ')"; fi
fi
if [ -n "${K3_CHECK_CUDA_HOME:-}" ]; then
  nvcc="$K3_CHECK_CUDA_HOME/bin/nvcc"
  if [ -x "$nvcc" ]; then
    echo "nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p' | head -n 1)"
    printf '__global__ void k3(float *x){x[threadIdx.x]*=2.0f;}\n' > k.cu
    if "$nvcc" -c -arch="$K3_CHECK_ARCH" k.cu -o k.o > nvcc.log 2>&1; then echo "nvcc_compile=yes"; else echo "nvcc_compile=no: $(tail -n 2 nvcc.log | tr '\n' ' ')"; fi
    printf '#include <cuda_runtime.h>\n#include <nvrtc.h>\n#include <curand.h>\n#include <cublas_v2.h>\n__global__ void k3h(float *x){x[threadIdx.x]+=1.0f;}\n' > h.cu
    if "$nvcc" -c -arch="$K3_CHECK_ARCH" h.cu -o h.o > h.log 2>&1; then echo "nvcc_headers=yes"; else echo "nvcc_headers=no: $(grep -m 1 -i 'error' h.log | tr '\n' ' ')"; fi
  else
    echo "nvcc_version=missing: no executable $nvcc"
  fi
fi
for var in TRITON_PTXAS_PATH TRITON_PTXAS_BLACKWELL_PATH; do
  eval "p=\${$var:-}"
  if [ -n "$p" ]; then [ -x "$p" ] && echo "$var=ok" || echo "$var=missing: $p"; fi
done
cd / && rm -rf "$work"
"""
