// A CPU stand-in for the small part of the CUDA runtime that the codec and its
// GPU tests use, so that src/codec/cuda/kernels.cu and tests/gpu can be built
// with the host compiler and run on machines without a GPU.
//
// It is a logic check, not a GPU: "device" memory is host memory, streams are
// synchronous (work runs when it is enqueued) unless a test holds one
// (squall_emu::holdStream) or it waits for an event not yet reached, and each
// thread block runs on a pool of one OS thread per CUDA thread; warp shuffles, ballots and
// __syncthreads are emulated with barriers, so the kernels' indexing, reduction order, ballots and
// padding are exercised exactly as written. It cannot show what only hardware does: canonical NaN
// payloads, memory-model races between blocks, performance.
//
// Put this directory first on the include path and define
// SQUALL_CUDA_EMULATION; see tests/gpu/meson.build.
#pragma once

#include <atomic>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
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
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureIsolation = 905,
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
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;

struct CUevent_st;
// One piece of work of a stream, or (event set) a wait for the event to
// reach its `until`-th record.
struct EmuStreamItem {
  std::function<void()> work;
  CUevent_st* event = nullptr;
  uint64_t until = 0;
};
// A stream and its events are driven by one host thread at a time (each
// emulated rank has its own).
struct CUstream_st {
  bool capturing = false;
  std::vector<std::function<void()>>* capture = nullptr;
  bool held = false;                 // squall_emu::holdStream
  std::deque<EmuStreamItem> queued;  // work that could not run yet, in order
};
using cudaStream_t = CUstream_st*;
struct CUevent_st {
  uint64_t recorded = 0;              // cudaEventRecord calls
  uint64_t reached = 0;               // of which their stream has reached
  std::vector<CUstream_st*> waiters;  // streams waiting for a later record
};
using cudaEvent_t = CUevent_st*;
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
// Two devices, so that a test can tell which one a thread has current; they
// share one memory and one thread pool.
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 2;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::strcpy(p->name, "CPU emulation of CUDA (tests/gpu/emu)");
  p->major = 0;
  p->minor = 0;
  return cudaSuccess;
}
namespace squall_emu {
constexpr int kDevices = 2;           // cudaGetDeviceCount's
inline thread_local int tDevice = 0;  // cudaSetDevice's
// Allocations not yet freed, and the device current on the thread of the
// last cudaFree (tests of deferred frees read both).
inline std::atomic<long> gLiveAllocations{0};
inline std::atomic<int> gLastFreeDevice{-1};
// While the device is held (a kernel stuck on a dead peer, say), whatever
// waits for the whole device waits: cudaFree, cudaFreeHost,
// cudaDeviceSynchronize, cudaStreamSynchronize.
inline std::mutex gDeviceMutex;
inline std::condition_variable gDeviceReleased;
inline bool gDeviceHeld = false;
inline void holdDevice(bool held) {
  {
    std::lock_guard<std::mutex> lock(gDeviceMutex);
    gDeviceHeld = held;
  }
  gDeviceReleased.notify_all();
}
inline void waitForDevice() {
  std::unique_lock<std::mutex> lock(gDeviceMutex);
  gDeviceReleased.wait(lock, [] { return !gDeviceHeld; });
}
}  // namespace squall_emu

inline cudaError_t cudaGetDevice(int* device) {
  *device = squall_emu::tDevice;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= squall_emu::kDevices) return cudaErrorInvalidDevice;
  squall_emu::tDevice = device;
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  ++squall_emu::gLiveAllocations;
  return cudaSuccess;
}
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) {
  squall_emu::waitForDevice();
  if (p != nullptr) {
    --squall_emu::gLiveAllocations;
    squall_emu::gLastFreeDevice = squall_emu::tDevice;
  }
  std::free(p);
  return cudaSuccess;
}
// Pinned host memory is host memory.
inline cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
inline cudaError_t cudaDeviceSynchronize() {
  squall_emu::waitForDevice();
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_st;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  *status =
      s != nullptr && s->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

namespace squall_emu {
inline void wake(CUevent_st* e);
// Runs the stream's queued work in order, up to a hold or a wait for an
// event not yet reached.
inline void drain(cudaStream_t s) {
  while (!s->held && !s->queued.empty()) {
    EmuStreamItem& front = s->queued.front();
    if (front.event != nullptr && front.event->reached < front.until) {
      front.event->waiters.push_back(s);
      return;
    }
    std::function<void()> work = std::move(front.work);
    s->queued.pop_front();
    if (work) work();
  }
}
inline void wake(CUevent_st* e) {
  std::vector<CUstream_st*> waiters;
  waiters.swap(e->waiters);
  for (CUstream_st* s : waiters) drain(s);
}
// Runs `work` now, records it when the stream is being captured, or queues
// it behind the stream's queued work.
inline cudaError_t enqueue(cudaStream_t s, std::function<void()> work) {
  if (s != nullptr && s->capturing) {
    s->capture->push_back(std::move(work));
  } else if (s != nullptr && (s->held || !s->queued.empty())) {
    s->queued.push_back(EmuStreamItem{std::move(work)});
  } else {
    work();
  }
  return cudaSuccess;
}
// A held stream queues its work until it is let go (a slow kernel, seen from
// the streams that should wait for it).
inline void holdStream(cudaStream_t s, bool held) {
  s->held = held;
  if (!held) drain(s);
}
}  // namespace squall_emu

// A stream that cannot finish (held, or waiting for one) is not synchronised
// with: the emulation runs on the caller's thread and would never return.
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  squall_emu::waitForDevice();
  return s != nullptr && !s->queued.empty() ? cudaErrorNotReady : cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new CUevent_st;
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  const uint64_t record = ++e->recorded;
  return squall_emu::enqueue(s, [e, record] {
    if (e->reached < record) e->reached = record;
    squall_emu::wake(e);
  });
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  return e->reached >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}
// Waiting in a capture on work outside it is refused, as CUDA refuses it.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (e->reached >= e->recorded) return cudaSuccess;
  if (s == nullptr) return cudaErrorInvalidValue;  // only created streams queue
  if (s->capturing) return cudaErrorStreamCaptureIsolation;
  s->queued.push_back(EmuStreamItem{nullptr, e, e->recorded});
  squall_emu::drain(s);
  return cudaSuccess;
}

inline cudaError_t cudaMemset(void* p, int v, size_t n) {
  if (n != 0) std::memset(p, v, n);  // CUDA takes empty ranges, whatever the pointers
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
  return squall_emu::enqueue(s, [=] {
    if (n != 0) std::memset(p, v, n);
  });
}
inline cudaError_t cudaMemcpy(void* d, const void* src, size_t n, cudaMemcpyKind) {
  if (n != 0) std::memcpy(d, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* src, size_t n, cudaMemcpyKind,
                                   cudaStream_t s) {
  return squall_emu::enqueue(s, [=] {
    if (n != 0) std::memcpy(d, src, n);
  });
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
