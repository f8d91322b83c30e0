// Regression tests for misuse and failures that used to crash, hang, succeed
// silently or report the wrong cause: counts whose byte size overflows,
// partly overlapping buffers, ranks that disagree on a broadcast's root, a
// non-finite input that changed later results, abort notices whose own
// failure hid the real error, and compressed collectives that fail late.
// Ranks are threads over the local transport.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/coll/communicator.h"
#include "src/coll/context.h"
#include "src/transport/local/local_transport.h"
#include "tests/unit/coll_harness.h"

namespace squall {
namespace {

using coll::Communicator;
using coll::CompressedAlgo;
using coll::CompressedState;
using testing::Group;

constexpr auto kFast = std::chrono::seconds(10);  // well below the harness timeout (30 s)

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// ---- Counts whose byte size does not fit --------------------------------------

TEST(Reliability, CountsWhoseBytesOverflowAreRefusedByEveryCollective) {
  for (int n : {2, 4}) {
    Group group(n);
    group.run([&](Communicator& comm, int r) {
      std::vector<float> small(16, 1.0f), out(16 * static_cast<size_t>(n), 0.0f);
      const std::vector<float> untouched = out;
      const size_t huge = (size_t{1} << 62) + 1;  // x 4 bytes wraps to 4
      EXPECT_EQ(comm.allReduce(small.data(), out.data(), huge, DataType::kF32, ReduceOp::kSum),
                Status::kInvalidArgument);
      EXPECT_TRUE(contains(lastError(), "allreduce: count")) << lastError();
      EXPECT_EQ(comm.allGather(small.data(), out.data(), huge, DataType::kF32),
                Status::kInvalidArgument);
      EXPECT_TRUE(contains(lastError(), "allgather: count")) << lastError();
      // count x size fits, n x count x size does not.
      const size_t perRank = SIZE_MAX / 4 / 2 + 1;
      EXPECT_EQ(comm.allGather(small.data(), out.data(), perRank / 2 + 1, DataType::kF32),
                Status::kInvalidArgument);
      EXPECT_TRUE(contains(lastError(), "nranks x count")) << lastError();
      EXPECT_EQ(comm.allToAll(small.data(), out.data(), huge, DataType::kF32),
                Status::kInvalidArgument);
      EXPECT_TRUE(contains(lastError(), "alltoall: count")) << lastError();
      EXPECT_EQ(comm.broadcast(small.data(), huge, DataType::kF32, 0), Status::kInvalidArgument);
      EXPECT_TRUE(contains(lastError(), "broadcast: count")) << lastError();
      coll::OperationPtr op;
      EXPECT_EQ(
          comm.startAllReduce(small.data(), out.data(), huge, DataType::kF64, ReduceOp::kSum, &op),
          Status::kInvalidArgument);
      EXPECT_EQ(out, untouched) << "rank " << r << ": a refused call wrote its output";
      // The refusals kept the ranks in step: a correct call still works.
      std::vector<float> x(16, static_cast<float>(r + 1));
      ASSERT_EQ(comm.allReduce(x.data(), x.data(), 16, DataType::kF32, ReduceOp::kSum),
                Status::kOk);
      EXPECT_EQ(x[0], static_cast<float>(n * (n + 1)) / 2);
    });
  }
}

// ---- Overlapping buffers ----------------------------------------------------

TEST(Reliability, PartlyOverlappingBuffersAreRefusedAndInPlaceStillWorks) {
  Group group(2);
  group.run([&](Communicator& comm, int r) {
    std::vector<float> buffer(64, static_cast<float>(r + 1));
    EXPECT_EQ(comm.allReduce(buffer.data(), buffer.data() + 1, 32, DataType::kF32, ReduceOp::kSum),
              Status::kInvalidArgument);
    EXPECT_TRUE(contains(lastError(), "overlap")) << lastError();
    EXPECT_EQ(comm.allReduce(buffer.data() + 8, buffer.data(), 32, DataType::kF32, ReduceOp::kSum),
              Status::kInvalidArgument);
    // All-gather: the input lies inside the output of n x count elements.
    EXPECT_EQ(comm.allGather(buffer.data() + 16, buffer.data(), 16, DataType::kF32),
              Status::kInvalidArgument);
    EXPECT_EQ(comm.allToAll(buffer.data() + 4, buffer.data(), 16, DataType::kF32),
              Status::kInvalidArgument);
    // Adjacent, disjoint buffers and exact in place are fine.
    ASSERT_EQ(comm.allReduce(buffer.data(), buffer.data() + 32, 32, DataType::kF32, ReduceOp::kSum),
              Status::kOk);
    EXPECT_EQ(buffer[32], 3.0f);
    ASSERT_EQ(comm.allReduce(buffer.data(), buffer.data(), 32, DataType::kF32, ReduceOp::kSum),
              Status::kOk);
    EXPECT_EQ(buffer[0], 3.0f);
  });
}

// ---- Broadcast root agreement ---------------------------------------------------

TEST(Reliability, RanksThatDisagreeOnTheBroadcastRootFailFast) {
  // {roots by rank}: everyone a root of its own; everyone waiting for the
  // other; and a three-rank split.
  const std::vector<std::vector<int>> cases = {{0, 1}, {1, 0}, {0, 0, 1}, {2, 2, 0}};
  for (const std::vector<int>& roots : cases) {
    const int n = static_cast<int>(roots.size());
    Group group(n);
    const auto start = std::chrono::steady_clock::now();
    std::vector<Status> status(static_cast<size_t>(n));
    group.run([&](Communicator& comm, int r) {
      std::vector<int32_t> data(100, r == roots[r] ? 42 : -1);
      status[r] = comm.broadcast(data.data(), data.size(), DataType::kI32, roots[r]);
      // A rank may finish before it hears of the disagreement, but only with
      // the data of the root it named.
      if (status[r] == Status::kOk) {
        EXPECT_EQ(data[99], 42) << "rank " << r;
      }
      // The same group still broadcasts correctly afterwards.
      std::vector<int32_t> again(10, r == 0 ? 7 : 0);
      ASSERT_EQ(comm.broadcast(again.data(), again.size(), DataType::kI32, 0), Status::kOk);
      EXPECT_EQ(again[9], 7);
    });
    EXPECT_LT(std::chrono::steady_clock::now() - start, kFast) << "detected only at the timeout";
    int failed = 0;
    for (Status s : status) failed += s != Status::kOk ? 1 : 0;
    EXPECT_GE(failed, 1) << "every rank succeeded although they named different roots";
    if (n == 2) {
      EXPECT_EQ(failed, 2);
    }
  }
}

TEST(Reliability, BroadcastStillReachesEveryRank) {
  for (int n : {1, 2, 3, 5, 8}) {
    for (int root = 0; root < n; root += 2) {
      Group group(n);
      group.run([&](Communicator& comm, int r) {
        std::vector<int64_t> data(33, r == root ? 1000 + root : 0);
        ASSERT_EQ(comm.broadcast(data.data(), data.size(), DataType::kI64, root), Status::kOk);
        EXPECT_EQ(data[32], 1000 + root) << "n " << n << " root " << root << " rank " << r;
      });
    }
  }
}

// ---- A non-finite call leaves no trace --------------------------------------------

std::vector<std::vector<float>> inputsOf(int n, size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> inputs(static_cast<size_t>(n), std::vector<float>(count));
  for (auto& v : inputs)
    for (float& x : v) x = normal(rng);
  return inputs;
}

// Runs the compressed allreduce over `calls` (one input set per call) and
// returns rank 0's output of the last call.
std::vector<float> lastOutput(int n, size_t count, const codec::Spec& spec, CompressedAlgo algo,
                              const std::vector<std::vector<std::vector<float>>>& calls) {
  coll::Options options = testing::testOptions();
  options.compressedAlgo = algo;
  options.segmentBytes = 512;
  Group group(n, options);
  std::vector<std::unique_ptr<CompressedState>> states(static_cast<size_t>(n));
  for (auto& s : states) EXPECT_EQ(CompressedState::create(n, count, spec, &s), Status::kOk);
  std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(count));
  for (const auto& inputs : calls) {
    group.run([&](Communicator& comm, int r) {
      EXPECT_EQ(comm.compressedAllReduce(inputs[r].data(), out[r].data(), DataType::kF32,
                                         ReduceOp::kAvg, states[r].get()),
                Status::kOk);
    });
  }
  for (int r = 1; r < n; ++r) EXPECT_EQ(std::memcmp(out[0].data(), out[r].data(), count * 4), 0);
  return out[0];
}

TEST(Reliability, ANonFiniteCallDoesNotChangeTheNextCall) {
  constexpr size_t kCount = 3 * 512 + 77;
  for (codec::CodecId id : {codec::CodecId::kOnebit, codec::CodecId::kInt8, codec::CodecId::kInt4,
                            codec::CodecId::kInt2}) {
    codec::Spec spec;
    spec.codec = id;
    spec.block = 64;
    for (CompressedAlgo algo : {CompressedAlgo::kTwoPhase, CompressedAlgo::kAllGather}) {
      for (int n : {2, 3}) {
        const auto first = inputsOf(n, kCount, 1);
        auto bad = inputsOf(n, kCount, 2);
        bad[static_cast<size_t>(n - 1)][100] = std::nanf("");
        bad[static_cast<size_t>(n - 1)][kCount - 1] = INFINITY;
        const auto next = inputsOf(n, kCount, 3);
        const std::vector<float> with = lastOutput(n, kCount, spec, algo, {first, bad, next});
        const std::vector<float> without = lastOutput(n, kCount, spec, algo, {first, next});
        size_t differing = 0;
        for (size_t i = 0; i < kCount; ++i)
          differing +=
              std::bit_cast<uint32_t>(with[i]) != std::bit_cast<uint32_t>(without[i]) ? 1 : 0;
        EXPECT_EQ(differing, 0u) << codec::codecName(id) << " "
                                 << (algo == CompressedAlgo::kTwoPhase ? "twophase" : "allgather")
                                 << " n=" << n << ": the call after the non-finite one differs";
      }
    }
  }
}

// ---- The first cause wins -------------------------------------------------------

// A transport that hands every call to another; the wrappers below change
// only what they send.
class ForwardingTransport : public transport::Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status send(int peer, const transport::Tag& tag, const void* data, size_t bytes,
              transport::RequestPtr* request) override {
    return inner_->send(peer, tag, data, bytes, request);
  }
  Status recv(int peer, const transport::Tag& tag, void* data, size_t bytes,
              transport::RequestPtr* request) override {
    return inner_->recv(peer, tag, data, bytes, request);
  }
  Status progress() override { return inner_->progress(); }
  Status waitForActivity(transport::Deadline until) override {
    return inner_->waitForActivity(until);
  }

