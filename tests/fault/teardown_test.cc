// A peer's teardown must not fail an operation that can still complete.
//
// Three ranks as threads, each with its own bootstrap and transport. Rank 2
// takes no further part and destroys its transport, so the connection to it
// ends while rank 1 still waits for data from rank 0 in an operation whose
// abort notices it watches. The notice receive from rank 2 fails with the
// connection; the operation must still succeed once rank 0's data arrives
// (the best-effort notice is no part of the data). The loop script
// tests/fault/teardown_loop.py measures the same race between processes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.h"
#include "src/coll/context.h"
#include "src/transport/tcp/tcp_transport.h"
#ifdef SQUALL_HAVE_UCX
#include "src/transport/ucx/ucx_transport.h"
#endif

namespace squall {
namespace {

using namespace std::chrono_literals;

enum class Wire { kTcp, kUcx };

class TeardownTest : public ::testing::TestWithParam<Wire> {};

TEST_P(TeardownTest, PeerTeardownDoesNotFailAnOperationThatCompletes) {
  setenv("SQUALL_SOCKET_IFNAME", "lo", 1);
  setenv("UCX_NET_DEVICES", "lo", 0);
  constexpr int kRanks = 3;
  bootstrap::UniqueId id;
  ASSERT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> boots(kRanks);
  std::vector<std::unique_ptr<transport::Transport>> transports(kRanks);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        ASSERT_EQ(bootstrap::Bootstrap::create(id, kRanks, r, 30s, &boots[r]), Status::kOk)
            << lastError();
        Status st = Status::kUnsupported;
        if (GetParam() == Wire::kTcp) st = transport::createTcpTransport(*boots[r], &transports[r]);
#ifdef SQUALL_HAVE_UCX
        if (GetParam() == Wire::kUcx) st = transport::createUcxTransport(*boots[r], &transports[r]);
#endif
        ASSERT_EQ(st, Status::kOk) << lastError();
      });
    for (auto& t : threads) t.join();
  }
  for (auto& t : transports) ASSERT_NE(t, nullptr);

  coll::Options options;
  transport::Descriptor descriptor;
  descriptor.kind = CollKind::kAllGather;
  descriptor.count = 4;
  auto contextOf = [&](int r) {
    return coll::OpContext{transports[r].get(), 7, descriptor, transport::Clock::now() + 20s,
                           &options};
  };

  // Rank 1 starts the operation: watches for notices, waits for rank 0.
  coll::OpContext ctx1 = contextOf(1);
  coll::AbortWatch watch;
  ASSERT_EQ(coll::watchForAborts(ctx1, &watch), Status::kOk);
  ctx1.abort = &watch;
  float got[4] = {};
  transport::RequestPtr fromZero;
  ASSERT_EQ(ctx1.recv(0, 0, got, sizeof(got), &fromZero), Status::kOk);

  // Rank 2 is done and goes away.
  transports[2].reset();
  // Rank 1 sees the connection to rank 2 end (its notice receive fails).
  const auto until = transport::Clock::now() + 10s;
  while (!watch.requests[2]->done() && transport::Clock::now() < until) {
    transports[1]->progress();
    transports[1]->waitForActivity(transport::Clock::now() + 10ms);
  }
  ASSERT_TRUE(watch.requests[2]->done()) << "rank 2's teardown never reached rank 1";

  // Only now, with rank 1 already waiting, does rank 0's data come.
  Status sendStatus = Status::kInternal;
  std::thread zero([&] {
    std::this_thread::sleep_for(300ms);
    const float sent[4] = {1, 2, 3, 4};
    coll::OpContext ctx0 = contextOf(0);
    transport::RequestPtr sends[1];
    sendStatus = ctx0.send(1, 0, sent, sizeof(sent), &sends[0]);
    if (sendStatus == Status::kOk) sendStatus = ctx0.waitAll(sends);
  });
  transport::RequestPtr waited[] = {std::move(fromZero)};
  EXPECT_EQ(ctx1.waitAll(waited), Status::kOk) << lastError();
  zero.join();
  EXPECT_EQ(got[3], 4.0f);
  EXPECT_EQ(sendStatus, Status::kOk);
  watch.requests.clear();
  transports.clear();
}

std::vector<Wire> wires() {
#ifdef SQUALL_HAVE_UCX
  return {Wire::kTcp, Wire::kUcx};
#else
  return {Wire::kTcp};
#endif
}

INSTANTIATE_TEST_SUITE_P(Wires, TeardownTest, ::testing::ValuesIn(wires()),
                         [](const ::testing::TestParamInfo<Wire>& info) {
                           return info.param == Wire::kTcp ? "tcp" : "ucx";
                         });

}  // namespace
}  // namespace squall
