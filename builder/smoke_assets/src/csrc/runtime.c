/* Calls into the CUDA runtime, as vLLM's extensions do: NEEDED libcudart.so.12, which another
 * distribution (nvidia-cuda-runtime-cu12) carries and k3smoke/__init__.py loads first. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern int cudaRuntimeGetVersion(int *version); /* cudaError_t is an int-sized enum */
PyObject *k3_version_result(const char *call, int rc, int version);

PyObject *k3_cudart_version(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    int version = 0;
    int rc = cudaRuntimeGetVersion(&version); /* before reading version: argument order is unspecified */
    return k3_version_result("cudaRuntimeGetVersion", rc, version);
}