 private:
  std::unique_ptr<transport::Transport> inner_;
};

// The local transport, except that abort notices cannot be sent (as to a
// peer that is gone).
class NoticeLosingTransport final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  const char* name() const override { return "notice-losing"; }
  Status send(int peer, const transport::Tag& tag, const void* data, size_t bytes,
              transport::RequestPtr* request) override {
    if (tag.step == coll::kAbortStep) {
      return SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "cannot send the abort notice to rank %d (test)", peer);
    }
    return ForwardingTransport::send(peer, tag, data, bytes, request);
  }
};

TEST(Reliability, AFailedAbortNoticeDoesNotHideTheRealError) {
  std::vector<std::unique_ptr<transport::Transport>> local;
  ASSERT_EQ(transport::createLocalTransports(2, &local), Status::kOk);
  std::vector<std::unique_ptr<transport::Transport>> wrapped;
  wrapped.reserve(local.size());
  for (auto& t : local) wrapped.push_back(std::make_unique<NoticeLosingTransport>(std::move(t)));
  coll::Options options = testing::testOptions();
  options.timeout = std::chrono::seconds(3);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(wrapped.size());
  for (auto& t : wrapped) comms.push_back(std::make_unique<Communicator>(t.get(), options));
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      // Different counts: the receive that sees the other rank's message fails.
      std::vector<float> x(64, 1.0f);
      const size_t count = r == 0 ? 16 : 32;
      EXPECT_NE(comms[r]->allReduce(x.data(), x.data(), count, DataType::kF32, ReduceOp::kSum),
                Status::kOk);
      errors[r] = lastError();
    });
  }
  for (auto& t : threads) t.join();
  comms.clear();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(contains(errors[r], "abort notice")) << "rank " << r << ": " << errors[r];
    // The real cause: the mismatch, with both ranks' calls described.
    EXPECT_TRUE(contains(errors[r], "16 elements") && contains(errors[r], "32 elements"))
        << "rank " << r << ": " << errors[r];
  }
}

