#include "k3kernels.h"

double k3_dot(const double *a, const double *b, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

double k3_max(const double *values, size_t n) {
    double best = n ? values[0] : 0.0;
    for (size_t i = 1; i < n; i++) best = values[i] > best ? values[i] : best;
    return best;
}
