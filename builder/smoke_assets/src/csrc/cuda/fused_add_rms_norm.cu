// Residual add fused with RMSNorm, SM 9.0 and later only (vLLM: dsv3_fused_a_gemm and the CUTLASS
// SM100 kernels). Below CUDA 13 its archs come from an arch-specific `a` list, so it carries no
// code for a Blackwell GPU whose exact arch the build was not asked for (CMakeLists.txt).
extern "C" __global__ void k3_fused_add_rms_norm(float *x, float *residual, const float *weight, int hidden,
                                                 float eps) {
    __shared__ float partial[256];
    float *row = x + (long)blockIdx.x * hidden;
    float *res = residual + (long)blockIdx.x * hidden;
    float acc = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = row[i] + res[i];
        res[i] = v;
        acc += v * v;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = rsqrtf(partial[0] / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) row[i] = res[i] * inv * weight[i];
}
