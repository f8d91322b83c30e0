// The device optimizer (src/optim/cuda) under the CPU emulation of CUDA and
// NCCL (tests/gpu/emu): n threads play n ranks, run device steps, and must
// match the host optimizer (src/optim, ranks as threads over the local
// transport) bit for bit. Gradients are multiples of 2^-10 of magnitude <= 1,
// so their sums are exact in any order and the two allreduces (ring on the
// host, rank order in the fake NCCL) agree; the host's compressed allreduce
// is pinned to the two-phase algorithm, the one the device runs; the parameter averages of SlowMo
// run on 2 ranks, where a sum of two values is order-free.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nccl_emu.h"
#include "src/coll/context.h"
#include "src/optim/cuda/device_optimizer.h"
#include "src/optim/optimizer.h"
#include "src/optim/state_blob.h"
#include "tests/gpu/at_exit.h"
#include "tests/unit/coll_harness.h"

namespace squall {
namespace {

using optim::Config;
using optim::Mode;
using optim::Optimizer;
using optim::cuda::createDeviceOptimizer;

// Bit-for-bit equality of float arrays (NaNs and signed zeros included).
bool sameFloatBits(const float* a, const float* b, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

constexpr size_t kCount = 1000;  // not a multiple of the block: padding

std::vector<float> gradient(int rank, int step, size_t count, int nanStep, int nanRank) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + rank + 7));
  std::uniform_int_distribution<int> dist(-1024, 1024);
  std::vector<float> g(count);
  for (float& x : g) x = static_cast<float>(dist(rng)) / 1024.0f;
  // Exercise the APMSqueeze guard: elements that never get a gradient (the
  // mask) and elements whose gradient is tiny in the first steps (the clip).
  for (size_t i = 3; i < count; i += 7) g[i] = 0.0f;
  if (step < 2)
    for (size_t i = 5; i < count; i += 11) g[i] *= 1.0f / 4096.0f;
  if (step == nanStep && rank == nanRank) g[count / 2] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

std::vector<float> initialParams(int rank, bool perRank) {
  std::mt19937 rng(perRank ? 42 + rank : 42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(kCount);
  for (float& v : x) v = dist(rng);
  return x;
}

struct Run {
  std::vector<std::vector<float>> params;
  std::vector<optim::Info> info;
  std::vector<std::vector<unsigned char>> state;
};

Run runHost(int n, const Config& c, int steps, bool perRank, int nanStep, int nanRank) {
  // The device path always runs the two-phase algorithm; the host would pick
  // the all-gather one for buffers this small (a different, also consistent,
  // result), so it is pinned here.
  coll::Options options = testing::testOptions();
  options.compressedAlgo = coll::CompressedAlgo::kTwoPhase;
  testing::Group group(n, options);
  Run out;
  out.params.resize(n);
  out.info.resize(n);
  out.state.resize(n);
  group.run([&](coll::Communicator& comm, int r) {
    std::unique_ptr<Optimizer> o;
    ASSERT_EQ(Optimizer::create(&comm, kCount, c, &o), Status::kOk) << lastError();
    std::vector<float> x = initialParams(r, perRank);
    for (int s = 0; s < steps; ++s) {
      const std::vector<float> g = gradient(r, s, kCount, nanStep, nanRank);
      ASSERT_EQ(o->step(x.data(), g.data(), s % 2 == 0 ? 0.0f : 2e-3f), Status::kOk) << lastError();
    }
    out.params[r] = x;
    out.info[r] = o->info();
    out.state[r].resize(o->stateSize());
    size_t written = 0;
    ASSERT_EQ(o->saveState(out.state[r].data(), out.state[r].size(), &written), Status::kOk);
  });
  return out;
}

Run runDevice(int n, const Config& c, int steps, bool perRank, int nanStep, int nanRank) {
  std::vector<ncclComm_t> comms(n);
  squall_emu::ncclCreateWorld(n, comms.data());
  Run out;
  out.params.resize(n);
  out.info.resize(n);
  out.state.resize(n);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaStream_t stream = nullptr;
      float *dx = nullptr, *dg = nullptr;
      const testing::AtExit release{[&] {
        if (dx != nullptr) cudaFree(dx);
        if (dg != nullptr) cudaFree(dg);
        if (stream != nullptr) cudaStreamDestroy(stream);
      }};
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      transport::nccl::DeviceComm comm;
      ASSERT_EQ(transport::nccl::DeviceComm::wrap(comms[r], &comm), Status::kOk) << lastError();
      ASSERT_EQ(comm.rank(), r);
      ASSERT_EQ(comm.size(), n);
      std::unique_ptr<Optimizer> o;
      ASSERT_EQ(createDeviceOptimizer(comm, kCount, c, &o), Status::kOk) << lastError();
      ASSERT_EQ(cudaMalloc(&dx, kCount * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dg, kCount * sizeof(float)), cudaSuccess);
      const std::vector<float> x0 = initialParams(r, perRank);
      cudaMemcpy(dx, x0.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
      for (int s = 0; s < steps; ++s) {
        const std::vector<float> g = gradient(r, s, kCount, nanStep, nanRank);
        cudaMemcpyAsync(dg, g.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, stream);
        ASSERT_EQ(o->stepOnStream(dx, dg, s % 2 == 0 ? 0.0f : 2e-3f, stream), Status::kOk)
            << lastError();
      }
      out.params[r].resize(kCount);
      cudaMemcpyAsync(out.params[r].data(), dx, kCount * sizeof(float), cudaMemcpyDeviceToHost,
                      stream);
      cudaStreamSynchronize(stream);
      out.info[r] = o->info();
      out.state[r].resize(o->stateSize());
      size_t written = 0;
      ASSERT_EQ(o->saveState(out.state[r].data(), out.state[r].size(), &written), Status::kOk)
          << lastError();
      // The blob loads back into a fresh device optimizer.
      std::unique_ptr<Optimizer> o2;
      ASSERT_EQ(createDeviceOptimizer(comm, kCount, c, &o2), Status::kOk);
      ASSERT_EQ(o2->loadState(out.state[r].data(), written), Status::kOk) << lastError();
      EXPECT_EQ(o2->info().step, out.info[r].step);
    });
  }
  for (auto& t : threads) t.join();
  squall_emu::ncclDestroyWorld(n, comms.data());
  return out;
}

