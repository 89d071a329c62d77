// RMSNorm, one block per row (vLLM: csrc/layernorm_kernels.cu). Built for every requested arch
// plus 8.0 PTX, like vLLM's Marlin ("8.0+PTX"): the PTX JIT-compiles on any later GPU whose
// driver knows its ISA.
extern "C" __global__ void k3_rms_norm(float *out, const float *x, const float *weight, int hidden, float eps) {
    __shared__ float partial[256];
    const float *row = x + (long)blockIdx.x * hidden;
    float acc = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) acc += row[i] * row[i];
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = rsqrtf(partial[0] / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[(long)blockIdx.x * hidden + i] = row[i] * inv * weight[i];
}
