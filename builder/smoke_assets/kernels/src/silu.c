#include "k3kernels.h"
#include "k3math.h"

void k3_silu(double *values, size_t n) {
    for (size_t i = 0; i < n; i++) values[i] = values[i] / k3_sigmoid_denominator(values[i]);
}
