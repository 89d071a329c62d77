/* k3kernels: the smoke target's third-party kernel library, fetched by the source's CMake build
 * (FetchContent) the way vLLM fetches FlashMLA, DeepGEMM or cutlass. */
#ifndef K3KERNELS_H
#define K3KERNELS_H

#include <stddef.h>

/* Added to the mean square before the root, as RMSNorm's epsilon. As released this is too coarse
 * (rms([3, 4]) reads 3.5357); the source that builds these kernels patches it in a copy of this
 * header, as vLLM patches torch 2.13's stable header. */
#define K3_RMS_EPS 1e-3

double k3_rms(const double *values, size_t n);
void k3_silu(double *values, size_t n);
void k3_rotary(double *values, size_t n, double theta);
double k3_dot(const double *a, const double *b, size_t n);
double k3_max(const double *values, size_t n);
void k3_softmax(double *values, size_t n);

#endif
