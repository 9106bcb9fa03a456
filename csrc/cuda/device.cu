// device.cu - device queries and the thread-local CUDA error message.
#include <cuda_runtime.h>
#include <stdio.h>

#include "cuda_api.h"

static thread_local char mr_cuda_errbuf[256];

extern "C" void
mr_set_cuda_error(cudaError_t err, const char *where)
{
    snprintf(mr_cuda_errbuf, sizeof(mr_cuda_errbuf), "%s: %s (%s)", where,
             cudaGetErrorString(err), cudaGetErrorName(err));
}

extern "C" const char *
mr_last_cuda_error(void)
{
    return mr_cuda_errbuf;
}

extern "C" int
mr_cuda_device_count(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        // No driver or no device: clear the sticky error and report none.
        cudaGetLastError();
        return 0;
    }
    return n;
}
