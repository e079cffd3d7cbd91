/*
 * GPU-less stand-in for the CUDA driver library (libcuda.so.1), for tests only.
 *
 * vLLM 0.33's CUDA platform module (vllm/platforms/cuda.py) imports the
 * extension vllm._C_stable_libtorch, which is linked against libcuda.so.1 and
 * resolves exactly three driver entry points from it. On a machine without an
 * NVIDIA driver that import fails, and with it the real CUDA platform, the
 * real attention-backend selector and the real backend classes. This library
 * exports those three symbols, each answering CUDA_ERROR_NO_DEVICE (100), so
 * the module imports and everything that does not launch GPU work can be
 * exercised on a CPU. Nothing here pretends a GPU exists.
 *
 * Built by ci/vllm-env.sh:  gcc -shared -fPIC -O2 -o libcuda.so.1 libcuda_stub.c
 * and put on LD_LIBRARY_PATH for the vLLM test run only.
 */
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
#define CUDA_ERROR_NO_DEVICE 100

/* CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
 *                              cuuint64_t flags, CUdriverProcAddressQueryResult *status) */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                             uint64_t flags, int *symbol_status) {
    (void)symbol; (void)cuda_version; (void)flags;
    if (pfn) *pfn = NULL;
    if (symbol_status) *symbol_status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return CUDA_ERROR_NO_DEVICE;
}

/* CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) */
CUresult cuPointerGetAttribute(void *data, int attribute, uint64_t ptr) {
    (void)data; (void)attribute; (void)ptr;
    return CUDA_ERROR_NO_DEVICE;
}

/* CUresult cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType dtype,
 *     cuuint32_t rank, void *globalAddress, const cuuint64_t *globalDim,
 *     const cuuint64_t *globalStrides, const cuuint32_t *boxDim,
 *     const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
 *     CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
 *     CUtensorMapFloatOOBfill oobFill) */
CUresult cuTensorMapEncodeTiled(void *tensor_map, int dtype, uint32_t rank,
                                void *global_address, const uint64_t *global_dim,
                                const uint64_t *global_strides, const uint32_t *box_dim,
                                const uint32_t *element_strides, int interleave,
                                int swizzle, int l2_promotion, int oob_fill) {
    (void)tensor_map; (void)dtype; (void)rank; (void)global_address; (void)global_dim;
    (void)global_strides; (void)box_dim; (void)element_strides; (void)interleave;
    (void)swizzle; (void)l2_promotion; (void)oob_fill;
    return CUDA_ERROR_NO_DEVICE;
}
