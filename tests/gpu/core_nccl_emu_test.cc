// core::Comm's NCCL engine (src/core/nccl_engine.cc) and the host engine's
// staging of device buffers, under the CPU emulation of CUDA and NCCL
// (tests/gpu/emu): n threads play n ranks, each with a Comm from an
// emulated ncclComm_t and a host Comm over TCP on loopback. What runs on the
// NCCL engine must equal what the host engine computes, bit for bit: the
// compressed allreduce (the host pinned to the two-phase algorithm, see
// tests/gpu/meson.build), the staged compressed allreduce, and a sync-mode
// optimizer step. The host collectives and split are refused on the NCCL
// engine with kInvalidUsage, and the host step of a device optimizer too;
// the compressed reduce-scatter of host buffers with kUnsupported (its
// device form matches the host engine's, and the host engine's staged one).
// Releasing an engine's state off the caller's thread never waits for the
// device, and the capture query asks the runtime.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nccl_emu.h"
#include "src/bootstrap/bootstrap.h"
#include "src/codec/codec.h"
#include "src/core/comm.h"
#include "src/core/compressor_state.h"
#include "tests/gpu/at_exit.h"

namespace squall::core {
namespace {

using testing::AtExit;

struct Rank {
  std::unique_ptr<Comm> host;
  std::unique_ptr<Comm> nccl;
};

// Runs body(rank, comms) on n threads.
void runRanks(int n, const std::function<void(int, Rank&)>& body) {
  bootstrap::UniqueId id;
  ASSERT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  squall_emu::ncclCreateWorld(n, comms.data());
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Rank rank;
      CommConfig config;
      config.transport = TransportKind::kTcp;
      config.timeout = std::chrono::seconds(20);
      if (Comm::create(id, n, r, config, &rank.host) != Status::kOk) {
        errors[static_cast<size_t>(r)] = "host: " + lastError();
        return;
      }
      if (Comm::fromNccl(comms[static_cast<size_t>(r)], &rank.nccl) != Status::kOk) {
        errors[static_cast<size_t>(r)] = "nccl: " + lastError();
        rank.host->barrier();
        return;
      }
      body(r, rank);
      rank.host->barrier();
    });
  }
  for (auto& t : threads) t.join();
  squall_emu::ncclDestroyWorld(n, comms.data());
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

