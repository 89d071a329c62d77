/* Calls into the driver library, as every vLLM extension does (CUTLASS direct driver calls,
 * cumem allocator): the extension cannot import without libcuda.so.1. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int CUresult;
extern CUresult cuDriverGetVersion(int *version);

/* A *GetVersion call's result as Python sees it: the version, or RuntimeError naming the call. */
PyObject *k3_version_result(const char *call, int rc, int version) {
    if (rc != 0) return PyErr_Format(PyExc_RuntimeError, "%s failed: %d", call, rc);
    return PyLong_FromLong(version);
}

PyObject *k3_driver_version(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    int version = 0;
    int rc = cuDriverGetVersion(&version); /* before reading version: argument order is unspecified */
    return k3_version_result("cuDriverGetVersion", rc, version);
}