// ---- Outputs are written only on success ------------------------------------

constexpr float kUntouched = -12345.0f;

bool allUntouched(const std::vector<float>& v) {
  for (float x : v)
    if (std::bit_cast<uint32_t>(x) != std::bit_cast<uint32_t>(kUntouched)) return false;
  return true;
}

// Ranks that disagree on an all-gather's or all-to-all's count must all fail,
// and before any of them writes its output (the output of a ring that ran
// partly would hold the blocks of the ranks that agreed).
TEST(Reliability, MismatchedGatherCountsFailBeforeAnyOutputIsWritten) {
  // {count by rank}: one rank off, at several places of the ring; small
  // outputs (staged), large ones (agreement first) and the two mixed.
  const std::vector<std::vector<size_t>> cases = {{64, 32},
                                                  {64, 64, 32},
                                                  {32, 64, 64},
                                                  {64, 64, 64, 32},
                                                  {64, 32, 64, 64, 64},
                                                  {8192, 8192, 6000},
                                                  {8192, 6000, 8192, 8192},
                                                  {8192, 8192, 4096},
                                                  {4096, 4096, 4096, 8192}};
  for (const std::vector<size_t>& counts : cases) {
    const int n = static_cast<int>(counts.size());
    for (bool allToAll : {false, true}) {
      Group group(n);
      const auto start = std::chrono::steady_clock::now();
      group.run([&](Communicator& comm, int r) {
        const size_t count = counts[static_cast<size_t>(r)];
        std::vector<float> in(count * static_cast<size_t>(n), static_cast<float>(r));
        std::vector<float> out(count * static_cast<size_t>(n), kUntouched);
        const Status status = allToAll
                                  ? comm.allToAll(in.data(), out.data(), count, DataType::kF32)
                                  : comm.allGather(in.data(), out.data(), count, DataType::kF32);
        EXPECT_NE(status, Status::kOk) << "rank " << r;
        EXPECT_TRUE(allUntouched(out)) << (allToAll ? "alltoall" : "allgather") << " n=" << n
                                       << " rank " << r << " wrote its output before failing";
        // The group goes on in step.
        std::vector<float> one(1, static_cast<float>(r)), all(static_cast<size_t>(n), 0.0f);
        ASSERT_EQ(comm.allGather(one.data(), all.data(), 1, DataType::kF32), Status::kOk)
            << lastError();
        EXPECT_EQ(all[static_cast<size_t>(n - 1)], static_cast<float>(n - 1));
      });
      EXPECT_LT(std::chrono::steady_clock::now() - start, kFast) << "detected only at the timeout";
    }
  }
}

