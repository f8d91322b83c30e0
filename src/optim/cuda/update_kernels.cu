// The optimizers' update kernels on the GPU (see update_kernels_cuda.h and
// src/optim/update_kernels.cc, whose per-element arithmetic every kernel
// repeats operation by operation).
//
// Compiled by nvcc for the real build, and by the host compiler against the
// CPU emulation of CUDA in tests/gpu/emu for the logic tests.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "src/common/cuda_status.h"
#include "src/optim/cuda/update_kernels_cuda.h"

namespace squall::optim::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxGrid = 4096;

#define SQUALL_GRID_LOOP(i, n)                                                           \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; (i) < (n); \
       (i) += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void adamKernel(size_t n, float* x, float* m, float* v, const float* g, float decay,
                           float w, float b2, float omb2, float bc2, float eps, float neg) {
  // torch's lerp: self + w * (end - self) when |w| < 0.5, else end - (end - self) * (1 - w).
  const bool low = fabsf(w) < 0.5f;
  const float w1 = __fadd_rn(1.0f, -w);
  SQUALL_GRID_LOOP(i, n) {
    const float gi = g[i];
    const float d = __fadd_rn(gi, -m[i]);
    const float mi = low ? __fadd_rn(m[i], __fmul_rn(w, d)) : __fadd_rn(gi, -__fmul_rn(d, w1));
    const float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(omb2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2), eps);
    m[i] = mi;
    v[i] = vi;
    x[i] = __fadd_rn(__fmul_rn(x[i], decay), __fdiv_rn(__fmul_rn(neg, mi), denom));
  }
}

__global__ void momentumKernel(size_t n, float* out, const float* m, const float* g, float b1,
                               float omb1, const float* maskBy) {
  SQUALL_GRID_LOOP(i, n) {
    const float next = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(omb1, g[i]));
    out[i] = maskBy == nullptr || maskBy[i] > 0.0f ? next : __fmul_rn(next, 0.0f);
  }
}

__global__ void scaleKernel(size_t n, float* v, float factor) {
  SQUALL_GRID_LOOP(i, n) v[i] = __fdiv_rn(v[i], factor);
}

__global__ void frozenKernel(size_t n, float* x, const float* m, const float* vHat, float decay,
                             float negLr, float eps, float hi, float keep) {
  SQUALL_GRID_LOOP(i, n) {
    float r = __fdiv_rn(m[i], __fadd_rn(__fsqrt_rn(vHat[i]), eps));
    r = r > hi ? hi : r;
    r = r < -hi ? -hi : r;
    r = vHat[i] > keep ? r : 0.0f;
    x[i] = __fadd_rn(__fmul_rn(x[i], decay), __fmul_rn(negLr, r));
  }
}

__global__ void slowmoKernel(size_t n, float* x, float* xPrev, float* u, const float* xAvg,
                             float lr, float oneMinusAlpha, float ab, float beta) {
  SQUALL_GRID_LOOP(i, n) {
    const float d = __fadd_rn(xPrev[i], -xAvg[i]);
    const float uOld = u[i];
    const float next =
        __fadd_rn(__fadd_rn(xAvg[i], __fmul_rn(oneMinusAlpha, d)), -__fmul_rn(ab, uOld));
    u[i] = __fadd_rn(__fmul_rn(beta, uOld), __fdiv_rn(d, lr));
    xPrev[i] = next;
    x[i] = next;
  }
}

__global__ void subtractKernel(size_t n, float* out, const float* a, const float* b) {
  SQUALL_GRID_LOOP(i, n) out[i] = __fadd_rn(a[i], -b[i]);
}

__global__ void addKernel(size_t n, float* out, const float* a, const float* b) {
  SQUALL_GRID_LOOP(i, n) out[i] = __fadd_rn(a[i], b[i]);
}

__global__ void divideKernel(size_t n, float* x, float divisor) {
  SQUALL_GRID_LOOP(i, n) x[i] = __fdiv_rn(x[i], divisor);
}

// Raises a flag that many threads may raise at once. Concurrent stores of one
// value are harmless on the GPU, but they are a data race in C++ terms, and
// the CPU emulation runs this code as C++ on OS threads (under
// ThreadSanitizer too); the exchange costs nothing in the common case, which
// never raises the flag.
__device__ __forceinline__ void raiseFlag(int* flag) { atomicExch(flag, 1); }

__global__ void nonFiniteKernel(size_t n, const float* p, int* flag) {
  // Every thread that sees a non-finite value raises the flag; the common
  // (finite) case writes nothing.
  SQUALL_GRID_LOOP(i, n) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    if ((bits & 0x7f800000u) == 0x7f800000u) raiseFlag(flag);
  }
}

