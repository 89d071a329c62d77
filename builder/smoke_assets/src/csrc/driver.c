/* Calls into the driver library, as every vLLM extension does (CUTLASS direct driver calls,
 * cumem allocator): the extension cannot import without libcuda.so.1. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int CUresult;
extern CUresult cuDriverGetVersion(int *version);

PyObject *k3_driver_version(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    int version = 0;
    CUresult rc = cuDriverGetVersion(&version);
    if (rc != 0) return PyErr_Format(PyExc_RuntimeError, "cuDriverGetVersion failed: %d", rc);
    return PyLong_FromLong(version);
}
