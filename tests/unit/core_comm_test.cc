// core::Comm, the C++ facade the C API and the plugins build on: ranks as
// threads over TCP on loopback (SQUALL_SOCKET_IFNAME=lo, see
// tests/meson.build), each with its own Comm. Closed-form expectations: rank
// r contributes r + 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.h"
#include "src/codec/parallel.h"
#include "src/common/status.h"
#include "src/core/comm.h"
#include "src/transport/nccl/nccl_table.h"

namespace squall::core {
namespace {

CommConfig tcpConfig() {
  CommConfig c;
  c.transport = TransportKind::kTcp;
  c.timeout = std::chrono::seconds(20);
  return c;
}

// Runs body(comm) on n threads; a failure on any rank fails the test.
void runRanks(int n, const std::function<void(Comm&)>& body) {
  bootstrap::UniqueId id;
  ASSERT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Comm> comm;
      if (Comm::create(id, n, r, tcpConfig(), &comm) != Status::kOk) {
        errors[static_cast<size_t>(r)] = "create: " + lastError();
        return;
      }
      body(*comm);
      comm->barrier();  // let peers drain before the transport goes
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

// Ranks as threads of one process share its cores: the codec's default
// thread count is the cores divided by the ranks on this machine.
TEST(CoreComm, CodecThreadsDivideTheCoresAmongLocalRanks) {
  for (const char* v : {"SQUALL_CODEC_THREADS", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (std::getenv(v) != nullptr) GTEST_SKIP() << v << " is set; the default is not in use";
  const int n = 3;
  std::vector<int> threads(n, 0);
  runRanks(n,
           [&](Comm& comm) { threads[static_cast<size_t>(comm.rank())] = codec::codecThreads(); });
  const int expected = std::max(1, codec::affinityCores() / n);
  for (int t : threads) EXPECT_EQ(t, expected);
}

TEST(CoreComm, ConfigFromEnvironmentIsResolved) {
  CommConfig c;
  ASSERT_EQ(CommConfig::fromEnvironment(&c), Status::kOk) << lastError();
  EXPECT_NE(c.transport, TransportKind::kMpi);
  EXPECT_GE(c.timeout.count(), 1000);
}

TEST(CoreComm, CreateRefusesBadRanks) {
  bootstrap::UniqueId id;
  ASSERT_EQ(bootstrap::createUniqueId(&id), Status::kOk);
  std::unique_ptr<Comm> comm;
  EXPECT_EQ(Comm::create(id, 0, 0, tcpConfig(), &comm), Status::kInvalidArgument);
  EXPECT_EQ(Comm::create(id, 2, 2, tcpConfig(), &comm), Status::kInvalidArgument);
  EXPECT_NE(lastError().find("outside 0..1"), std::string::npos) << lastError();
  CommConfig mpi = tcpConfig();
  mpi.transport = TransportKind::kMpi;
  EXPECT_EQ(Comm::create(id, 1, 0, mpi, &comm), Status::kInvalidUsage);
  EXPECT_EQ(comm, nullptr);
}

TEST(CoreComm, CollectivesOverTcp) {
  const int n = 3;
  runRanks(n, [&](Comm& comm) {
    const int r = comm.rank();
    EXPECT_EQ(comm.size(), n);
    EXPECT_STREQ(comm.transportName(), "tcp");
    std::vector<float> x(1000, static_cast<float>(r + 1)), y(1000, 0.0f);
    ASSERT_EQ(comm.allReduce(x.data(), y.data(), x.size(), DataType::kF32, ReduceOp::kSum),
              Status::kOk)
        << lastError();
    for (float v : y) ASSERT_EQ(v, 6.0f);

    const int64_t mine = r + 1;
    std::vector<int64_t> all(n, 0);
    ASSERT_EQ(comm.allGather(&mine, all.data(), 1, DataType::kI64), Status::kOk);
    EXPECT_EQ(all, (std::vector<int64_t>{1, 2, 3}));

    int64_t value = r == 1 ? 42 : 0;
    ASSERT_EQ(comm.broadcast(&value, 1, DataType::kI64, 1), Status::kOk);
    EXPECT_EQ(value, 42);

    coll::OperationPtr op;
    std::vector<double> d(10, r + 1.0), e(10, 0.0);
    ASSERT_EQ(
        comm.startAllReduce(d.data(), e.data(), d.size(), DataType::kF64, ReduceOp::kMax, &op),
        Status::kOk);
    ASSERT_EQ(op->wait(), Status::kOk) << op->error();
    EXPECT_EQ(e[9], 3.0);
  });
}

TEST(CoreComm, CompressorAndOptimizer) {
  const int n = 2;
  runRanks(n, [&](Comm& comm) {
    const size_t count = 4096;
    std::unique_ptr<Compressor> c;
    ASSERT_EQ(comm.createCompressor(count, codec::Spec{}, &c), Status::kOk) << lastError();
    EXPECT_EQ(&c->comm(), &comm);
    EXPECT_EQ(c->count(), count);
    // Every element of rank r is r + 1: each block is constant, so onebit is
    // exact and the average is 1.5 everywhere.
    std::vector<float> x(count, static_cast<float>(comm.rank() + 1)), y(count, 0.0f);
    ASSERT_EQ(comm.compressedAllReduce(x.data(), y.data(), DataType::kF32, ReduceOp::kAvg, *c),
              Status::kOk)
        << lastError();
    for (float v : y) ASSERT_EQ(v, 1.5f);
    CompressorStats s;
    ASSERT_EQ(c->stats(&s), Status::kOk);
    EXPECT_EQ(s.calls, 1u);
    EXPECT_GT(s.bytesSent, 0u);
    EXPECT_LT(s.bytesSent, count * sizeof(float) / 16);
    ASSERT_EQ(c->reset(), Status::kOk);

    optim::Config config;
    config.mode = optim::Mode::kSync;
    std::unique_ptr<Optimizer> o;
    ASSERT_EQ(comm.createOptimizer(16, config, &o), Status::kOk) << lastError();
    std::vector<float> p(16, 1.0f), g(16, static_cast<float>(comm.rank()));
    ASSERT_EQ(o->step(p.data(), g.data(), 0.0f), Status::kOk) << lastError();
    optim::Info info;
    ASSERT_EQ(o->info(&info), Status::kOk);
    EXPECT_EQ(info.step, 1);
    // Both ranks stepped with the same averaged gradient.
    std::vector<float> all(2 * p.size());
    ASSERT_EQ(comm.allGather(p.data(), all.data(), p.size(), DataType::kF32), Status::kOk);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(all[i], all[p.size() + i]);
    EXPECT_LT(p[0], 1.0f);
  });
}

// drain hands over what the residuals still owe, each element once: with
// zero residuals before a call, sum of inputs = output (times n for avg)
// plus what every rank drains; seed gives it to another compressor whole.
TEST(CoreComm, CompressorResidualsDrainAndSeed) {
  setenv("SQUALL_COMPRESSED_ALGO", "twophase", 1);  // a server residual too
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    runRanks(3, [&](Comm& comm) {
      const size_t count = 300;
      codec::Spec spec;
      spec.block = 64;
      std::unique_ptr<Compressor> a, b;
      ASSERT_EQ(comm.createCompressor(count, spec, &a, 40), Status::kOk) << lastError();
      EXPECT_EQ(a->phase(), 40u);
      std::vector<float> x(count), y(count), sum(count), owed(count, 0.0f), total(count);
      for (size_t i = 0; i < count; ++i)
        x[i] = static_cast<float>((i * 7 + static_cast<size_t>(comm.rank()) * 13) % 17) - 8.0f;
      ASSERT_EQ(comm.compressedAllReduce(x.data(), y.data(), DataType::kF32, op, *a), Status::kOk)
          << lastError();
      ASSERT_EQ(a->drain(owed.data(), op, nullptr), Status::kOk);
      ASSERT_EQ(comm.allReduce(x.data(), sum.data(), count, DataType::kF32, ReduceOp::kSum),
                Status::kOk);
      ASSERT_EQ(comm.allReduce(owed.data(), total.data(), count, DataType::kF32, ReduceOp::kSum),
                Status::kOk);
      const float n = op == ReduceOp::kAvg ? 3.0f : 1.0f;
      for (size_t i = 0; i < count; ++i)
        ASSERT_NEAR(n * y[i] + total[i], sum[i], 1e-4f * (1.0f + std::abs(sum[i]))) << i;
      std::vector<float> again(count, 0.0f), back(count, 0.0f);
      ASSERT_EQ(a->drain(again.data(), op, nullptr), Status::kOk);
      EXPECT_EQ(again, std::vector<float>(count, 0.0f));  // drained means zeroed
      ASSERT_EQ(comm.createCompressor(count, spec, &b), Status::kOk);
      ASSERT_EQ(b->seed(owed.data(), nullptr), Status::kOk);
      ASSERT_EQ(b->drain(back.data(), op, nullptr), Status::kOk);
      EXPECT_EQ(back, owed);
    });
  }
  unsetenv("SQUALL_COMPRESSED_ALGO");
}

TEST(CoreComm, CompressorOfAnotherCommIsRefused) {
  runRanks(1, [&](Comm& comm) {
    std::unique_ptr<Comm> other;
    ASSERT_EQ(comm.split(0, 0, &other), Status::kOk) << lastError();
    std::unique_ptr<Compressor> c;
    ASSERT_EQ(other->createCompressor(64, codec::Spec{}, &c), Status::kOk);
    std::vector<float> x(64, 1.0f);
    EXPECT_EQ(comm.compressedAllReduce(x.data(), x.data(), DataType::kF32, ReduceOp::kSum, *c),
              Status::kInvalidUsage);
    EXPECT_NE(lastError().find("another communicator"), std::string::npos) << lastError();
  });
}

TEST(CoreComm, SplitByParity) {
  const int n = 4;
  runRanks(n, [&](Comm& comm) {
    const int r = comm.rank();
    // Ranks 0 and 2 form one group, ordered by key (reversed); rank 3 opts out.
    const int color = r == 3 ? -1 : r % 2;
    std::unique_ptr<Comm> sub;
    ASSERT_EQ(comm.split(color, -r, &sub), Status::kOk) << lastError();
    if (color < 0) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    ASSERT_NE(sub, nullptr);
    EXPECT_STREQ(sub->transportName(), "tcp");
    EXPECT_EQ(sub->config().timeout, comm.config().timeout);
    if (color == 0) {
      EXPECT_EQ(sub->size(), 2);
      EXPECT_EQ(sub->rank(), r == 2 ? 0 : 1);
    } else {
      EXPECT_EQ(sub->size(), 1);
      EXPECT_EQ(sub->rank(), 0);
    }
    int32_t v = r + 1, sum = 0;
    ASSERT_EQ(sub->allReduce(&v, &sum, 1, DataType::kI32, ReduceOp::kSum), Status::kOk)
        << lastError();
    EXPECT_EQ(sum, color == 0 ? 1 + 3 : 2);
    ASSERT_EQ(sub->barrier(), Status::kOk);
  });
}

// Without the GPU path (or without a GPU) the device entry points fail with a
// sentence, never silently.
TEST(CoreComm, DeviceEntryPointsFailCleanlyOrWork) {
  std::unique_ptr<Comm> nccl;
  EXPECT_EQ(Comm::fromNccl(nullptr, &nccl), Status::kInvalidArgument);
  // An ncclComm_t that NCCL (here a table refusing every query) does not
  // know: kInvalidArgument with the GPU path, kUnsupported without.
  transport::nccl::Table refusing{};
  refusing.getErrorString = [](int) { return "invalid communicator"; };
  refusing.commCount = [](void*, int*) -> int { return nccl_abi::kInvalidArgument; };
  refusing.commUserRank = refusing.commCount;
  refusing.origin = "refusing table";
  transport::nccl::installTable(&refusing);
  int notAComm = 0;
  const Status s = Comm::fromNccl(&notAComm, &nccl);
  transport::nccl::installTable(nullptr);
  EXPECT_TRUE(s == Status::kInvalidArgument || s == Status::kUnsupported) << statusName(s);
  EXPECT_EQ(nccl, nullptr);
  if (s == Status::kInvalidArgument) {
    EXPECT_NE(lastError().find("invalid communicator"), std::string::npos) << lastError();
  }
  runRanks(1, [&](Comm& comm) {
    std::unique_ptr<Compressor> c;
    ASSERT_EQ(comm.createCompressor(16, codec::Spec{}, &c), Status::kOk);
    std::vector<float> in(16, 1.5f), out(16, 0.0f);
    const Status s = comm.compressedAllReduceOnStream(in.data(), out.data(), DataType::kF32,
                                                      ReduceOp::kAvg, *c, nullptr);
    if (s == Status::kOk) {
      EXPECT_EQ(out, in);
    } else {
      EXPECT_TRUE(s == Status::kUnsupported || s == Status::kSystemError) << statusName(s);
      EXPECT_NE(lastError(), "");
    }
    EXPECT_EQ(comm.compressedAllReduceOnStream(in.data(), out.data(), DataType::kI32,
                                               ReduceOp::kSum, *c, nullptr),
              Status::kInvalidArgument);
  });
}

}  // namespace
}  // namespace squall::core
