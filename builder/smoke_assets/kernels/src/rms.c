#include <math.h>
#include "k3kernels.h"
#include "k3math.h"

double k3_rms(const double *values, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += k3_square(values[i]);
    return n ? sqrt(acc / (double)n + K3_RMS_EPS) : 0.0;
}
