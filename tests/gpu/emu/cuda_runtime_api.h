// A CPU stand-in for the small part of the CUDA runtime that the codec and its
// GPU tests use, so that src/codec/cuda/kernels.cu and tests/gpu can be built
// with the host compiler and run on machines without a GPU.
//
// It is a logic check, not a GPU: "device" memory is host memory, streams are
// synchronous, and each thread block runs on a pool of one OS thread per CUDA
// thread; warp shuffles, ballots and __syncthreads are emulated with barriers,
// so the kernels' indexing, reduction order, ballots and padding are exercised
// exactly as written. It cannot show what only hardware does: canonical NaN
// payloads, memory-model races between blocks, performance.
//
// Put this directory first on the include path and define
// SQUALL_CUDA_EMULATION; see tests/gpu/meson.build.
#pragma once

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#if !defined(SQUALL_CUDA_EMULATION)
#error "this header emulates CUDA on the CPU; define SQUALL_CUDA_EMULATION"
#endif

// ---- language ---------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static  // one thread block runs at a time

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace squall_emu {
inline thread_local dim3 tThreadIdx;
inline dim3 gBlockIdx, gGridDim, gBlockDim;
inline thread_local dim3 tBlockIdx;
}  // namespace squall_emu

#define threadIdx (::squall_emu::tThreadIdx)
#define blockIdx (::squall_emu::tBlockIdx)
#define gridDim (::squall_emu::gGridDim)
#define blockDim (::squall_emu::gBlockDim)

// The rounding intrinsics: the host build uses -ffp-contract=off and IEEE
// arithmetic, so plain operators round the same way.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __ull2float_rn(unsigned long long v) { return static_cast<float>(v); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }

// ---- warps and blocks ----------------------------------------------------------

namespace squall_emu {

constexpr int kMaxThreads = 256;

struct Warp {
  std::barrier<> bar{32};
  uint32_t slot[32] = {};
};

struct Pool;
Pool& pool();
Warp& warpOf(unsigned thread);
void syncBlock();

// Every lane publishes a word, all wait, every lane reads, all wait again.
inline uint32_t exchange(uint32_t mine, unsigned srcLane) {
  Warp& w = warpOf(threadIdx.x);
  const unsigned lane = threadIdx.x % 32;
  w.slot[lane] = mine;
  w.bar.arrive_and_wait();
  const uint32_t got = w.slot[srcLane % 32];
  w.bar.arrive_and_wait();
  return got;
}

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline unsigned ballot(bool pred) {
  Warp& w = warpOf(threadIdx.x);
  const unsigned lane = threadIdx.x % 32;
  w.slot[lane] = pred ? 1u : 0u;
  w.bar.arrive_and_wait();
  unsigned bits = 0;
  for (unsigned i = 0; i < 32; ++i) bits |= w.slot[i] << i;
  w.bar.arrive_and_wait();
  return bits;
}

}  // namespace squall_emu

inline float __shfl_down_sync(unsigned, float v, int delta) {
  const unsigned lane = threadIdx.x % 32;
  const unsigned src = lane + delta < 32 ? lane + delta : lane;
  return squall_emu::floatOf(squall_emu::exchange(squall_emu::bitsOf(v), src));
}
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  const unsigned lane = threadIdx.x % 32;
  return squall_emu::floatOf(squall_emu::exchange(squall_emu::bitsOf(v), lane ^ mask));
}
inline float __shfl_sync(unsigned, float v, unsigned src) {
  return squall_emu::floatOf(squall_emu::exchange(squall_emu::bitsOf(v), src));
}
inline unsigned __ballot_sync(unsigned, bool pred) { return squall_emu::ballot(pred); }
inline int __all_sync(unsigned, int pred) { return squall_emu::ballot(pred != 0) == ~0u; }
inline void __syncthreads() { squall_emu::syncBlock(); }

// Emulated threads are OS threads, so device atomics must be real atomics for
// the emulation itself to be free of data races (ThreadSanitizer runs it).
inline int atomicExch(int* address, int value) {
  return std::atomic_ref<int>(*address).exchange(value);
}

// ---- runtime ------------------------------------------------------------------

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorStreamCaptureUnsupported = 900,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
constexpr unsigned cudaStreamNonBlocking = 1;

struct CUstream_st {
  bool capturing = false;
  std::vector<std::function<void()>>* capture = nullptr;
};
using cudaStream_t = CUstream_st*;
struct CUgraph_st {
  std::vector<std::function<void()>> nodes;
};
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraph_st*;

struct cudaDeviceProp {
  char name[256];
  int major;
  int minor;
};

inline const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "emulated CUDA error";
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::strcpy(p->name, "CPU emulation of CUDA (tests/gpu/emu)");
  p->major = 0;
  p->minor = 0;
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
// Pinned host memory is host memory.
inline cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_st;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}

namespace squall_emu {
// Runs `work` now, or records it when the stream is being captured.
inline cudaError_t enqueue(cudaStream_t s, std::function<void()> work) {
  if (s != nullptr && s->capturing) {
    s->capture->push_back(std::move(work));
  } else {
    work();
  }
  return cudaSuccess;
}
}  // namespace squall_emu

inline cudaError_t cudaMemset(void* p, int v, size_t n) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
  return squall_emu::enqueue(s, [=] { std::memset(p, v, n); });
}
inline cudaError_t cudaMemcpy(void* d, const void* src, size_t n, cudaMemcpyKind) {
  std::memcpy(d, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* src, size_t n, cudaMemcpyKind,
                                   cudaStream_t s) {
  return squall_emu::enqueue(s, [=] { std::memcpy(d, src, n); });
}
inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  s->capturing = true;
  s->capture = new std::vector<std::function<void()>>;
  return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  *g = new CUgraph_st{std::move(*s->capture)};
  delete s->capture;
  s->capture = nullptr;
  s->capturing = false;
  return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long = 0) {
  *e = new CUgraph_st{g->nodes};
  return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  for (auto& node : e->nodes) squall_emu::enqueue(s, node);
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}

// ---- kernel launch ------------------------------------------------------------

namespace squall_emu {
// Runs `block` once per thread block, with one pool thread per CUDA thread.
void runGrid(unsigned grid, unsigned threads, const std::function<void()>& block);
}  // namespace squall_emu

template <typename... Params, typename... Args>
void launchKernel(void (*kernel)(Params...), unsigned grid, unsigned threads, cudaStream_t stream,
                  Args... args) {
  squall_emu::enqueue(stream,
                      [=] { squall_emu::runGrid(grid, threads, [=] { kernel(args...); }); });
}
