/* k3math: the smoke third-party source's own submodule (like cutlass inside FlashMLA/DeepGEMM). */
#ifndef K3MATH_H
#define K3MATH_H

#include <math.h>

static inline double k3_square(double x) { return x * x; }
static inline double k3_sigmoid_denominator(double x) { return 1.0 + exp(-x); }

#endif