__global__ void varianceKernel(size_t n, const float* v, float* snap, double a, double b,
                               double* lanes) {
  // One thread per lane (the grid is exactly kVarianceLanes threads), each
  // walking its elements in index order: update_kernels.cc's order.
  const size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  double d = 0.0, t = 0.0;
  for (size_t i = j; i < n; i += kVarianceLanes) {
    const double now = __dmul_rn(a, static_cast<double>(v[i]));
    const double then = __dmul_rn(b, static_cast<double>(snap[i]));
    d = __dadd_rn(d, fabs(__dadd_rn(now, -then)));
    t = __dadd_rn(t, now);
    snap[i] = v[i];
  }
  lanes[2 * j] = d;
  lanes[2 * j + 1] = t;
}

#undef SQUALL_GRID_LOOP

unsigned gridFor(size_t items) {
  return static_cast<unsigned>(std::clamp<size_t>((items + kThreads - 1) / kThreads, 1, kMaxGrid));
}

template <typename... Params, typename... Args>
Status launch(const char* what, void (*kernel)(Params...), size_t n, cudaStream_t stream,
              Args... args) {
  if (n == 0) return Status::kOk;
  launchKernel(kernel, gridFor(n), kThreads, stream, n, args...);
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::kOk;
  return SQUALL_FAIL(Status::kSystemError, Subsys::kCuda, "the %s kernel failed to launch: %s (%s)",
                     what, cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace

Status adamStep(size_t n, float* x, float* m, float* v, const float* g, const AdamScalars& s,
                cudaStream_t stream) {
  return launch("AdamW", adamKernel, n, stream, x, m, v, g, s.decay, s.lerpW, s.beta2, s.oneMinusB2,
                s.bc2Sqrt, s.eps, s.negStep);
}

Status momentumStep(size_t n, float* out, const float* m, const float* g, float beta1,
                    float oneMinusB1, const float* maskBy, cudaStream_t stream) {
  return launch("momentum", momentumKernel, n, stream, out, m, g, beta1, oneMinusB1, maskBy);
}

Status scale(size_t n, float* v, float factor, cudaStream_t stream) {
  return launch("variance scale", scaleKernel, n, stream, v, factor);
}

Status frozenStep(size_t n, float* x, const float* m, const float* vHat, const FrozenScalars& s,
                  cudaStream_t stream) {
  return launch("frozen-variance update", frozenKernel, n, stream, x, m, vHat, s.decay, s.negLr,
                s.eps, s.bound, s.keepAbove());
}

Status slowmoStep(size_t n, float* x, float* xPrev, float* u, const float* xAvg, float lr,
                  float alpha, float beta, cudaStream_t stream) {
  // The same fp32 scalars as update_kernels.cc: 1 - alpha, then (alpha * beta) * lr.
  const float oneMinusAlpha = 1.0f - alpha;
  const float ab = alpha * beta * lr;
  return launch("SlowMo", slowmoKernel, n, stream, x, xPrev, u, xAvg, lr, oneMinusAlpha, ab, beta);
}

Status subtract(size_t n, float* out, const float* a, const float* b, cudaStream_t stream) {
  return launch("subtract", subtractKernel, n, stream, out, a, b);
}

Status add(size_t n, float* out, const float* a, const float* b, cudaStream_t stream) {
  return launch("add", addKernel, n, stream, out, a, b);
}

Status divide(size_t n, float* x, float divisor, cudaStream_t stream) {
  return launch("divide", divideKernel, n, stream, x, divisor);
}

Status varianceLanes(size_t n, const float* v, float* snap, double a, double b, double* lanes,
                     cudaStream_t stream) {
  static_assert(kVarianceLanes % kThreads == 0, "whole blocks of lanes");
  // Always launched, even for n = 0: every lane writes its (zero) sums.
  launchKernel(varianceKernel, static_cast<unsigned>(kVarianceLanes / kThreads), kThreads, stream,
               n, v, snap, a, b, lanes);
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::kOk;
  return SQUALL_FAIL(Status::kSystemError, Subsys::kCuda,
                     "the variance-change kernel failed to launch: %s (%s)", cudaGetErrorName(err),
                     cudaGetErrorString(err));
}

Status flagNonFinite(size_t n, const float* p, int* flag, cudaStream_t stream) {
  return launch("non-finite check", nonFiniteKernel, n, stream, p, flag);
}

}  // namespace squall::optim::cuda