void expectSame(int n, const Config& c, int steps, bool perRank = false, int nanStep = -1,
                int nanRank = 0) {
  const Run host = runHost(n, c, steps, perRank, nanStep, nanRank);
  const Run dev = runDevice(n, c, steps, perRank, nanStep, nanRank);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(dev.params[r].size(), kCount);
    size_t diff = 0;
    for (size_t i = 0; i < kCount; ++i)
      diff +=
          std::bit_cast<uint32_t>(dev.params[r][i]) != std::bit_cast<uint32_t>(host.params[r][i]);
    EXPECT_EQ(diff, 0u) << "rank " << r << ": " << diff << " parameters differ";
    EXPECT_EQ(dev.info[r].step, host.info[r].step);
    EXPECT_EQ(dev.info[r].phase, host.info[r].phase);
    EXPECT_EQ(dev.info[r].skippedSteps, host.info[r].skippedSteps);
    EXPECT_EQ(dev.info[r].bytesSent != 0, host.info[r].bytesSent != 0);
    if (nanStep >= 0) {
      EXPECT_EQ(host.info[r].skippedSteps, 1u) << "rank " << r;
    }
    // The same state blob: every section (m, v, residuals, SlowMo buffers)
    // bit for bit, and the header's counters.
    ASSERT_EQ(dev.state[r].size(), host.state[r].size()) << "rank " << r;
    optim::ParsedBlob hb, db;
    ASSERT_EQ(optim::parseBlob(host.state[r].data(), host.state[r].size(), &hb), Status::kOk);
    ASSERT_EQ(optim::parseBlob(dev.state[r].data(), dev.state[r].size(), &db), Status::kOk);
    ASSERT_EQ(db.sections.size(), hb.sections.size());
    for (size_t k = 0; k < hb.sections.size(); ++k) {
      EXPECT_EQ(db.sections[k].name, hb.sections[k].name);
      EXPECT_TRUE(db.sections[k].data.size() == hb.sections[k].data.size() &&
                  sameFloatBits(db.sections[k].data.data(), hb.sections[k].data.data(),
                                hb.sections[k].data.size()))
          << "rank " << r << ": section " << hb.sections[k].name << " differs";
    }
    EXPECT_EQ(db.header.adamSteps, hb.header.adamSteps);
    EXPECT_EQ(db.header.phase, hb.header.phase);
    EXPECT_EQ(dev.info[r].warmupSteps, host.info[r].warmupSteps);
    EXPECT_EQ(db.header.frozenAt, hb.header.frozenAt);
    EXPECT_EQ(db.header.snapAdamSteps, hb.header.snapAdamSteps);
    // The same bits of the measured change: the freeze decision cannot differ.
    EXPECT_EQ(std::bit_cast<uint64_t>(dev.info[r].varianceChange),
              std::bit_cast<uint64_t>(host.info[r].varianceChange));
  }
}

