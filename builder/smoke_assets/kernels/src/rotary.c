#include <math.h>
#include "k3kernels.h"

void k3_rotary(double *values, size_t n, double theta) {
    for (size_t i = 0; i + 1 < n; i += 2) {
        double c = cos(theta * (double)(i / 2 + 1)), s = sin(theta * (double)(i / 2 + 1));
        double a = values[i], b = values[i + 1];
        values[i] = a * c - b * s;
        values[i + 1] = a * s + b * c;
    }
}