// The local transport, except that one rank's send number `failAt` (counted
// over the transport's life, abort notices excluded) fails, as to a peer that
// has just died.
class SendFailingTransport final : public ForwardingTransport {
 public:
  SendFailingTransport(std::unique_ptr<transport::Transport> inner, int64_t failAt)
      : ForwardingTransport(std::move(inner)), failAt_(failAt) {}
  const char* name() const override { return "send-failing"; }
  Status send(int peer, const transport::Tag& tag, const void* data, size_t bytes,
              transport::RequestPtr* request) override {
    if (tag.step != coll::kAbortStep && sends_++ == failAt_) {
      return SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "cannot send to rank %d: it died (test)", peer);
    }
    return ForwardingTransport::send(peer, tag, data, bytes, request);
  }
  int64_t sends() const { return sends_; }

 private:
  int64_t failAt_;
  int64_t sends_ = 0;
};

// Runs one compressed allreduce of `count` elements on n ranks whose rank
// `victim` fails its send number `failAt` (-1: none); returns each rank's
// status and output, and the victim's number of sends.
struct CompressedRun {
  std::vector<Status> status;
  std::vector<std::vector<float>> out;
  int64_t victimSends = 0;
};

CompressedRun runCompressed(int n, size_t count, CompressedAlgo algo, int victim, int64_t failAt) {
  std::vector<std::unique_ptr<transport::Transport>> local;
  EXPECT_EQ(transport::createLocalTransports(n, &local), Status::kOk);
  std::vector<std::unique_ptr<SendFailingTransport>> wrapped;
  wrapped.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    wrapped.push_back(std::make_unique<SendFailingTransport>(
        std::move(local[static_cast<size_t>(r)]), r == victim ? failAt : -1));
  coll::Options options = testing::testOptions();
  options.timeout = std::chrono::seconds(5);
  options.compressedAlgo = algo;
  options.segmentBytes = 512;  // 128 elements a segment: many segments
  codec::Spec spec;
  spec.codec = codec::CodecId::kOnebit;
  spec.block = 64;
  CompressedRun run;
  run.status.resize(static_cast<size_t>(n));
  run.out.assign(static_cast<size_t>(n), std::vector<float>(count, kUntouched));
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<CompressedState>> states(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    comms.push_back(std::make_unique<Communicator>(wrapped[static_cast<size_t>(r)].get(), options));
    EXPECT_EQ(CompressedState::create(n, count, spec, &states[static_cast<size_t>(r)]),
              Status::kOk);
  }
  const auto inputs = inputsOf(n, count, 7);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const auto u = static_cast<size_t>(r);
      run.status[u] = comms[u]->compressedAllReduce(
          inputs[u].data(), run.out[u].data(), DataType::kF32, ReduceOp::kAvg, states[u].get());
    });
  }
  for (auto& t : threads) t.join();
  comms.clear();
  run.victimSends = wrapped[static_cast<size_t>(victim)]->sends();
  return run;
}

