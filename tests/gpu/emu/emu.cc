// The thread pool behind tests/gpu/emu/cuda_runtime_api.h: one OS thread per
// CUDA thread of a block, started and joined with barriers once per block.
#include <cuda_runtime_api.h>

#include <barrier>
#include <memory>
#include <mutex>
#include <thread>

namespace squall_emu {

struct Pool {
  Pool() {
    for (unsigned id = 0; id < kMaxThreads; ++id) {
      std::thread([this, id] { work(id); }).detach();
    }
  }
  void work(unsigned id) {
    for (;;) {
      start.arrive_and_wait();
      if (id < active) {
        tThreadIdx = dim3{id, 0, 0};
        tBlockIdx = gBlockIdx;
        (*body)();
      }
      end.arrive_and_wait();
    }
  }
  std::barrier<> start{kMaxThreads + 1};
  std::barrier<> end{kMaxThreads + 1};
  std::unique_ptr<std::barrier<>> blockBarrier;
  Warp warps[kMaxThreads / 32];
  const std::function<void()>* body = nullptr;
  unsigned active = 0;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: its threads wait until exit
  return *p;
}

Warp& warpOf(unsigned thread) { return pool().warps[thread / 32]; }

void syncBlock() { pool().blockBarrier->arrive_and_wait(); }

void runGrid(unsigned grid, unsigned threads, const std::function<void()>& block) {
  // One grid at a time: several host threads (the emulated ranks of a
  // collective test) may launch at once, and there is one pool.
  static std::mutex gridMutex;
  std::lock_guard<std::mutex> lock(gridMutex);
  if (threads == 0 || threads > kMaxThreads || (threads > 32 && threads % 32 != 0)) std::abort();
  Pool& p = pool();
  p.blockBarrier = std::make_unique<std::barrier<>>(threads);
  p.body = &block;
  p.active = threads;
  gGridDim = dim3{grid, 1, 1};
  gBlockDim = dim3{threads, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    gBlockIdx = dim3{b, 0, 0};
    p.start.arrive_and_wait();
    p.end.arrive_and_wait();
  }
}

}  // namespace squall_emu
