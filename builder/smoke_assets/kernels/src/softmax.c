#include <math.h>
#include "k3kernels.h"

void k3_softmax(double *values, size_t n) {
    double top = k3_max(values, n), sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (values[i] = exp(values[i] - top));
    for (size_t i = 0; i < n; i++) values[i] /= sum;
}