Config apm(int64_t warmup) {
  Config c;
  c.mode = Mode::kApmSqueeze;
  c.lr = 1e-3f;
  c.weightDecay = 0.01f;
  c.warmupSteps = warmup;
  c.codec.block = 256;
  return c;
}

TEST(DeviceOptimizerEmu, ApmSqueezeCrossesTheSwitch2Ranks) { expectSame(2, apm(3), 8); }
TEST(DeviceOptimizerEmu, ApmSqueezeCrossesTheSwitch4Ranks) { expectSame(4, apm(2), 6); }

// The adaptive warmup: the device's variance sums take the host's order, so
// both freeze after the same step (here the first possible one, 2 windows,
// long before the bound of 50) and stay bit-identical after it.
TEST(DeviceOptimizerEmu, AdaptiveWarmupFreezesWhereTheHostDoes) {
  Config c = apm(50);
  c.freezeThreshold = 10.0;  // any measured change is below it
  c.freezeWindow = 2;
  const auto host = runHost(3, c, 7, false, -1, 0);
  EXPECT_EQ(host.info[0].phase, optim::Phase::kCompressed);
  EXPECT_EQ(host.info[0].warmupSteps, 4);
  EXPECT_GT(host.info[0].varianceChange, 0.0);
  expectSame(3, c, 7);
}

TEST(DeviceOptimizerEmu, AdaptiveWarmupStillWarmingUp) {
  Config c = apm(50);
  c.freezeThreshold = 1e-9;  // never below it: the snapshot travels in the blob
  c.freezeWindow = 2;
  expectSame(2, c, 5);
}

// The optimizer's default block scale (SQUALL_OPTIM_SCALE): the device's
// RMS encoder gives the host's bits through the switch and after it.
TEST(DeviceOptimizerEmu, RmsScaleMatchesTheHost) {
  Config c = apm(3);
  c.codec.scale = codec::Scale::kRms;
  c.codec.block = 64;
  expectSame(2, c, 8);
  expectSame(4, c, 6);
}

TEST(DeviceOptimizerEmu, Bf16WarmupMatchesTheHost) {
  Config c = apm(4);
  c.warmupCodec = codec::CodecId::kBf16;
  expectSame(3, c, 7);
}

TEST(DeviceOptimizerEmu, Sync4Ranks) {
  Config c = apm(0);
  c.mode = Mode::kSync;
  expectSame(4, c, 5);
}

TEST(DeviceOptimizerEmu, SlowMoFullPrecision) {
  Config c = apm(0);
  c.mode = Mode::kLocal;
  c.slowmoTau = 3;
  c.slowmoAlpha = 1.0f;
  c.slowmoBeta = 0.5f;
  expectSame(2, c, 7, /*perRank=*/true);
}

TEST(DeviceOptimizerEmu, SlowMoCompressed) {
  Config c = apm(0);
  c.mode = Mode::kLocal;
  c.slowmoTau = 2;
  c.slowmoAlpha = 0.8f;
  c.slowmoBeta = 0.3f;
  c.slowmoCompressed = true;
  expectSame(2, c, 6, /*perRank=*/true);
}

TEST(DeviceOptimizerEmu, NonFiniteWarmupGradientSkips) { expectSame(2, apm(4), 7, false, 1, 1); }

TEST(DeviceOptimizerEmu, NonFiniteCompressedGradientSkipsAndRollsBack) {
  expectSame(4, apm(2), 7, false, 4, 2);
}

// The emulated NCCL waits forever for a message that never comes: a rank
// left waiting in a collective would hang the test, so a watchdog ends the
// process with a message instead.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit)
      : thread_([this, limit] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "FAILED: a rank hung in a collective for %lld s\n",
                         static_cast<long long>(limit.count()));
            std::_Exit(1);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// A rank whose device step is refused for a bad argument (a null gradient at
