/* cuda_api.h - the plain C ABI between the C code and the CUDA objects.
 *
 * Implemented in csrc/cuda/ when built with MR_WITH_CUDA; without it, the
 * fallbacks in cuda_stub.c report no device.  Functions return MR_OK or a
 * negative MR_E* code; on MR_ECUDA, mr_last_cuda_error() holds CUDA's
 * message (thread-local). */
#ifndef MR_CUDA_API_H
#define MR_CUDA_API_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of visible CUDA devices; 0 without a driver/GPU or a CUDA build. */
int mr_cuda_device_count(void);
/* The message of the last CUDA error on this thread ("" if none). */
const char *mr_last_cuda_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MR_CUDA_API_H */