std::vector<float> input(int rank, int call, size_t count) {
  std::mt19937 rng(static_cast<unsigned>(100 * rank + call));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A checkpoint of `from`'s residuals loaded into `into` (the same layout on
// either engine), at an odd offset of the buffer (states load at any
// alignment).
Status copyState(Compressor& from, Compressor& into) {
  size_t bytes = 0, written = 0;
  SQUALL_TRY(compressorStateSize(from, &bytes));
  std::vector<uint8_t> buffer(bytes + 1);
  SQUALL_TRY(saveCompressorState(from, buffer.data() + 1, bytes, &written));
  return loadCompressorState(into, buffer.data() + 1, written);
}

// One rank's stream and device buffer of `count` floats, released at scope
// exit (whatever was made: a failed creation leaves its handle null).
struct DeviceScratch {
  explicit DeviceScratch(size_t count) : count(count) {
    made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
           cudaMalloc(&d, count * sizeof(float)) == cudaSuccess;
  }
  ~DeviceScratch() {
    if (d != nullptr) cudaFree(d);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  // x through the NCCL engine's compressed allreduce, in place on the device.
  Status allReduce(Comm& nccl, Compressor& c, const std::vector<float>& x, ReduceOp op,
                   std::vector<float>* out) {
    cudaMemcpy(d, x.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    SQUALL_TRY(nccl.compressedAllReduceOnStream(d, d, DataType::kF32, op, c, stream));
    out->resize(count);
    cudaMemcpyAsync(out->data(), d, count * sizeof(float), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    return Status::kOk;
  }
  size_t count;
  cudaStream_t stream = nullptr;
  float* d = nullptr;
  bool made = false;
};

TEST(CoreNcclEmu, EngineIdentityAndRefusals) {
  runRanks(2, [](int r, Rank& k) {
    Comm& c = *k.nccl;
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), 2);
    EXPECT_STREQ(c.transportName(), "nccl");
    EXPECT_EQ(c.config().transport, TransportKind::kNccl);
    float x = 1.0f;
    EXPECT_EQ(c.allReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum), Status::kInvalidUsage);
    EXPECT_NE(lastError().find("use NCCL itself"), std::string::npos) << lastError();
    EXPECT_EQ(c.barrier(), Status::kInvalidUsage);
    std::unique_ptr<Comm> sub;
    EXPECT_EQ(c.split(0, 0, &sub), Status::kInvalidUsage);
    // refuse() has no peers to tell on this engine: the check comes back.
    EXPECT_EQ(c.refuse(Status::kInvalidArgument), Status::kInvalidArgument);
    std::unique_ptr<Compressor> comp;
    ASSERT_EQ(c.createCompressor(64, codec::Spec{}, &comp), Status::kOk) << lastError();
    EXPECT_EQ(c.compressedAllReduce(&x, &x, DataType::kF32, ReduceOp::kSum, *comp),
              Status::kInvalidUsage);
    // A compressor of the host Comm is refused on the NCCL one.
    std::unique_ptr<Compressor> hostComp;
    ASSERT_EQ(k.host->createCompressor(64, codec::Spec{}, &hostComp), Status::kOk);
    std::vector<float> v(64, 1.0f);
    EXPECT_EQ(c.compressedAllReduceOnStream(v.data(), v.data(), DataType::kF32, ReduceOp::kSum,
                                            *hostComp, nullptr),
              Status::kInvalidUsage);
    // The compressed reduce-scatter takes device buffers only, and its own
    // compressor, recvcount and layout.
    std::unique_ptr<Compressor> rs;
    ASSERT_EQ(c.createReduceScatterCompressor(32, codec::Spec{}, &rs), Status::kOk) << lastError();
    EXPECT_EQ(rs->layout(), CompressorLayout::kReduceScatter);
    EXPECT_EQ(rs->count(), 64u);
    std::vector<float> shard(32);
    EXPECT_EQ(
        c.compressedReduceScatter(v.data(), shard.data(), 32, DataType::kF32, ReduceOp::kSum, *rs),
        Status::kUnsupported);
    EXPECT_NE(lastError().find("squallCompressedReduceScatterOnStream"), std::string::npos)
        << lastError();
    EXPECT_EQ(c.compressedReduceScatterOnStream(v.data(), shard.data(), 32, DataType::kF32,
                                                ReduceOp::kSum, *comp, nullptr),
              Status::kInvalidUsage);
    EXPECT_EQ(c.compressedReduceScatterOnStream(v.data(), shard.data(), 31, DataType::kF32,
                                                ReduceOp::kSum, *rs, nullptr),
              Status::kInvalidArgument);
    EXPECT_EQ(c.compressedReduceScatterOnStream(v.data(), v.data() + 1, 32, DataType::kF32,
                                                ReduceOp::kSum, *rs, nullptr),
              Status::kInvalidArgument);
    EXPECT_NE(lastError().find("overlaps"), std::string::npos) << lastError();
    EXPECT_EQ(rs->setGatherSpec(codec::Spec{}), Status::kInvalidUsage);
    EXPECT_EQ(rs->setAlgorithm(coll::CompressedAlgo::kTwoPhase), Status::kInvalidUsage);
  });
}

// Several calls, so the residuals of both engines evolve alike.
TEST(CoreNcclEmu, CompressedAllReduceMatchesTheHostEngine) {
  const int n = 3;
  const size_t count = 5000;  // chunks of unequal real length
  runRanks(n, [&](int r, Rank& k) {
    std::unique_ptr<Compressor> dev, host, staged;
    ASSERT_EQ(k.nccl->createCompressor(count, codec::Spec{}, &dev), Status::kOk) << lastError();
    ASSERT_EQ(k.host->createCompressor(count, codec::Spec{}, &host), Status::kOk);
    ASSERT_EQ(k.host->createCompressor(count, codec::Spec{}, &staged), Status::kOk);
    DeviceScratch device(count);
    ASSERT_TRUE(device.made);
    for (int call = 0; call < 3; ++call) {
      const std::vector<float> x = input(r, call, count);
      const ReduceOp op = call == 1 ? ReduceOp::kSum : ReduceOp::kAvg;
      std::vector<float> want(count), got(count), viaStaging(count);
      ASSERT_EQ(k.host->compressedAllReduce(x.data(), want.data(), DataType::kF32, op, *host),
                Status::kOk)
          << lastError();
      ASSERT_EQ(device.allReduce(*k.nccl, *dev, x, op, &got), Status::kOk) << lastError();
      EXPECT_TRUE(sameBits(got, want)) << "rank " << r << " call " << call;
      // The host engine given "device" pointers stages them.
      ASSERT_EQ(k.host->compressedAllReduceOnStream(x.data(), viaStaging.data(), DataType::kF32, op,
                                                    *staged, device.stream),
                Status::kOk)
          << lastError();
      EXPECT_TRUE(sameBits(viaStaging, want)) << "rank " << r << " call " << call;
    }
    // A checkpoint of the device residuals carries on where they were, on
    // either engine: the next call of a fresh compressor loaded from it
    // equals the next call of the one that made it.
    std::unique_ptr<Compressor> devLoaded, hostLoaded;
    ASSERT_EQ(k.nccl->createCompressor(count, codec::Spec{}, &devLoaded), Status::kOk);
    ASSERT_EQ(k.host->createCompressor(count, codec::Spec{}, &hostLoaded), Status::kOk);
    ASSERT_EQ(copyState(*dev, *devLoaded), Status::kOk) << lastError();
    ASSERT_EQ(copyState(*dev, *hostLoaded), Status::kOk) << lastError();
    {
      const std::vector<float> x = input(r, 3, count);
      std::vector<float> want(count), got(count), fromDevice(count), fromHost(count);
      ASSERT_EQ(device.allReduce(*k.nccl, *dev, x, ReduceOp::kAvg, &want), Status::kOk);
      ASSERT_EQ(device.allReduce(*k.nccl, *devLoaded, x, ReduceOp::kAvg, &fromDevice), Status::kOk);
      ASSERT_EQ(k.host->compressedAllReduce(x.data(), fromHost.data(), DataType::kF32,
                                            ReduceOp::kAvg, *hostLoaded),
                Status::kOk)
          << lastError();
      EXPECT_TRUE(sameBits(fromDevice, want)) << "rank " << r;
      EXPECT_TRUE(sameBits(fromHost, want)) << "rank " << r;
    }
    CompressorStats ds, hs;
    ASSERT_EQ(dev->stats(&ds), Status::kOk) << lastError();
    ASSERT_EQ(host->stats(&hs), Status::kOk);
    EXPECT_EQ(ds.calls, 4u);
    EXPECT_EQ(hs.calls, 3u);
    EXPECT_EQ(ds.skippedCalls, 0u);
    EXPECT_GT(ds.bytesSent, 0u);
    ASSERT_EQ(dev->reset(), Status::kOk) << lastError();
  });
}

// The compressed reduce-scatter: the NCCL engine's (in place on the device:
// the output is this rank's piece of the input) and the host engine's staged
// one equal the host engine's, call after call, with pieces that are not a
// whole number of blocks.
TEST(CoreNcclEmu, CompressedReduceScatterMatchesTheHostEngine) {
  const int n = 3;
  const size_t recvcount = 1001;
  const size_t count = n * recvcount;
  codec::Spec int4;
  int4.codec = codec::CodecId::kInt4;
  int4.block = 256;
  runRanks(n, [&](int r, Rank& k) {
    std::unique_ptr<Compressor> dev, host, staged;
    ASSERT_EQ(k.nccl->createReduceScatterCompressor(recvcount, int4, &dev), Status::kOk)
        << lastError();
    ASSERT_EQ(k.host->createReduceScatterCompressor(recvcount, int4, &host), Status::kOk);
    ASSERT_EQ(k.host->createReduceScatterCompressor(recvcount, int4, &staged), Status::kOk);
    DeviceScratch device(count);
    ASSERT_TRUE(device.made);
    float* mine = device.d + static_cast<size_t>(r) * recvcount;
    for (int call = 0; call < 3; ++call) {
      const std::vector<float> x = input(r, call, count);
      const ReduceOp op = call == 1 ? ReduceOp::kSum : ReduceOp::kAvg;
      std::vector<float> want(recvcount), got(recvcount), viaStaging(recvcount);
      ASSERT_EQ(k.host->compressedReduceScatter(x.data(), want.data(), recvcount, DataType::kF32,
                                                op, *host),
                Status::kOk)
          << lastError();
      cudaMemcpy(device.d, x.data(), count * sizeof(float), cudaMemcpyHostToDevice);
      ASSERT_EQ(k.nccl->compressedReduceScatterOnStream(device.d, mine, recvcount, DataType::kF32,
                                                        op, *dev, device.stream),
                Status::kOk)
          << lastError();
      cudaMemcpyAsync(got.data(), mine, recvcount * sizeof(float), cudaMemcpyDeviceToHost,
                      device.stream);
      cudaStreamSynchronize(device.stream);
      EXPECT_TRUE(sameBits(got, want)) << "rank " << r << " call " << call;
      ASSERT_EQ(k.host->compressedReduceScatterOnStream(x.data(), viaStaging.data(), recvcount,
                                                        DataType::kF32, op, *staged, device.stream),
                Status::kOk)
          << lastError();
      EXPECT_TRUE(sameBits(viaStaging, want)) << "rank " << r << " call " << call;
    }
    // The checkpoint of the device residual, loaded into a host compressor,
    // gives the host engine's next call the device's own next result.
    std::unique_ptr<Compressor> hostLoaded;
    ASSERT_EQ(k.host->createReduceScatterCompressor(recvcount, int4, &hostLoaded), Status::kOk);
    ASSERT_EQ(copyState(*dev, *hostLoaded), Status::kOk) << lastError();
    {
      const std::vector<float> x = input(r, 3, count);
      std::vector<float> want(recvcount), got(recvcount);
      ASSERT_EQ(k.host->compressedReduceScatter(x.data(), got.data(), recvcount, DataType::kF32,
                                                ReduceOp::kAvg, *hostLoaded),
                Status::kOk)
          << lastError();
      cudaMemcpy(device.d, x.data(), count * sizeof(float), cudaMemcpyHostToDevice);
      ASSERT_EQ(k.nccl->compressedReduceScatterOnStream(device.d, mine, recvcount, DataType::kF32,
                                                        ReduceOp::kAvg, *dev, device.stream),
                Status::kOk);
      cudaMemcpyAsync(want.data(), mine, recvcount * sizeof(float), cudaMemcpyDeviceToHost,
                      device.stream);
      cudaStreamSynchronize(device.stream);
      EXPECT_TRUE(sameBits(got, want)) << "rank " << r;
    }
    CompressorStats ds;
    ASSERT_EQ(dev->stats(&ds), Status::kOk) << lastError();
    EXPECT_EQ(ds.calls, 4u);
    EXPECT_STREQ(ds.algorithm, "reducescatter");
    size_t piece = 0;
    ASSERT_EQ(codec::encodedSize(int4, recvcount, &piece), Status::kOk);
    EXPECT_EQ(ds.bytesSent, (n - 1) * (piece + sizeof(int)));
    EXPECT_EQ(dev->bytesSentPerCall(), ds.bytesSent);  // the same, without waiting
  });
}

// The quantized all-gather: the NCCL engine's (in place on the device: the
// input is this rank's piece of the output) and the host engine's staged one
// equal the host engine's, and no compressor of another layout runs it.
TEST(CoreNcclEmu, CompressedAllGatherMatchesTheHostEngine) {
  const int n = 3;
  const size_t count = 1001;
  codec::Spec int8;
  int8.codec = codec::CodecId::kInt8;
  int8.block = 256;
  runRanks(n, [&](int r, Rank& k) {
    std::unique_ptr<Compressor> dev, host, staged, other;
    ASSERT_EQ(k.nccl->createAllGatherCompressor(count, int8, &dev), Status::kOk) << lastError();
    ASSERT_EQ(k.host->createAllGatherCompressor(count, int8, &host), Status::kOk);
    ASSERT_EQ(k.host->createAllGatherCompressor(count, int8, &staged), Status::kOk);
    EXPECT_EQ(dev->layout(), CompressorLayout::kAllGather);
    DeviceScratch device(count * n);
    ASSERT_TRUE(device.made);
    float* mine = device.d + static_cast<size_t>(r) * count;
    for (int call = 0; call < 2; ++call) {
      const std::vector<float> x = input(r, call, count);
      std::vector<float> want(count * n), got(count * n), viaStaging(count * n);
      ASSERT_EQ(k.host->compressedAllGather(x.data(), want.data(), DataType::kF32, *host),
                Status::kOk)
          << lastError();
      cudaMemcpy(mine, x.data(), count * sizeof(float), cudaMemcpyHostToDevice);
      ASSERT_EQ(
          k.nccl->compressedAllGatherOnStream(mine, device.d, DataType::kF32, *dev, device.stream),
          Status::kOk)
          << lastError();
      cudaMemcpyAsync(got.data(), device.d, count * n * sizeof(float), cudaMemcpyDeviceToHost,
                      device.stream);
      cudaStreamSynchronize(device.stream);
      EXPECT_TRUE(sameBits(got, want)) << "rank " << r << " call " << call;
      ASSERT_EQ(k.host->compressedAllGatherOnStream(x.data(), viaStaging.data(), DataType::kF32,
                                                    *staged, device.stream),
                Status::kOk)
          << lastError();
      EXPECT_TRUE(sameBits(viaStaging, want)) << "rank " << r << " call " << call;
    }
    EXPECT_EQ(dev->bytesSentPerCall(), host->bytesSentPerCall());
    ASSERT_EQ(k.nccl->createCompressor(count, int8, &other), Status::kOk);
    EXPECT_EQ(
        k.nccl->compressedAllGatherOnStream(mine, device.d, DataType::kF32, *other, device.stream),
        Status::kInvalidUsage);
    EXPECT_EQ(k.nccl->compressedAllGather(mine, device.d, DataType::kF32, *dev),
              Status::kUnsupported);
  });
}

// The interposer's default at 4 ranks: int4 workers and an int8 second
// round, the same bits on both engines call after call; the device takes
// the second round's code before its first call only.
TEST(CoreNcclEmu, AGatherCodeMatchesTheHostEngine) {
  const int n = 4;
  const size_t count = 5000;
  codec::Spec int4, int8;
  int4.codec = codec::CodecId::kInt4;
  int4.block = 256;
  int8.codec = codec::CodecId::kInt8;
  runRanks(n, [&](int r, Rank& k) {
    std::unique_ptr<Compressor> dev, host, same;
    ASSERT_EQ(k.nccl->createCompressor(count, int4, &dev), Status::kOk) << lastError();
    ASSERT_EQ(k.host->createCompressor(count, int4, &host), Status::kOk);
    ASSERT_EQ(k.host->createCompressor(count, int4, &same), Status::kOk);
    ASSERT_EQ(dev->setGatherSpec(int8), Status::kOk) << lastError();
    ASSERT_EQ(host->setGatherSpec(int8), Status::kOk) << lastError();
    DeviceScratch device(count);
    ASSERT_TRUE(device.made);
    for (int call = 0; call < 3; ++call) {
      const std::vector<float> x = input(r, call, count);
      std::vector<float> want(count), got(count), int4Both(count);
      ASSERT_EQ(
          k.host->compressedAllReduce(x.data(), want.data(), DataType::kF32, ReduceOp::kAvg, *host),
          Status::kOk)
          << lastError();
      ASSERT_EQ(k.host->compressedAllReduce(x.data(), int4Both.data(), DataType::kF32,
                                            ReduceOp::kAvg, *same),
                Status::kOk);
      ASSERT_EQ(device.allReduce(*k.nccl, *dev, x, ReduceOp::kAvg, &got), Status::kOk)
          << lastError();
      EXPECT_TRUE(sameBits(got, want)) << "rank " << r << " call " << call;
      EXPECT_FALSE(sameBits(got, int4Both)) << "the int8 round changed nothing, call " << call;
    }
    EXPECT_EQ(dev->setGatherSpec(int4), Status::kInvalidUsage);
    EXPECT_NE(lastError().find("before its first call"), std::string::npos) << lastError();
    // Bytes: 3 int4 pieces out, 3 whole int8 gather slots (1280 elements) out.
    size_t piece = 0, slot = 0;
    ASSERT_EQ(codec::encodedSize(int8, 1280, &slot), Status::kOk);
    ASSERT_EQ(codec::encodedSize(int4, 1280, &piece), Status::kOk);
    CompressorStats ds;
    ASSERT_EQ(dev->stats(&ds), Status::kOk) << lastError();
    if (r == n - 1) {
      EXPECT_EQ(ds.bytesSent, 3 * (piece + slot));
    }
    EXPECT_EQ(dev->bytesSentPerCall(), ds.bytesSent);  // the same, without waiting
  });
}

TEST(CoreNcclEmu, SyncOptimizerMatchesTheHostEngine) {
  const int n = 2;
  const size_t count = 300;
  runRanks(n, [&](int r, Rank& k) {
    optim::Config config;
    config.mode = optim::Mode::kSync;
    std::unique_ptr<Optimizer> dev, host;
    ASSERT_EQ(k.nccl->createOptimizer(count, config, &dev), Status::kOk) << lastError();
    ASSERT_EQ(k.host->createOptimizer(count, config, &host), Status::kOk) << lastError();
    // Gradients that are multiples of 2^-10: sums are exact in any order.
    std::vector<float> g(count), x(count, 0.5f), dx(count, 0.5f);
    for (size_t i = 0; i < count; ++i)
      g[i] = static_cast<float>((i * 7 + static_cast<size_t>(r) * 13) % 64) / 1024.0f;
    EXPECT_EQ(dev->step(x.data(), g.data(), 0.0f), Status::kInvalidUsage);
    EXPECT_NE(lastError().find("squallOptimizerStepOnStream"), std::string::npos) << lastError();
    cudaStream_t stream = nullptr;
    // Armed before the creation, so a stream made but not reported as made is freed too.
    const AtExit destroyStream{[&] {
      if (stream != nullptr) cudaStreamDestroy(stream);
    }};
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    for (int s = 0; s < 3; ++s) {
      ASSERT_EQ(host->step(x.data(), g.data(), 0.0f), Status::kOk) << lastError();
      ASSERT_EQ(dev->stepOnStream(dx.data(), g.data(), 0.0f, stream), Status::kOk) << lastError();
    }
    EXPECT_TRUE(sameBits(dx, x)) << "rank " << r;
    optim::Info di, hi;
    ASSERT_EQ(dev->info(&di), Status::kOk);
    ASSERT_EQ(host->info(&hi), Status::kOk);
    EXPECT_EQ(di.step, 3);
    EXPECT_EQ(di.step, hi.step);
    size_t bytes = 0;
    ASSERT_EQ(dev->stateSize(&bytes), Status::kOk);
    std::vector<unsigned char> blob(bytes);
    size_t written = 0;
    ASSERT_EQ(dev->saveState(blob.data(), blob.size(), &written), Status::kOk) << lastError();
    // The device blob loads into the host optimizer (one format).
    ASSERT_EQ(host->loadState(blob.data(), written), Status::kOk) << lastError();
  });
}

// An abort frees its communicator's device state through releaseLater,
// which must not wait for the device: a kernel of another communicator stuck
// on a dead peer would keep it busy for good. Here the device is held (every
// cudaFree waits) while a Comm from NCCL and two compressors are released:
// the call returns at once, and they are freed, with their device current,
// once the device lets go.
TEST(CoreNcclEmu, ReleaseLaterNeverWaitsForTheDevice) {
  std::vector<ncclComm_t> comms(2);
  squall_emu::ncclCreateWorld(2, comms.data());
  const AtExit destroyWorld{[&] { squall_emu::ncclDestroyWorld(2, comms.data()); }};
  const AtExit device0{[] { cudaSetDevice(0); }};
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  struct Doomed {  // the compressors go before the Comm they were made on
    std::unique_ptr<Comm> comm;
    std::unique_ptr<Compressor> a, b;
  };
  auto doomed = std::make_shared<Doomed>();
  const long before = squall_emu::gLiveAllocations.load();
  ASSERT_EQ(Comm::fromNccl(comms[0], &doomed->comm), Status::kOk) << lastError();
  EXPECT_EQ(doomed->comm->device(), 1);
  ASSERT_EQ(doomed->comm->createCompressor(5000, codec::Spec{}, &doomed->a), Status::kOk)
      << lastError();
  ASSERT_EQ(doomed->comm->createCompressor(300, codec::Spec{}, &doomed->b), Status::kOk);
  const long allocated = squall_emu::gLiveAllocations.load() - before;
  ASSERT_GT(allocated, 0);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);

  std::future<void> released;  // before the hold's release: its end waits for the call
  squall_emu::holdDevice(true);
  const AtExit letGo{[] { squall_emu::holdDevice(false); }};
  released = std::async(std::launch::async, [&] { releaseLater(std::move(doomed), 1); });
  ASSERT_EQ(released.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "releaseLater waited for the device";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(squall_emu::gLiveAllocations.load() - before, allocated)
      << "device memory was freed while the device was held";

  squall_emu::holdDevice(false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (squall_emu::gLiveAllocations.load() != before &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(squall_emu::gLiveAllocations.load(), before) << "the released state was never freed";
  EXPECT_EQ(squall_emu::gLastFreeDevice.load(), 1) << "freed with another device current";
}

// Not capturing, capturing, and not again: as the runtime says.
TEST(CoreNcclEmu, StreamIsCapturingAsksTheRuntime) {
  cudaStream_t stream = nullptr;
  const cudaError_t created = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const AtExit destroyStream{[&] {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }};
  ASSERT_EQ(created, cudaSuccess);
  bool capturing = true;
  ASSERT_EQ(streamIsCapturing(stream, &capturing), Status::kOk);
  EXPECT_FALSE(capturing);
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  ASSERT_EQ(streamIsCapturing(stream, &capturing), Status::kOk);
  EXPECT_TRUE(capturing);
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  cudaGraphDestroy(graph);
  ASSERT_EQ(streamIsCapturing(stream, &capturing), Status::kOk);
  EXPECT_FALSE(capturing);
}

}  // namespace
}  // namespace squall::core
