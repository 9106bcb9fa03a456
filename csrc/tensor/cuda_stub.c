/* cuda_stub.c - what a CPU-only build answers for the CUDA queries. */
#include "cuda_api.h"

#ifndef MR_WITH_CUDA
int mr_cuda_device_count(void) { return 0; }
const char *mr_last_cuda_error(void) { return "mambaradix was built without CUDA"; }
#else
/* The CUDA build gets these from csrc/cuda/device.cu.  ISO C forbids an
 * empty translation unit. */
typedef int mr_cuda_stub_unused;
#endif
