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
#include <string>
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

// Three ranks as threads over the test's wire, each with its own bootstrap.
void connectGroup(Wire wire, std::vector<std::unique_ptr<bootstrap::Bootstrap>>* boots,
                  std::vector<std::unique_ptr<transport::Transport>>* transports) {
  setenv("SQUALL_SOCKET_IFNAME", "lo", 1);
  setenv("UCX_NET_DEVICES", "lo", 0);
  constexpr int kRanks = 3;
  bootstrap::UniqueId id;
  ASSERT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
  boots->resize(kRanks);
  transports->resize(kRanks);
  std::vector<std::thread> threads;
  threads.reserve(kRanks);
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      auto& boot = (*boots)[r];
      ASSERT_EQ(bootstrap::Bootstrap::create(id, kRanks, r, 30s, &boot), Status::kOk)
          << lastError();
      Status st = Status::kUnsupported;
      if (wire == Wire::kTcp) st = transport::createTcpTransport(*boot, &(*transports)[r]);
#ifdef SQUALL_HAVE_UCX
      if (wire == Wire::kUcx) st = transport::createUcxTransport(*boot, &(*transports)[r]);
#endif
      ASSERT_EQ(st, Status::kOk) << lastError();
    });
  for (auto& t : threads) t.join();
}

TEST_P(TeardownTest, PeerTeardownDoesNotFailAnOperationThatCompletes) {
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> boots;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  connectGroup(GetParam(), &boots, &transports);
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

// A rank that finished its last collective keeps watching for that
// collective's abort notices (the communicator holds them posted until its
// next operation). A peer that finishes too and destroys its transport is
// no error then: over tcp it says goodbye, and nothing is logged at WARN.
TEST_P(TeardownTest, APeersShutdownAfterTheLastCollectiveIsNoWarning) {
  if (GetParam() != Wire::kTcp) GTEST_SKIP() << "the goodbye is the tcp transport's";
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> boots;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  connectGroup(GetParam(), &boots, &transports);
  for (auto& t : transports) ASSERT_NE(t, nullptr);
  coll::Options options;
  transport::Descriptor descriptor;
  descriptor.kind = CollKind::kAllGather;
  coll::OpContext ctx0{transports[0].get(), 3, descriptor, transport::Clock::now() + 20s, &options};
  coll::AbortWatch watch;
  ASSERT_EQ(coll::watchForAborts(ctx0, &watch), Status::kOk);
  ::testing::internal::CaptureStderr();
  transports[2].reset();
  transports[1].reset();
  const auto until = transport::Clock::now() + 10s;
  while (!(watch.requests[1]->done() && watch.requests[2]->done()) &&
         transport::Clock::now() < until)
    transports[0]->waitForActivity(transport::Clock::now() + 10ms);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(watch.requests[1]->done() && watch.requests[2]->done());
  EXPECT_EQ(log.find("WARN"), std::string::npos) << log;
  watch.requests.clear();
  transports.clear();
}

// A rank that gives up sends its notice and goes. The peer waiting on it
// must report the notice (the first cause, here "rank 2 is gone"), not the
// end of the messenger's connection that follows it on the wire.
TEST_P(TeardownTest, NoticeWinsOverTheMessengersDeparture) {
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> boots;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  connectGroup(GetParam(), &boots, &transports);
  for (auto& t : transports) ASSERT_NE(t, nullptr);
  coll::Options options;
  transport::Descriptor descriptor;
  descriptor.kind = CollKind::kAllReduce;
  descriptor.count = 4;
  auto contextOf = [&](int r) {
    return coll::OpContext{transports[r].get(), 9, descriptor, transport::Clock::now() + 20s,
                           &options};
  };
  coll::OpContext ctx0 = contextOf(0);
  coll::AbortWatch watch;
  ASSERT_EQ(coll::watchForAborts(ctx0, &watch), Status::kOk);
  ctx0.abort = &watch;
  float got[4] = {};
  transport::RequestPtr fromOne[1];
  ASSERT_EQ(ctx0.recv(1, 0, got, sizeof(got), &fromOne[0]), Status::kOk);
  // Rank 1 gives up (rank 2 died, say), tells the others and leaves.
  coll::sendAbortNotices(contextOf(1), "rank 1 failed #9: rank 2 is gone (the first cause)");
  transports[1].reset();
  // Let both the notice and the end of the connection reach rank 0 first.
  const auto until = transport::Clock::now() + 10s;
  while (!fromOne[0]->done() && transport::Clock::now() < until) {
    transports[0]->progress();
    transports[0]->waitForActivity(transport::Clock::now() + 10ms);
  }
  ASSERT_TRUE(fromOne[0]->done());
  EXPECT_EQ(ctx0.waitAll(fromOne), Status::kRemoteError);
  const std::string& why = lastError();
  EXPECT_NE(why.find("rank 2 is gone (the first cause)"), std::string::npos) << why;
  watch.requests.clear();
  transports.clear();
}

// Rank 0 finished operation 9 and is in operation 10 when rank 1, still in
// 9, gives up on it, tells the others and leaves. Rank 0 must report that
// notice (it keeps operation 9's notice receives posted through 10), not
// blame rank 1 for leaving.
TEST_P(TeardownTest, NoticeForThePreviousOperationIsReported) {
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> boots;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  connectGroup(GetParam(), &boots, &transports);
  for (auto& t : transports) ASSERT_NE(t, nullptr);
  coll::Options options;
  transport::Descriptor descriptor;
  descriptor.kind = CollKind::kAllReduce;
  descriptor.count = 4;
  auto contextOf = [&](int r, uint64_t sequence) {
    return coll::OpContext{transports[r].get(), sequence, descriptor, transport::Clock::now() + 20s,
                           &options};
  };
  coll::OpContext previous = contextOf(0, 9);
  coll::AbortWatch previousWatch;
  ASSERT_EQ(coll::watchForAborts(previous, &previousWatch), Status::kOk);
  coll::OpContext ctx0 = contextOf(0, 10);
  coll::AbortWatch watch;
  ASSERT_EQ(coll::watchForAborts(ctx0, &watch), Status::kOk);
  ctx0.abort = &watch;
  ctx0.previousAbort = &previousWatch;
  float got[4] = {};
  transport::RequestPtr fromOne[1];
  ASSERT_EQ(ctx0.recv(1, 0, got, sizeof(got), &fromOne[0]), Status::kOk);
  coll::sendAbortNotices(contextOf(1, 9), "rank 1 failed #9: rank 2 is gone (the first cause)");
  transports[1].reset();
  const auto until = transport::Clock::now() + 10s;
  while (!fromOne[0]->done() && transport::Clock::now() < until) {
    transports[0]->progress();
    transports[0]->waitForActivity(transport::Clock::now() + 10ms);
  }
  EXPECT_EQ(ctx0.waitAll(fromOne), Status::kRemoteError);
  const std::string& why = lastError();
  EXPECT_NE(why.find("rank 2 is gone (the first cause)"), std::string::npos) << why;
  EXPECT_NE(why.find("the operation before it"), std::string::npos) << why;
  watch.requests.clear();
  previousWatch.requests.clear();
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