// A compressed allreduce that fails late (one rank's last sends fail, as when
// it dies near the end) leaves every rank's output as it was: outputs used to
// hold the segments decoded before the failure.
TEST(Reliability, ACompressedAllReduceThatFailsLateWritesNoOutput) {
  constexpr size_t kCount = 4096 + 77;
  for (CompressedAlgo algo : {CompressedAlgo::kTwoPhase, CompressedAlgo::kAllGather}) {
    for (int n : {2, 3}) {
      const int victim = n - 1;
      const CompressedRun clean = runCompressed(n, kCount, algo, victim, -1);
      for (Status st : clean.status) ASSERT_EQ(st, Status::kOk);
      ASSERT_GT(clean.victimSends, 2);
      // The last send, and one a little earlier.
      for (int64_t failAt : {clean.victimSends - 1, clean.victimSends - 3}) {
        const CompressedRun failed = runCompressed(n, kCount, algo, victim, failAt);
        EXPECT_NE(failed.status[static_cast<size_t>(victim)], Status::kOk);
        int failures = 0;
        for (int r = 0; r < n; ++r) {
          const auto u = static_cast<size_t>(r);
          const char* name = algo == CompressedAlgo::kTwoPhase ? "twophase" : "allgather";
          if (failed.status[u] == Status::kOk) {
            // A rank that had everything before it heard of the failure may
            // finish; its output is then the whole, correct one.
            size_t differing = 0;
            for (size_t i = 0; i < kCount; ++i)
              differing += std::bit_cast<uint32_t>(failed.out[u][i]) !=
                                   std::bit_cast<uint32_t>(clean.out[u][i])
                               ? 1
                               : 0;
            EXPECT_EQ(differing, 0u)
                << name << " n=" << n << " rank " << r << ": succeeded with a wrong output";
            continue;
          }
          ++failures;
          EXPECT_TRUE(allUntouched(failed.out[u]))
              << name << " n=" << n << " rank " << r << " send " << failAt
              << ": a failed call wrote its output";
        }
        EXPECT_GE(failures, n == 2 ? 2 : 1);
      }
    }
  }
}

// The same for the compressed reduce-scatter: one call of n pieces of
// `recvcount` on n ranks whose rank `victim` fails its send number `failAt`
// (-1: none); each rank's status, output and whether its residual stayed
// as it was (zero: a fresh state).
struct ReduceScatterRun {
  std::vector<Status> status;
  std::vector<std::vector<float>> out;
  // One byte per rank, not vector<bool>: the ranks' threads write their own
  // entries at once, and vector<bool> packs them into shared words.
  std::vector<char> residualKept;
  int64_t victimSends = 0;
};

