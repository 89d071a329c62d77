/* k3smoke._C: the stand-in for vLLM's compiled kernels. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

#include "k3kernels.h"

PyObject *k3_driver_version(PyObject *self, PyObject *args);
PyObject *k3_cudart_version(PyObject *self, PyObject *args);

static double *to_doubles(PyObject *seq, Py_ssize_t *n) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of floats");
    if (!fast) return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    double *out = malloc(sizeof(double) * (size_t)(*n ? *n : 1));
    for (Py_ssize_t i = 0; out && i < *n; i++) out[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
    Py_DECREF(fast);
    if (!out) return (double *)PyErr_NoMemory();
    if (PyErr_Occurred()) { free(out); return NULL; }
    return out;
}

static PyObject *to_list(double *values, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) PyList_SET_ITEM(list, i, PyFloat_FromDouble(values[i]));
    free(values);
    return list;
}

static PyObject *rms(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *seq;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    double *v = to_doubles(seq, &n);
    if (!v) return NULL;
    double r = k3_rms(v, (size_t)n);
    free(v);
    return PyFloat_FromDouble(r);
}

/* One sequence in, a kernel applied in place, a list out (silu, softmax). */
static PyObject *elementwise(PyObject *args, void (*kernel)(double *, size_t)) {
    PyObject *seq;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    double *v = to_doubles(seq, &n);
    if (!v) return NULL;
    kernel(v, (size_t)n);
    return to_list(v, n);
}

static PyObject *silu(PyObject *self, PyObject *args) {
    (void)self;
    return elementwise(args, k3_silu);
}

static PyObject *softmax(PyObject *self, PyObject *args) {
    (void)self;
    return elementwise(args, k3_softmax);
}

static PyObject *rotary(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *seq;
    double theta;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Od", &seq, &theta)) return NULL;
    double *v = to_doubles(seq, &n);
    if (!v) return NULL;
    k3_rotary(v, (size_t)n, theta);
    return to_list(v, n);
}

#ifdef K3_ENABLE_FUSED_DECODE
static PyObject *fused_decode(PyObject *self, PyObject *args) { return rms(self, args); }
#endif

static PyMethodDef methods[] = {
    {"rms", rms, METH_VARARGS, "Root mean square of a sequence."},
    {"silu", silu, METH_VARARGS, "SiLU of each element."},
    {"softmax", softmax, METH_VARARGS, "Softmax of a sequence."},
    {"rotary", rotary, METH_VARARGS, "Rotary embedding of pairs."},
    {"driver_version", k3_driver_version, METH_NOARGS, "cuDriverGetVersion() of the loaded libcuda.so.1."},
    {"cudart_version", k3_cudart_version, METH_NOARGS, "cudaRuntimeGetVersion() of the loaded libcudart.so.12."},
#ifdef K3_ENABLE_FUSED_DECODE
    {"fused_decode", fused_decode, METH_VARARGS, "Only built for CUDA >= 13."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
