// The device compressed allreduce (src/coll/device) under the CPU emulation of
// CUDA and NCCL (tests/gpu/emu): n threads play n ranks, and every rank's
// output must equal the single-process reference simulation
// (tests/unit/compressed_reference.h) bit for bit, call after call (so the
// residuals evolve alike), in place and out of place, for sum and avg,
// onebit/int8/fp16, chunks that are short or empty, bf16 buffers, a call
// captured into a (emulated) CUDA graph and replayed, and one state used
// from two streams. It checks the
// orchestration's bytes, not the hardware: see docs/cuda.md. The compressed
// reduce-scatter of the same file is checked the same way against
// testing::ReduceScatterReference.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nccl_emu.h"
#include "src/codec/codec.h"
#include "src/codec/numeric.h"
#include "src/coll/device/device_allreduce.h"
#include "src/transport/nccl/device_comm.h"
#include "tests/gpu/at_exit.h"
#include "tests/unit/compressed_reference.h"

namespace squall::coll::device {
namespace {

struct Case {
  int n;
  size_t count;
  codec::Spec spec;
  bool average;
  bool inPlace;
  DataType dtype = DataType::kF32;
  bool graph = false;                   // capture the first call, replay it for the others
  int badCall = -1;                     // this call's input on the last rank holds a NaN and an inf
  const codec::Spec* gather = nullptr;  // the second round's code (setGatherSpec)
};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// One rank's stream, device buffers and captured graph, released at scope
// exit. run() enqueues call `t` with `call(stream)`; with `graph`, the first
// call is captured instead and the graph replayed for every call.
struct RankDevice {
  RankDevice() { cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); }
  ~RankDevice() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (in != nullptr) cudaFree(in);
    if (out != nullptr) cudaFree(out);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;
  Status run(bool captured, int t, const std::function<Status(cudaStream_t)>& call) {
    if (!captured) return call(stream);
    if (t == 0) {
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      const Status s = call(stream);
      cudaStreamEndCapture(stream, &graph);
      if (s != Status::kOk) return s;
      cudaGraphInstantiate(&exec, graph, 0);
    }
    return cudaGraphLaunch(exec, stream) == cudaSuccess ? Status::kOk : Status::kInternal;
  }
  cudaStream_t stream = nullptr;
  void* in = nullptr;
  void* out = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

// The inputs of `calls` calls, inputs[call][rank], and the reference's
// outputs, expected[call].
void referenceCalls(const Case& c, int calls, std::vector<std::vector<std::vector<float>>>* in,
                    std::vector<std::vector<float>>* want) {
  std::mt19937 rng(1234 + c.n * 7 + static_cast<int>(c.count));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  testing::CompressedReference ref(c.n, c.count, c.spec);
  if (c.gather != nullptr) ref.setGatherSpec(*c.gather);
  const auto nn = static_cast<size_t>(c.n);
  auto& inputs = *in;
  auto& expected = *want;
  inputs.assign(calls, {});
  expected.assign(calls, {});
  for (int t = 0; t < calls; ++t) {
    inputs[t].assign(nn, std::vector<float>(c.count));
    for (auto& v : inputs[t])
      for (float& x : v) {
        x = dist(rng);
        // bf16 buffers carry values that bf16 represents exactly.
        if (c.dtype == DataType::kBf16) x = codec::bf16ToFloat(codec::floatToBf16(x));
      }
    if (t == c.badCall) {
      inputs[t][nn - 1][c.count / 3] = std::nanf("");
      inputs[t][nn - 1][c.count - 1] = INFINITY;
    }
    expected[t] = ref.twoPhase(inputs[t], c.average);
  }
}

size_t encodedBytes(const codec::Spec& spec, size_t count) {
  size_t bytes = 0;
  EXPECT_EQ(codec::encodedSize(spec, count, &bytes), Status::kOk);
  return bytes;
}

// What rank r sends per call with a second-round code: its workers' pieces
// of every other chunk, then its whole gather slot to every other rank.
uint64_t gatherBytes(const Case& c, int r) {
  const size_t unit = codec::usesBlocks(c.spec.codec) ? c.spec.block : 1;
  const size_t group = unit * static_cast<size_t>(c.n);
  const size_t chunk = (c.count + group - 1) / group * group / static_cast<size_t>(c.n);
  uint64_t sent = 0;
  for (int j = 0; j < c.n; ++j) {
    if (j == r) continue;
    const size_t begin = std::min(c.count, static_cast<size_t>(j) * chunk);
    const size_t m = std::min(chunk, c.count - begin);
    if (m != 0) sent += encodedBytes(c.spec, m);
    sent += encodedBytes(*c.gather, chunk);
  }
  return sent;
}

// Runs `calls` calls on n threads and compares every output with the reference.
void check(const Case& c, int calls) {
  const auto nn = static_cast<size_t>(c.n);
  std::vector<std::vector<std::vector<float>>> inputs;
  std::vector<std::vector<float>> expected;
  referenceCalls(c, calls, &inputs, &expected);

  std::vector<ncclComm_t> comms(nn);
  squall_emu::ncclCreateWorld(c.n, comms.data());
  std::vector<std::vector<std::vector<float>>> outputs(calls, std::vector<std::vector<float>>(nn));
  std::vector<std::string> errors(nn);
  const size_t esize = dataTypeSize(c.dtype);
  auto rank = [&](int r) {
    auto fail = [&](const char* what) { errors[r] = what; };
    RankDevice dev;
    cudaStream_t stream = dev.stream;
    void*& in = dev.in;
    void*& out = dev.out;
    transport::nccl::DeviceComm comm;
    if (transport::nccl::DeviceComm::wrap(comms[r], &comm) != Status::kOk) return fail("wrap");
    std::unique_ptr<DeviceCompressedState> state;
    if (DeviceCompressedState::create(c.n, r, c.count, c.spec, &state) != Status::kOk)
      return fail("create");
    if (c.gather != nullptr) {
      if (state->setGatherSpec(*c.gather) != Status::kOk) return fail("setGatherSpec");
      if (state->bytesSent() != gatherBytes(c, r)) return fail("bytes sent");
    }
    cudaMalloc(&in, c.count * esize + 8);
    cudaMalloc(&out, c.count * esize + 8);
    void* target = c.inPlace ? in : out;
    std::vector<uint8_t> staged(c.count * esize);
    for (int t = 0; t < calls; ++t) {
      const std::vector<float>& x = inputs[t][static_cast<size_t>(r)];
      if (c.dtype == DataType::kF32) {
        std::memcpy(staged.data(), x.data(), staged.size());
      } else {
        auto* h = reinterpret_cast<uint16_t*>(staged.data());
        for (size_t i = 0; i < c.count; ++i) h[i] = codec::floatToBf16(x[i]);
      }
      cudaMemcpy(in, staged.data(), staged.size(), cudaMemcpyHostToDevice);
      const ReduceOp op = c.average ? ReduceOp::kAvg : ReduceOp::kSum;
      if (dev.run(c.graph, t, [&](cudaStream_t on) {
            return compressedAllReduce(comm, on, in, target, c.dtype, op, state.get());
          }) != Status::kOk)
        return fail("allreduce");
      cudaStreamSynchronize(stream);
      cudaMemcpy(staged.data(), target, staged.size(), cudaMemcpyDeviceToHost);
      std::vector<float>& o = outputs[t][static_cast<size_t>(r)];
      o.resize(c.count);
      if (c.dtype == DataType::kF32) {
        std::memcpy(o.data(), staged.data(), staged.size());
      } else {
        auto* h = reinterpret_cast<uint16_t*>(staged.data());
        for (size_t i = 0; i < c.count; ++i) o[i] = codec::bf16ToFloat(h[i]);
      }
    }
    bool decodeError = false;
    if (state->takeDecodeError(stream, &decodeError) != Status::kOk || decodeError)
      return fail("device decode error flag");
    // The gather slots are sized: no other code once the state was used.
    if (c.n > 1 && c.count != 0 && state->setGatherSpec(c.spec) != Status::kInvalidUsage)
      fail("setGatherSpec after a call was not refused");
  };
  std::vector<std::thread> threads;
  threads.reserve(nn);
  for (int r = 0; r < c.n; ++r) threads.emplace_back(rank, r);
  for (auto& th : threads) th.join();
  squall_emu::ncclDestroyWorld(c.n, comms.data());

  for (size_t r = 0; r < nn; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int t = 0; t < calls; ++t) {
    // A non-finite call's output is NaN where it must be; what matters is
    // that it left every residual alone, which the calls after it show.
    if (t == c.badCall) continue;
    for (size_t r = 0; r < nn; ++r) {
      const std::vector<float>& o = outputs[t][r];
      ASSERT_EQ(o.size(), c.count);
      for (size_t i = 0; i < c.count; ++i) {
        float want = expected[t][i];
        if (c.dtype == DataType::kBf16) want = codec::bf16ToFloat(codec::floatToBf16(want));
        ASSERT_EQ(bits(o[i]), bits(want))
            << "call " << t << " rank " << r << " element " << i << ": " << o[i] << " vs " << want;
      }
    }
  }
}

// One state used from two streams, the way torch reduces on its NCCL stream
// or on the current one: calls alternate between streams A and B, and each
// call on B is enqueued while A still holds the call before it (A is held,
// as a slow kernel would keep it). The call on B must wait for it on the
// device: run first, it would use the residuals and scratch before the call
// on A has, and both outputs would differ from the reference.
void checkTwoStreams(const Case& c, int pairs) {
  const auto nn = static_cast<size_t>(c.n);
  const int calls = 2 * pairs;
  std::vector<std::vector<std::vector<float>>> inputs;
  std::vector<std::vector<float>> expected;
  referenceCalls(c, calls, &inputs, &expected);
  std::vector<ncclComm_t> comms(nn);
  squall_emu::ncclCreateWorld(c.n, comms.data());
  std::vector<std::vector<std::vector<float>>> outputs(calls, std::vector<std::vector<float>>(nn));
  std::vector<std::string> errors(nn);
  const size_t bytes = c.count * sizeof(float);
  auto rank = [&](int r) {
    auto fail = [&](const char* what) { errors[r] = what; };
    cudaStream_t streams[2] = {nullptr, nullptr};
    std::vector<void*> in(2, nullptr), out(2, nullptr);
    const testing::AtExit release{[&] {
      for (void* p : in) cudaFree(p);
      for (void* p : out) cudaFree(p);
      for (cudaStream_t s : streams) cudaStreamDestroy(s);
    }};
    for (int i = 0; i < 2; ++i) {
      cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
      cudaMalloc(&in[i], bytes);
      cudaMalloc(&out[i], bytes);
    }
    transport::nccl::DeviceComm comm;
    if (transport::nccl::DeviceComm::wrap(comms[r], &comm) != Status::kOk) return fail("wrap");
    std::unique_ptr<DeviceCompressedState> state;
    if (DeviceCompressedState::create(c.n, r, c.count, c.spec, &state) != Status::kOk)
      return fail("create");
    const ReduceOp op = c.average ? ReduceOp::kAvg : ReduceOp::kSum;
    for (int p = 0; p < pairs; ++p) {
      for (int i = 0; i < 2; ++i) {
        cudaMemcpy(in[i], inputs[2 * p + i][static_cast<size_t>(r)].data(), bytes,
                   cudaMemcpyHostToDevice);
      }
      squall_emu::holdStream(streams[0], true);
      if (compressedAllReduce(comm, streams[0], in[0], out[0], DataType::kF32, op, state.get()) !=
              Status::kOk ||
          compressedAllReduce(comm, streams[1], in[1], out[1], DataType::kF32, op, state.get()) !=
              Status::kOk) {
        squall_emu::holdStream(streams[0], false);
        return fail("allreduce");
      }
      squall_emu::holdStream(streams[0], false);  // runs A's call, then B's
      if (cudaStreamSynchronize(streams[0]) != cudaSuccess ||
          cudaStreamSynchronize(streams[1]) != cudaSuccess)
        return fail("a stream did not finish");
      for (int i = 0; i < 2; ++i) {
        std::vector<float>& o = outputs[2 * p + i][static_cast<size_t>(r)];
        o.resize(c.count);
        cudaMemcpy(o.data(), out[i], bytes, cudaMemcpyDeviceToHost);
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(nn);
  for (int r = 0; r < c.n; ++r) threads.emplace_back(rank, r);
  for (auto& th : threads) th.join();
  squall_emu::ncclDestroyWorld(c.n, comms.data());
  for (size_t r = 0; r < nn; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int t = 0; t < calls; ++t) {
    for (size_t r = 0; r < nn; ++r) {
      for (size_t i = 0; i < c.count; ++i) {
        ASSERT_EQ(bits(outputs[t][r][i]), bits(expected[t][i]))
            << "call " << t << " (stream " << (t % 2 == 0 ? "A" : "B") << ") rank " << r
            << " element " << i;
      }
    }
  }
}

const codec::Spec kOnebit64{codec::CodecId::kOnebit, codec::Scale::kMeanAbs, 64};
const codec::Spec kOnebitRms{codec::CodecId::kOnebit, codec::Scale::kRms, 128};
const codec::Spec kInt8{codec::CodecId::kInt8, codec::Scale::kMeanAbs, 64};
const codec::Spec kInt4{codec::CodecId::kInt4, codec::Scale::kMeanAbs, 64};
const codec::Spec kInt2{codec::CodecId::kInt2, codec::Scale::kMeanAbs, 128};
const codec::Spec kFp16{codec::CodecId::kFp16, codec::Scale::kMeanAbs, 0};

TEST(DeviceAllReduceEmu, TwoRanksOnebitSum) { check({2, 1000, kOnebit64, false, false}, 3); }
TEST(DeviceAllReduceEmu, FourRanksOnebitAvgInPlace) { check({4, 1000, kOnebit64, true, true}, 3); }
TEST(DeviceAllReduceEmu, FourRanksEmptyChunks) { check({4, 100, kOnebit64, true, false}, 2); }
TEST(DeviceAllReduceEmu, ThreeRanksRmsBlock128) { check({3, 777, kOnebitRms, false, false}, 2); }
TEST(DeviceAllReduceEmu, FourRanksInt8Avg) { check({4, 600, kInt8, true, false}, 2); }
TEST(DeviceAllReduceEmu, ThreeRanksInt4Sum) { check({3, 777, kInt4, false, false}, 2); }
TEST(DeviceAllReduceEmu, FourRanksInt2AvgInPlace) { check({4, 1001, kInt2, true, true}, 2); }
TEST(DeviceAllReduceEmu, TwoRanksFp16Sum) { check({2, 301, kFp16, false, true}, 2); }
TEST(DeviceAllReduceEmu, TwoRanksBf16Buffers) {
  check({2, 500, kOnebit64, true, false, DataType::kBf16}, 2);
}
TEST(DeviceAllReduceEmu, GraphCaptureAndReplay) {
  check({4, 1000, kOnebit64, true, false, DataType::kF32, true}, 3);
}
// A non-finite input on one rank: every rank keeps its residuals (the
// reference skips the whole call's commits on every rank), so the calls
// after it match the reference bit for bit.
TEST(DeviceAllReduceEmu, ANonFiniteCallLeavesEveryRanksResiduals) {
  Case onebit{3, 1000, kOnebit64, false, false};
  onebit.badCall = 1;
  check(onebit, 3);
  Case int8{4, 600, kInt8, true, false};
  int8.badCall = 1;
  check(int8, 3);
  Case int2{3, 1001, kInt2, false, false};
  int2.badCall = 1;
  check(int2, 3);
  // onebit's verdict comes from the decode's scales, also on the fp32 scratch
  // of a bf16 output.
  Case bf16{2, 500, kOnebit64, true, false, DataType::kBf16};
  bf16.badCall = 1;
  check(bf16, 3);
}
// A second round with a code of its own (int8 behind int4, the interposer's
// default at every size on the device): the servers decode and sum the
// worker pieces, divide, and re-encode with the wider code, whose blocks
// differ from the workers'; fp32 and bf16 buffers, a captured graph, a
// non-finite call (int8's output check), and onebit behind int8 (onebit's
// decode verdict on the gathered chunks).
const codec::Spec kInt8Wide{codec::CodecId::kInt8, codec::Scale::kMeanAbs, 512};
TEST(DeviceAllReduceEmu, AGatherCodeReencodesTheReducedChunks) {
  Case wide{4, 3001, kInt4, true, false};
  wide.gather = &kInt8Wide;
  check(wide, 3);
  Case sum{3, 777, kInt4, false, true, DataType::kBf16};
  sum.gather = &kInt8Wide;
  check(sum, 2);
  Case graph{4, 1000, kInt4, true, false, DataType::kF32, true};
  graph.gather = &kInt8Wide;
  check(graph, 3);
  Case bad{4, 3001, kInt4, true, false};
  bad.gather = &kInt8Wide;
  bad.badCall = 1;
  check(bad, 3);
  Case onebitGather{3, 1000, kInt8, false, false};
  onebitGather.gather = &kOnebit64;
  onebitGather.badCall = 1;
  check(onebitGather, 3);
  Case onebitWorkers{4, 1000, kOnebit64, true, false};  // not the fused server kernel
  onebitWorkers.gather = &kInt8Wide;
  check(onebitWorkers, 2);
}
TEST(DeviceAllReduceEmu, TheGatherCodeIsChosenBeforeTheFirstCall) {
  std::unique_ptr<DeviceCompressedState> state;
  ASSERT_EQ(DeviceCompressedState::create(2, 0, 100, kInt4, &state), Status::kOk);
  EXPECT_EQ(state->setGatherSpec({codec::CodecId::kNone, codec::Scale::kMeanAbs, 0}),
            Status::kInvalidArgument);
  EXPECT_EQ(state->gatherSpec().codec, codec::CodecId::kInt4);
  ASSERT_EQ(state->setGatherSpec(kInt8Wide), Status::kOk);
  EXPECT_EQ(state->gatherSpec().codec, codec::CodecId::kInt8);
}
TEST(DeviceAllReduceEmu, OneRankIsIdentity) { check({1, 100, kOnebit64, false, false}, 1); }
TEST(DeviceAllReduceEmu, TwoStreamsAreOrderedOnTheDevice) {
  checkTwoStreams({2, 1000, kOnebit64, false, false}, 2);
  checkTwoStreams({3, 777, kOnebit64, true, false}, 1);
}

// The compressed reduce-scatter: every rank's piece r of n x R elements, call
// after call, against testing::ReduceScatterReference bit for bit (so the
// residuals evolve alike); in place means the output is rank r's piece of
// the input. c.count is R. A graph captures the first call and replays it.
void checkReduceScatter(const Case& c, int calls) {
  const auto nn = static_cast<size_t>(c.n);
  const size_t total = nn * c.count;
  std::mt19937 rng(99 + c.n * 5 + static_cast<int>(c.count));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  testing::ReduceScatterReference ref(c.n, c.count, c.spec);
  std::vector<std::vector<std::vector<float>>> inputs(calls), expected(calls);
  std::vector<bool> committed(calls);
  for (int t = 0; t < calls; ++t) {
    inputs[t].assign(nn, std::vector<float>(total));
    for (auto& v : inputs[t])
      for (float& x : v) {
        x = dist(rng);
        if (c.dtype == DataType::kBf16) x = codec::bf16ToFloat(codec::floatToBf16(x));
        if (c.dtype == DataType::kF16) x = codec::halfToFloat(codec::floatToHalf(x));
      }
    if (t == c.badCall) inputs[t][nn - 1][total / 3] = std::nanf("");  // reaches one rank only
    expected[t] = ref.run(inputs[t], c.average);
    committed[t] = ref.committed;
  }
  std::vector<ncclComm_t> comms(nn);
  squall_emu::ncclCreateWorld(c.n, comms.data());
  std::vector<std::vector<std::vector<float>>> outputs(calls, std::vector<std::vector<float>>(nn));
  std::vector<unsigned long long> skipped(nn);
  std::vector<std::string> errors(nn);
  const size_t esize = dataTypeSize(c.dtype);
  auto rank = [&](int r) {
    auto fail = [&](const char* what) { errors[r] = what; };
    RankDevice dev;
    cudaStream_t stream = dev.stream;
    void*& in = dev.in;
    void*& out = dev.out;
    transport::nccl::DeviceComm comm;
    if (transport::nccl::DeviceComm::wrap(comms[r], &comm) != Status::kOk) return fail("wrap");
    std::unique_ptr<DeviceCompressedState> state;
    if (DeviceCompressedState::createReduceScatter(c.n, r, c.count, c.spec, &state) != Status::kOk)
      return fail("create");
    if (c.n > 1 && c.count != 0) {
      if (state->bytesSent() != (nn - 1) * (encodedBytes(c.spec, c.count) + sizeof(int)))
        return fail("bytes sent");
      if (state->setGatherSpec(kInt8Wide) != Status::kInvalidUsage)
        return fail("a gather code was taken");
      if (compressedAllReduce(comm, stream, in, in, DataType::kF32, ReduceOp::kSum, state.get()) !=
          Status::kInvalidUsage)
        return fail("the allreduce ran on a reduce-scatter state");
    }
    cudaMalloc(&in, total * esize + 8);
    cudaMalloc(&out, c.count * esize + 8);
    void* target =
        c.inPlace ? static_cast<uint8_t*>(in) + static_cast<size_t>(r) * c.count * esize : out;
    const ReduceOp op = c.average ? ReduceOp::kAvg : ReduceOp::kSum;
    std::vector<uint8_t> staged(total * esize);
    for (int t = 0; t < calls; ++t) {
      const std::vector<float>& x = inputs[t][static_cast<size_t>(r)];
      if (c.dtype == DataType::kF32) {
        if (!staged.empty()) std::memcpy(staged.data(), x.data(), staged.size());
      } else {
        auto* h = reinterpret_cast<uint16_t*>(staged.data());
        for (size_t i = 0; i < total; ++i)
          h[i] = c.dtype == DataType::kBf16 ? codec::floatToBf16(x[i]) : codec::floatToHalf(x[i]);
      }
      cudaMemcpy(in, staged.data(), staged.size(), cudaMemcpyHostToDevice);
      if (dev.run(c.graph, t, [&](cudaStream_t on) {
            return compressedReduceScatter(comm, on, in, target, c.dtype, op, state.get());
          }) != Status::kOk)
        return fail("reduce-scatter");
      cudaStreamSynchronize(stream);
      cudaMemcpy(staged.data(), target, c.count * esize, cudaMemcpyDeviceToHost);
      std::vector<float>& o = outputs[t][static_cast<size_t>(r)];
      o.resize(c.count);
      if (c.dtype == DataType::kF32) {
        if (c.count != 0) std::memcpy(o.data(), staged.data(), c.count * esize);
      } else {
        auto* h = reinterpret_cast<uint16_t*>(staged.data());
        for (size_t i = 0; i < c.count; ++i)
          o[i] = c.dtype == DataType::kBf16 ? codec::bf16ToFloat(h[i]) : codec::halfToFloat(h[i]);
      }
    }
    bool decodeError = false;
    if (state->takeDecodeError(stream, &decodeError) != Status::kOk || decodeError)
      return fail("device decode error flag");
    if (state->worker() != nullptr) {
      int current = 0;
      if (codec::cudaResidualQuery(*state->worker(), stream, &current, &skipped[r]) != Status::kOk)
        return fail("residual query");
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(nn);
  for (int r = 0; r < c.n; ++r) threads.emplace_back(rank, r);
  for (auto& th : threads) th.join();
  squall_emu::ncclDestroyWorld(c.n, comms.data());
  for (size_t r = 0; r < nn; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  const auto skips =
      static_cast<unsigned long long>(std::count(committed.begin(), committed.end(), false));
  if (c.n > 1 && c.count != 0) {
    for (size_t r = 0; r < nn; ++r) EXPECT_EQ(skipped[r], skips) << "rank " << r;
  }
  for (int t = 0; t < calls; ++t) {
    if (t == c.badCall) continue;  // NaN on the rank it reaches; the calls after show the rest
    for (size_t r = 0; r < nn; ++r) {
      for (size_t i = 0; i < c.count; ++i) {
        float want = expected[t][r][i];
        if (c.dtype == DataType::kBf16) want = codec::bf16ToFloat(codec::floatToBf16(want));
        if (c.dtype == DataType::kF16) want = codec::halfToFloat(codec::floatToHalf(want));
        ASSERT_EQ(bits(outputs[t][r][i]), bits(want))
            << "call " << t << " rank " << r << " element " << i << ": " << outputs[t][r][i]
            << " vs " << want;
      }
    }
  }
}

TEST(DeviceReduceScatterEmu, TwoRanksOnebitSum) {
  checkReduceScatter({2, 1000, kOnebit64, false, false}, 3);
}
TEST(DeviceReduceScatterEmu, FourRanksInt4AvgInPlace) {
  checkReduceScatter({4, 777, kInt4, true, true}, 3);
}
TEST(DeviceReduceScatterEmu, ThreeRanksEveryCodec) {
  checkReduceScatter({3, 301, kOnebitRms, true, false}, 2);
  checkReduceScatter({3, 301, kInt8, false, false}, 2);
  checkReduceScatter({3, 1001, kInt2, true, true}, 2);
  checkReduceScatter({3, 301, kFp16, true, false}, 2);
}
TEST(DeviceReduceScatterEmu, HalfBuffers) {
  checkReduceScatter({2, 500, kInt4, true, false, DataType::kBf16}, 2);
  checkReduceScatter({4, 129, kOnebit64, false, true, DataType::kF16}, 2);
}
TEST(DeviceReduceScatterEmu, GraphCaptureAndReplay) {
  checkReduceScatter({4, 1000, kInt4, true, false, DataType::kF32, true}, 3);
}
// A NaN in one piece of one rank's input reaches only the rank that piece
// goes to; every rank must still keep its residual (the shared verdict).
TEST(DeviceReduceScatterEmu, ANonFiniteCallLeavesEveryRanksResidual) {
  Case onebit{3, 1000, kOnebit64, true, false};
  onebit.badCall = 1;
  checkReduceScatter(onebit, 3);
  Case int4{4, 600, kInt4, false, true};
  int4.badCall = 0;
  checkReduceScatter(int4, 3);
}
TEST(DeviceReduceScatterEmu, OneRankAndEmptyPiecesCopy) {
  checkReduceScatter({1, 100, kInt4, true, false}, 1);
  checkReduceScatter({3, 0, kInt4, true, false}, 1);
}

// The quantized all-gather: every rank's output is the host codec's decode
// of every rank's encoding (codec::encode without a residual), bit for bit;
// in place means the input is this rank's piece of the output. c.count is
// each rank's input.
void checkAllGather(const Case& c, int calls) {
  const auto nn = static_cast<size_t>(c.n);
  const size_t total = nn * c.count;
  const size_t esize = dataTypeSize(c.dtype);
  auto roundTrip = [&](float x) {
    return c.dtype == DataType::kBf16  ? codec::bf16ToFloat(codec::floatToBf16(x))
           : c.dtype == DataType::kF16 ? codec::halfToFloat(codec::floatToHalf(x))
                                       : x;
  };
  std::mt19937 rng(7 + c.n + static_cast<int>(c.count));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<std::vector<std::vector<float>>> inputs(calls);
  std::vector<std::vector<float>> expected(calls, std::vector<float>(total));
  const size_t slot = encodedBytes(c.spec, c.count);
  for (int t = 0; t < calls; ++t) {
    inputs[t].assign(nn, std::vector<float>(c.count));
    for (size_t r = 0; r < nn; ++r) {
      for (float& x : inputs[t][r]) x = roundTrip(dist(rng));
      if (c.count == 0) continue;
      std::vector<uint8_t> encoded(slot);
      codec::EncodeResult result;
      ASSERT_EQ(codec::encode(c.spec, inputs[t][r].data(), codec::DType::kF32, c.count, nullptr,
                              encoded.data(), slot, &result),
                Status::kOk);
      ASSERT_EQ(
          codec::decode(encoded.data(), result.bytes, expected[t].data() + r * c.count, c.count),
          Status::kOk);
    }
    for (float& x : expected[t]) x = roundTrip(x);
  }
  if (c.n == 1) expected.assign(calls, {}), expected[0] = inputs[0][0];
  std::vector<ncclComm_t> comms(nn);
  squall_emu::ncclCreateWorld(c.n, comms.data());
  std::vector<std::vector<std::vector<float>>> outputs(calls, std::vector<std::vector<float>>(nn));
  std::vector<std::string> errors(nn);
  auto rank = [&](int r) {
    auto fail = [&](const char* what) { errors[r] = what; };
    RankDevice dev;
    cudaStream_t stream = dev.stream;
    void*& in = dev.in;
    void*& out = dev.out;
    transport::nccl::DeviceComm comm;
    if (transport::nccl::DeviceComm::wrap(comms[r], &comm) != Status::kOk) return fail("wrap");
    std::unique_ptr<DeviceCompressedState> state;
    if (DeviceCompressedState::createAllGather(c.n, r, c.count, c.spec, &state) != Status::kOk)
      return fail("create");
    if (c.n > 1 && c.count != 0) {
      if (state->bytesSent() != (nn - 1) * slot) return fail("bytes sent");
      if (state->setGatherSpec(kInt8Wide) != Status::kInvalidUsage)
        return fail("a gather code was taken");
      if (compressedReduceScatter(comm, stream, in, in, DataType::kF32, ReduceOp::kSum,
                                  state.get()) != Status::kInvalidUsage)
        return fail("the reduce-scatter ran on an all-gather state");
    }
    cudaMalloc(&in, c.count * esize + 8);
    cudaMalloc(&out, total * esize + 8);
    const void* source =
        c.inPlace ? static_cast<uint8_t*>(out) + static_cast<size_t>(r) * c.count * esize : in;
    std::vector<uint8_t> staged(total * esize);
    auto store = [&](const std::vector<float>& x, uint8_t* to) {
      for (size_t i = 0; i < x.size(); ++i) {
        if (c.dtype == DataType::kF32) {
          std::memcpy(to + i * 4, &x[i], 4);
        } else {
          const uint16_t h =
              c.dtype == DataType::kBf16 ? codec::floatToBf16(x[i]) : codec::floatToHalf(x[i]);
          std::memcpy(to + i * 2, &h, 2);
        }
      }
    };
    for (int t = 0; t < calls; ++t) {
      std::vector<uint8_t> mine(c.count * esize);
      store(inputs[t][static_cast<size_t>(r)], mine.data());
      cudaMemcpy(const_cast<void*>(source), mine.data(), mine.size(), cudaMemcpyHostToDevice);
      if (dev.run(c.graph, t, [&](cudaStream_t on) {
            return compressedAllGather(comm, on, source, out, c.dtype, state.get());
          }) != Status::kOk)
        return fail("all-gather");
      cudaStreamSynchronize(stream);
      const size_t got = c.n == 1 ? c.count : total;
      cudaMemcpy(staged.data(), out, got * esize, cudaMemcpyDeviceToHost);
      std::vector<float>& o = outputs[t][static_cast<size_t>(r)];
      o.resize(got);
      for (size_t i = 0; i < got; ++i) {
        if (c.dtype == DataType::kF32) {
          std::memcpy(&o[i], staged.data() + i * 4, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, staged.data() + i * 2, 2);
          o[i] = c.dtype == DataType::kBf16 ? codec::bf16ToFloat(h) : codec::halfToFloat(h);
        }
      }
    }
    bool decodeError = false;
    if (state->takeDecodeError(stream, &decodeError) != Status::kOk || decodeError)
      return fail("device decode error flag");
  };
  std::vector<std::thread> threads;
  threads.reserve(nn);
  for (int r = 0; r < c.n; ++r) threads.emplace_back(rank, r);
  for (auto& th : threads) th.join();
  squall_emu::ncclDestroyWorld(c.n, comms.data());
  for (size_t r = 0; r < nn; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int t = 0; t < (c.n == 1 ? 1 : calls); ++t) {
    for (size_t r = 0; r < nn; ++r) {
      ASSERT_EQ(outputs[t][r].size(), expected[t].size());
      for (size_t i = 0; i < expected[t].size(); ++i) {
        ASSERT_EQ(bits(outputs[t][r][i]), bits(expected[t][i]))
            << "call " << t << " rank " << r << " element " << i;
      }
    }
  }
}

TEST(DeviceAllGatherEmu, EveryRankDecodesEveryEncoding) {
  checkAllGather({2, 1000, kOnebit64, false, false}, 2);
  checkAllGather({3, 777, kInt4, false, true}, 2);
  checkAllGather({4, 301, kInt8, false, false, DataType::kBf16}, 2);
  checkAllGather({2, 129, kInt2, false, true, DataType::kF16}, 1);
}
TEST(DeviceAllGatherEmu, GraphCaptureAndReplay) {
  checkAllGather({4, 1000, kInt4, false, false, DataType::kF32, true}, 3);
}
TEST(DeviceAllGatherEmu, OneRankAndEmptyInputsCopy) {
  checkAllGather({1, 100, kInt4, false, false}, 1);
  checkAllGather({3, 0, kInt4, false, false}, 1);
}

}  // namespace
}  // namespace squall::coll::device