// the first refused step; a host-buffer step() on the device optimizer at the
// second) tells its peers through the step's status words: their step fails
// at once with kRemoteError naming it, before it changes any state. Each
// rank then takes the refused step again and the run ends bit-identical to
// the host optimizer's run that never saw the refusals. Returns the phases
// the refused steps were in.
std::vector<optim::Phase> expectRefusalsFailThePeers(int n, const Config& c, int steps,
                                                     const std::vector<int>& refused,
                                                     bool perRank) {
  const int refuser = 1;
  const squall::Run host = runHost(n, c, steps, perRank, -1, 0);
  std::vector<optim::Phase> phases(refused.size());
  std::vector<ncclComm_t> comms(n);
  squall_emu::ncclCreateWorld(n, comms.data());
  std::vector<std::vector<float>> params(n);
  Watchdog watchdog(std::chrono::seconds(60));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaStream_t stream = nullptr;
      float *dx = nullptr, *dg = nullptr;
      const testing::AtExit release{[&] {
        if (dx != nullptr) cudaFree(dx);
        if (dg != nullptr) cudaFree(dg);
        if (stream != nullptr) cudaStreamDestroy(stream);
      }};
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      transport::nccl::DeviceComm comm;
      ASSERT_EQ(transport::nccl::DeviceComm::wrap(comms[r], &comm), Status::kOk) << lastError();
      ASSERT_EQ(comm.rank(), r);
      ASSERT_EQ(comm.size(), n);
      std::unique_ptr<Optimizer> o;
      ASSERT_EQ(createDeviceOptimizer(comm, kCount, c, &o), Status::kOk) << lastError();
      ASSERT_EQ(cudaMalloc(&dx, kCount * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dg, kCount * sizeof(float)), cudaSuccess);
      const std::vector<float> x0 = initialParams(r, perRank);
      cudaMemcpy(dx, x0.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
      auto download = [&] {
        std::vector<float> x(kCount);
        cudaMemcpyAsync(x.data(), dx, kCount * sizeof(float), cudaMemcpyDeviceToHost, stream);
        cudaStreamSynchronize(stream);
        return x;
      };
      for (int s = 0; s < steps; ++s) {
        const std::vector<float> g = gradient(r, s, kCount, -1, 0);
        cudaMemcpyAsync(dg, g.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, stream);
        const float lr = s % 2 == 0 ? 0.0f : 2e-3f;
        if (s == refused[0] || s == refused[1]) {
          SCOPED_TRACE("rank " + std::to_string(r) + ", refused step " + std::to_string(s));
          const std::vector<float> before = download();
          const optim::Phase phaseBefore = o->info().phase;
          clearLastError();
          const auto begin = std::chrono::steady_clock::now();
          Status status;
          if (r != refuser)
            status = o->stepOnStream(dx, dg, lr, stream);
          else if (s == refused[0])
            status = o->stepOnStream(dx, nullptr, lr, stream);
          else
            status = o->step(dx, dg, lr);
          // A copy: the assertions below may run code that sets the last error.
          // NOLINTNEXTLINE(performance-unnecessary-copy-initialization)
          const std::string message = lastError();
          EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(3));
          if (r == refuser) {
            EXPECT_EQ(status, s == refused[0] ? Status::kInvalidArgument : Status::kInvalidUsage)
                << message;
          } else {
            EXPECT_EQ(status, Status::kRemoteError) << message;
            EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
          }
          const std::vector<float> after = download();
          EXPECT_TRUE(sameFloatBits(before.data(), after.data(), kCount));
          EXPECT_EQ(o->info().step, s);  // not counted
          EXPECT_EQ(o->info().phase, phaseBefore);
          if (r == 0) phases[s == refused[0] ? 0 : 1] = phaseBefore;
        }
        ASSERT_EQ(o->stepOnStream(dx, dg, lr, stream), Status::kOk) << lastError();
      }
      params[r] = download();
      EXPECT_EQ(o->info().step, steps);
    });
  }
  for (auto& t : threads) t.join();
  squall_emu::ncclDestroyWorld(n, comms.data());
  for (int r = 0; r < n; ++r) {
    if (params[r].size() != kCount) {
      ADD_FAILURE() << "rank " << r << " did not finish";
      continue;
    }
    EXPECT_TRUE(sameFloatBits(params[r].data(), host.params[r].data(), kCount))
        << "rank " << r << " differs from the host run without refusals";
  }
  return phases;
}

TEST(DeviceOptimizerEmu, ARanksRefusedStepFailsThePeersStepAtOnce) {
  // A warmup step and a compressed one (the switch is after step 3).
  const std::vector<optim::Phase> phases = expectRefusalsFailThePeers(3, apm(3), 7, {1, 4}, false);
  EXPECT_EQ(phases, (std::vector<optim::Phase>{optim::Phase::kWarmup, optim::Phase::kCompressed}));
}

TEST(DeviceOptimizerEmu, ARanksRefusedSlowMoStepFailsThePeersStepAtOnce) {
  // Local mode communicates only on the first step (the full-precision
  // x_prev of compressed SlowMo) and on synchronisation steps: both refused.
  Config c = apm(0);
  c.mode = Mode::kLocal;
  c.slowmoTau = 2;
  c.slowmoAlpha = 0.8f;
  c.slowmoBeta = 0.3f;
  c.slowmoCompressed = true;
  expectRefusalsFailThePeers(2, c, 6, {0, 3}, true);
}

}  // namespace
}  // namespace squall