ReduceScatterRun runReduceScatter(int n, size_t recvcount, int victim, int64_t failAt) {
  std::vector<std::unique_ptr<transport::Transport>> local;
  EXPECT_EQ(transport::createLocalTransports(n, &local), Status::kOk);
  std::vector<std::unique_ptr<SendFailingTransport>> wrapped;
  wrapped.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    wrapped.push_back(std::make_unique<SendFailingTransport>(
        std::move(local[static_cast<size_t>(r)]), r == victim ? failAt : -1));
  coll::Options options = testing::testOptions();
  options.timeout = std::chrono::seconds(5);
  options.segmentBytes = 512;  // 128 elements a segment: many segments
  codec::Spec spec;
  spec.codec = codec::CodecId::kInt4;
  spec.block = 64;
  ReduceScatterRun run;
  const auto nn = static_cast<size_t>(n);
  run.status.resize(nn);
  run.residualKept.resize(nn);
  run.out.assign(nn, std::vector<float>(recvcount, kUntouched));
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<CompressedState>> states(nn);
  for (size_t r = 0; r < nn; ++r) {
    comms.push_back(std::make_unique<Communicator>(wrapped[r].get(), options));
    EXPECT_EQ(CompressedState::createReduceScatter(n, recvcount, spec, &states[r]), Status::kOk);
  }
  const auto inputs = inputsOf(n, recvcount * nn, 7);
  std::vector<std::thread> threads;
  threads.reserve(nn);
  for (size_t r = 0; r < nn; ++r) {
    threads.emplace_back([&, r] {
      run.status[r] =
          comms[r]->compressedReduceScatter(inputs[r].data(), run.out[r].data(), recvcount,
                                            DataType::kF32, ReduceOp::kAvg, states[r].get());
      const float* residual = states[r]->worker().current();
      run.residualKept[r] =
          std::all_of(residual, residual + recvcount * nn, [](float v) { return v == 0.0f; });
    });
  }
  for (auto& t : threads) t.join();
  comms.clear();
  run.victimSends = wrapped[static_cast<size_t>(victim)]->sends();
  return run;
}

// A compressed reduce-scatter that fails (one rank's sends fail, as when it
// dies, early, late, or on its last verdict byte) leaves the output and the
// residual of every rank that fails as they were; a rank that succeeds has
// the whole, correct output.
TEST(Reliability, ACompressedReduceScatterThatFailsWritesNoOutputAndKeepsTheResidual) {
  constexpr size_t kRecv = 1000 + 77;
  for (int n : {2, 3}) {
    const int victim = n - 1;
    const ReduceScatterRun clean = runReduceScatter(n, kRecv, victim, -1);
    for (Status st : clean.status) ASSERT_EQ(st, Status::kOk);
    for (char kept : clean.residualKept) ASSERT_FALSE(kept);  // committed
    ASSERT_GT(clean.victimSends, 4);
    for (int64_t failAt : {int64_t{0}, clean.victimSends - 3, clean.victimSends - 1}) {
      const ReduceScatterRun failed = runReduceScatter(n, kRecv, victim, failAt);
      EXPECT_NE(failed.status[static_cast<size_t>(victim)], Status::kOk);
      int failures = 0;
      for (int r = 0; r < n; ++r) {
        const auto u = static_cast<size_t>(r);
        if (failed.status[u] == Status::kOk) {
          size_t differing = 0;
          for (size_t i = 0; i < kRecv; ++i)
            differing += std::bit_cast<uint32_t>(failed.out[u][i]) !=
                                 std::bit_cast<uint32_t>(clean.out[u][i])
                             ? 1
                             : 0;
          EXPECT_EQ(differing, 0u)
              << "n=" << n << " rank " << r << ": succeeded with a wrong output";
          continue;
        }
        ++failures;
        EXPECT_TRUE(allUntouched(failed.out[u])) << "n=" << n << " rank " << r << " send " << failAt
                                                 << ": a failed call wrote its output";
        EXPECT_TRUE(failed.residualKept[u])
            << "n=" << n << " rank " << r << " send " << failAt << ": a failed call committed";
      }
      EXPECT_GE(failures, 1);
    }
  }
}

}  // namespace
}  // namespace squall
