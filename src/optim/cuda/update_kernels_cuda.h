// The optimizers' element-wise updates on the GPU: the device twins of
// src/optim/update_kernels.h, bit-identical to them (the same fp32 operations
// in the same order through __fadd_rn/__fmul_rn/__fdiv_rn/__fsqrt_rn, no
// multiply-add contraction: nvcc runs with --fmad=false), with the scalars
// computed on the host exactly as the CPU path computes them.
//
// Every launcher enqueues on `stream` and returns without waiting; pointers
// are device pointers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "src/common/status.h"
#include "src/optim/update_kernels.h"

namespace squall::optim::cuda {

// adamStep of update_kernels.h (torch.optim.AdamW's order).
Status adamStep(size_t n, float* x, float* m, float* v, const float* g, const AdamScalars& s,
                cudaStream_t stream);
// out = beta1 * m + (1 - beta1) * g, and 0 where maskBy (nullable) is 0.
Status momentumStep(size_t n, float* out, const float* m, const float* g, float beta1,
                    float oneMinusB1, const float* maskBy, cudaStream_t stream);
// v = v / factor.
Status scale(size_t n, float* v, float factor, cudaStream_t stream);
// frozenStep of update_kernels.h: the clipped, masked compressed-stage update.
Status frozenStep(size_t n, float* x, const float* m, const float* vHat, const FrozenScalars& s,
                  cudaStream_t stream);
// slowmoStep of update_kernels.h.
Status slowmoStep(size_t n, float* x, float* xPrev, float* u, const float* xAvg, float lr,
                  float alpha, float beta, cudaStream_t stream);
// out = a - b, and out = a + b (the drift of compressed SlowMo).
Status subtract(size_t n, float* out, const float* a, const float* b, cudaStream_t stream);
Status add(size_t n, float* out, const float* a, const float* b, cudaStream_t stream);
// x = x / divisor (the avg of an NCCL sum).
Status divide(size_t n, float* x, float divisor, cudaStream_t stream);
// The per-lane sums of update_kernels.h's varianceChange into `lanes`
// (2 * kVarianceLanes doubles, device memory; add them with
// sumVarianceLanes), and snap = v.
Status varianceLanes(size_t n, const float* v, float* snap, double a, double b, double* lanes,
                     cudaStream_t stream);
// *flag |= 1 when an element of p is NaN or infinite (the flag is not cleared
// first: clear it with cudaMemsetAsync). Finite data writes nothing.
Status flagNonFinite(size_t n, const float* p, int* flag, cudaStream_t stream);

}  // namespace squall::optim::cuda
