/* The smoke bases' stand-in for the NVIDIA driver library (libcuda.so.1).
 *
 * CUDA base images carry the real one as a forward-compatibility copy under
 * /usr/local/cuda/compat, and the devel images a link-time stub under lib64/stubs; every vLLM
 * extension links it (cmake/utils.cmake). The smoke bases put this stub at both paths so the
 * smoke extension links and loads it exactly as vLLM's do. Without a GPU the real library loads
 * but cuInit fails with CUDA_ERROR_NO_DEVICE; so does this one.
 */
typedef int CUresult;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NO_DEVICE 100

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 12090; /* what an r575 driver reports: CUDA 12.9 */
    return CUDA_SUCCESS;
}
