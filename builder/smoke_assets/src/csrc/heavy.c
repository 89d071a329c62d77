/* Deliberately heavy translation units for the compile-cache benchmark (K3SMOKE_HEAVY_UNITS):
 * the same code with another seed is another compile, as vLLM's kernels are per architecture. */
#define K3_CAT2(a, b) a##b
#define K3_CAT(a, b) K3_CAT2(a, b)
#define S(i) x = x * 1.0000001 + (double)((i) + K3_HEAVY_SEED) / (x + 3.0 + (double)(i));
#define S10(i) S(i) S(i + 1) S(i + 2) S(i + 3) S(i + 4) S(i + 5) S(i + 6) S(i + 7) S(i + 8) S(i + 9)
#define S100(i) S10(i) S10(i + 10) S10(i + 20) S10(i + 30) S10(i + 40) S10(i + 50) S10(i + 60) S10(i + 70) \
    S10(i + 80) S10(i + 90)
#define S1000(i) S100(i) S100(i + 100) S100(i + 200) S100(i + 300) S100(i + 400) S100(i + 500) S100(i + 600) \
    S100(i + 700) S100(i + 800) S100(i + 900)

double K3_CAT(k3_heavy_, K3_HEAVY_SEED)(double x) {
    S1000(0) S1000(1000) S1000(2000) S1000(3000)
    return x;
}
