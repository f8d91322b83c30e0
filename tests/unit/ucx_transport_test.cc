// Tests of the UCX backend: ranks as threads of one process (one UCX context
// each) and as forked processes, over loopback only (UCX_NET_DEVICES=lo is
// forced in main). Written around a factory, makeUcx(Bootstrap&), so they can
// be folded into the shared conformance suite.
#include "src/transport/ucx/ucx_transport.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <time.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "src/common/params.h"
#include "tests/unit/bootstrap_doubles.h"
#include "tests/unit/transport_exchange.h"

namespace squall::transport {
namespace {

using namespace std::chrono_literals;
using testing::exchangeAll;
using testing::ForkBootstrap;
using testing::rawTag;
using testing::soon;
using testing::ThreadBootstrap;
using testing::ThreadBootstrapGroup;

std::unique_ptr<Transport> makeUcx(bootstrap::Bootstrap& bootstrap) {
  std::unique_ptr<Transport> transport;
  if (createUcxTransport(bootstrap, &transport) != Status::kOk) return nullptr;
  return transport;
}

// Runs body(transport, bootstrap) on `size` threads, each with its own UCX
// transport; a barrier separates the body from teardown so no rank closes
// while a peer still talks to it.
void runThreads(int size, const std::function<void(Transport&, bootstrap::Bootstrap&)>& body) {
  ThreadBootstrapGroup group(size);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ThreadBootstrap bootstrap(&group, r);
      std::unique_ptr<Transport> transport = makeUcx(bootstrap);
      ASSERT_NE(transport, nullptr) << lastError();
      EXPECT_EQ(transport->rank(), r);
      EXPECT_EQ(transport->size(), size);
      body(*transport, bootstrap);
      bootstrap.barrier();
    });
  }
  for (std::thread& t : threads) t.join();
}

class UcxThreads : public ::testing::TestWithParam<int> {};

TEST_P(UcxThreads, AllSizesToAllRanks) {
  runThreads(GetParam(), [](Transport& t, bootstrap::Bootstrap&) {
    EXPECT_TRUE(exchangeAll(t, 1));
    EXPECT_TRUE(exchangeAll(t, 2));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, UcxThreads, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(UcxTransport, ManyConcurrentRequestsReceivedInReverseOrder) {
  constexpr int kMessages = 300;
  runThreads(3, [](Transport& t, bootstrap::Bootstrap&) {
    const int n = t.size(), me = t.rank();
    const size_t count = static_cast<size_t>(n) * kMessages;
    std::vector<uint64_t> out(count), in(count, 0);
    std::vector<RequestPtr> requests(2 * count);
    for (int p = 0; p < n; ++p)
      for (int m = kMessages - 1; m >= 0; --m)
        ASSERT_EQ(t.recv(p, rawTag(7, m), &in[p * kMessages + m], sizeof(uint64_t),
                         &requests[p * kMessages + m]),
                  Status::kOk);
    for (int p = 0; p < n; ++p)
      for (int m = 0; m < kMessages; ++m) {
        out[p * kMessages + m] = (uint64_t(me) << 32) | (uint64_t(p) << 16) | m;
        ASSERT_EQ(t.send(p, rawTag(7, m), &out[p * kMessages + m], sizeof(uint64_t),
                         &requests[(n + p) * kMessages + m]),
                  Status::kOk);
      }
    ASSERT_EQ(t.waitAll(requests, soon(20s)), Status::kOk) << lastError();
    for (int p = 0; p < n; ++p)
      for (int m = 0; m < kMessages; ++m)
        EXPECT_EQ(in[p * kMessages + m], (uint64_t(p) << 32) | (uint64_t(me) << 16) | m);
  });
}

TEST(UcxTransport, UnexpectedMessagesAreBufferedUntilReceived) {
  runThreads(2, [](Transport& t, bootstrap::Bootstrap& b) {
    const int peer = 1 - t.rank();
    std::vector<uint8_t> out(100000, static_cast<uint8_t>(t.rank() + 1)), in(100000, 0);
    uint32_t small = 0xabc0 + t.rank(), smallIn = 0;
    RequestPtr big, tiny;
    ASSERT_EQ(t.send(peer, rawTag(3, 0), out.data(), out.size(), &big), Status::kOk);
    ASSERT_EQ(t.send(peer, rawTag(3, 1), &small, sizeof(small), &tiny), Status::kOk);
    // Both ranks' messages are in flight (or buffered) before any receive.
    for (int i = 0; i < 20; ++i) t.progress();
    b.barrier();
    RequestPtr r1, r0;
    ASSERT_EQ(t.recv(peer, rawTag(3, 1), &smallIn, sizeof(smallIn), &r1), Status::kOk);
    ASSERT_EQ(t.recv(peer, rawTag(3, 0), in.data(), in.size(), &r0), Status::kOk);
    RequestPtr all[] = {std::move(big), std::move(tiny), std::move(r1), std::move(r0)};
    ASSERT_EQ(t.waitAll(all, soon()), Status::kOk) << lastError();
    EXPECT_EQ(smallIn, 0xabc0u + peer);
    EXPECT_EQ(in, std::vector<uint8_t>(100000, static_cast<uint8_t>(peer + 1)));
  });
}

TEST(UcxTransport, SelfSendWithOneRank) {
  runThreads(1, [](Transport& t, bootstrap::Bootstrap&) {
    std::vector<int> out(5000), in(5000);
    for (int i = 0; i < 5000; ++i) out[i] = i * 3;
    RequestPtr s, r;
    ASSERT_EQ(t.send(0, rawTag(1, 0), out.data(), out.size() * sizeof(int), &s), Status::kOk);
    ASSERT_EQ(t.recv(0, rawTag(1, 0), in.data(), in.size() * sizeof(int), &r), Status::kOk);
    RequestPtr all[] = {std::move(s), std::move(r)};
    ASSERT_EQ(t.waitAll(all, soon()), Status::kOk) << lastError();
    EXPECT_EQ(in, out);
  });
}

Tag collTag(CollKind kind, uint64_t count) {
  Tag tag = rawTag(12, 0);
  tag.descriptor.kind = kind;
  tag.descriptor.count = count;
  return tag;
}

TEST(UcxTransport, DescriptorMismatchNamesBothSides) {
  runThreads(2, [](Transport& t, bootstrap::Bootstrap&) {
    std::vector<float> data(1000, 1.0f);
    RequestPtr request;
    if (t.rank() == 0) {
      ASSERT_EQ(t.send(1, collTag(CollKind::kAllReduce, 1000), data.data(), 4000, &request),
                Status::kOk);
      ASSERT_EQ(t.waitAll({&request, 1}, soon()), Status::kOk);
    } else {
      clearLastError();
      ASSERT_EQ(t.recv(0, collTag(CollKind::kAllGather, 1000), data.data(), 4000, &request),
                Status::kOk);
      EXPECT_EQ(t.waitAll({&request, 1}, soon()), Status::kInvalidUsage);
      EXPECT_NE(lastError().find("allgather"), std::string::npos) << lastError();
      EXPECT_NE(lastError().find("allreduce"), std::string::npos) << lastError();
      EXPECT_NE(lastError().find("rank 0"), std::string::npos) << lastError();
    }
  });
}

TEST(UcxTransport, SizeMismatchNamesBothSizes) {
  for (size_t expected : {size_t{32}, size_t{4096}}) {
    runThreads(2, [expected](Transport& t, bootstrap::Bootstrap&) {
      std::vector<uint8_t> data(4096, 9);
      RequestPtr request;
      if (t.rank() == 0) {
        ASSERT_EQ(t.send(1, rawTag(5, 2), data.data(), 64, &request), Status::kOk);
        ASSERT_EQ(t.waitAll({&request, 1}, soon()), Status::kOk);
      } else {
        ASSERT_EQ(t.recv(0, rawTag(5, 2), data.data(), expected, &request), Status::kOk);
        EXPECT_EQ(t.waitAll({&request, 1}, soon()), Status::kInvalidUsage);
        EXPECT_NE(lastError().find(std::to_string(expected) + " bytes"), std::string::npos)
            << lastError();
        EXPECT_NE(lastError().find("64 bytes"), std::string::npos) << lastError();
        // The receive buffer beyond a short message is untouched.
        EXPECT_EQ(data[4095], 9);
      }
    });
  }
}

TEST(UcxTransport, TimeoutNamesPeerAndSleeps) {
  runThreads(2, [](Transport& t, bootstrap::Bootstrap&) {
    if (t.rank() != 0) return;
    uint64_t value = 0;
    RequestPtr request;
    ASSERT_EQ(t.recv(1, rawTag(9, 0), &value, sizeof(value), &request), Status::kOk);
    timespec cpu0, cpu1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
    auto start = Clock::now();
    EXPECT_EQ(t.waitAll({&request, 1}, soon(600ms)), Status::kTimeout);
    double wall = std::chrono::duration<double>(Clock::now() - start).count();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
    double cpu = (cpu1.tv_sec - cpu0.tv_sec) + 1e-9 * (cpu1.tv_nsec - cpu0.tv_nsec);
    EXPECT_NE(lastError().find("rank(s) 1"), std::string::npos) << lastError();
    EXPECT_GE(wall, 0.55);
    // A blocking wait, not a spin.
    EXPECT_LT(cpu, 0.25 * wall) << "waitAll burned " << cpu << " s of CPU in " << wall << " s";
  });
}

// A blocked rank must wake as soon as its message arrives, not when the
// wait's safety-net timeout expires: a missed wakeup costs a whole cap per
// round trip, so 200 ping-pongs of 8 bytes averaging well under the cap
// catch it. (On loopback a round trip takes tens of microseconds; the bound
// leaves room for a loaded machine.)
TEST(UcxTransport, PingPongWakesWithoutWaitingForTheTimeout) {
  constexpr int kRounds = 200;
  for (int ranks : {2, 3}) {
    runThreads(ranks, [](Transport& t, bootstrap::Bootstrap&) {
      if (t.rank() > 1) return;  // a bystander endpoint, idle
      const int peer = 1 - t.rank();
      uint64_t out = 0, in = 0;
      // Warm up: connections are set up on first use.
      for (int i = 0; i < 5; ++i) {
        RequestPtr s, r;
        ASSERT_EQ(t.send(peer, rawTag(20, i), &out, sizeof(out), &s), Status::kOk);
        ASSERT_EQ(t.recv(peer, rawTag(20, i), &in, sizeof(in), &r), Status::kOk);
        RequestPtr both[] = {std::move(s), std::move(r)};
        ASSERT_EQ(t.waitAll(both, soon()), Status::kOk) << lastError();
      }
      auto start = Clock::now();
      for (int i = 0; i < kRounds; ++i) {
        RequestPtr s, r;
        if (t.rank() == 0) {
          out = i;
          ASSERT_EQ(t.send(peer, rawTag(21, i), &out, sizeof(out), &s), Status::kOk);
          ASSERT_EQ(t.waitAll({&s, 1}, soon()), Status::kOk) << lastError();
          ASSERT_EQ(t.recv(peer, rawTag(21, i), &in, sizeof(in), &r), Status::kOk);
          ASSERT_EQ(t.waitAll({&r, 1}, soon()), Status::kOk) << lastError();
          ASSERT_EQ(in, uint64_t(i) + 1000);
        } else {
          ASSERT_EQ(t.recv(peer, rawTag(21, i), &in, sizeof(in), &r), Status::kOk);
          ASSERT_EQ(t.waitAll({&r, 1}, soon()), Status::kOk) << lastError();
          out = in + 1000;
          ASSERT_EQ(t.send(peer, rawTag(21, i), &out, sizeof(out), &s), Status::kOk);
          ASSERT_EQ(t.waitAll({&s, 1}, soon()), Status::kOk) << lastError();
        }
      }
      double perRound = std::chrono::duration<double>(Clock::now() - start).count() / kRounds;
      std::printf("rank %d: %.1f us per round trip\n", t.rank(), perRound * 1e6);
      EXPECT_LT(perRound, 2e-3) << "round trips wait for the wakeup timeout";
    });
  }
}

TEST(UcxTransport, CancelledRequestsReleaseTheirBuffers) {
  runThreads(2, [](Transport& t, bootstrap::Bootstrap& b) {
    const int peer = 1 - t.rank();
    // A receive destroyed before its message arrives does not take it.
    uint64_t value = 0;
    {
      RequestPtr dropped;
      ASSERT_EQ(t.recv(peer, rawTag(4, 0), &value, sizeof(value), &dropped), Status::kOk);
      t.progress();
    }
    b.barrier();
    uint64_t out = 40 + t.rank(), in = 0;
    RequestPtr s, r;
    ASSERT_EQ(t.send(peer, rawTag(4, 0), &out, sizeof(out), &s), Status::kOk);
    ASSERT_EQ(t.recv(peer, rawTag(4, 0), &in, sizeof(in), &r), Status::kOk);
    RequestPtr all[] = {std::move(s), std::move(r)};
    ASSERT_EQ(t.waitAll(all, soon()), Status::kOk) << lastError();
    EXPECT_EQ(in, 40u + peer);
    EXPECT_EQ(value, 0u);
  });
  // A large send nobody receives is released on destruction within a bounded
  // time; the transport then tears down cleanly. (Without peer error handling
  // UCX cannot abandon it, and the destructor waits for the receiver.)
  if (!paramBool(Param::kUcxPeerFailure)) return;
  // The receiver stays up (and never posts the receive) until the sender has
  // let go, as in a real job: tearing it down at the same moment races UCX's
  // own TCP endpoint state machine, which asserts in UCX 1.13.
  runThreads(2, [](Transport& t, bootstrap::Bootstrap& b) {
    if (t.rank() == 0) {
      std::vector<uint8_t> big(8 << 20, 1);
      RequestPtr s;
      ASSERT_EQ(t.send(1, rawTag(8, 0), big.data(), big.size(), &s), Status::kOk);
      for (int i = 0; i < 10; ++i) t.progress();
      auto start = Clock::now();
      s.reset();
      EXPECT_LT(Clock::now() - start, 5s);
    }
    b.barrier();
  });
}

TEST(UcxTransport, RendezvousThresholdFollowsTheHostAndTheUser) {
  EXPECT_EQ(ucxRendezvousThreshold("auto", false, false), "inf");  // Ethernet only: eager
  EXPECT_EQ(ucxRendezvousThreshold("auto", false, true), "");      // RDMA: UCX decides
  EXPECT_EQ(ucxRendezvousThreshold("auto", true, false), "");      // UCX_RNDV_THRESH set
  EXPECT_EQ(ucxRendezvousThreshold("64k", true, true), "64k");     // asked for explicitly
  EXPECT_EQ(ucxRendezvousThreshold("ucx", false, false), "");      // UCX's own, asked for
}

// A value UCX cannot parse is refused at init with a message naming it.
TEST(UcxTransport, BadRendezvousThresholdIsRefused) {
  ::setenv("SQUALL_UCX_RNDV_THRESH", "lots", 1);
  ThreadBootstrapGroup group(1);
  ThreadBootstrap bootstrap(&group, 0);
  std::unique_ptr<Transport> transport;
  const Status st = createUcxTransport(bootstrap, &transport);
  ::unsetenv("SQUALL_UCX_RNDV_THRESH");
  EXPECT_NE(st, Status::kOk);
  EXPECT_NE(lastError().find("SQUALL_UCX_RNDV_THRESH"), std::string::npos) << lastError();
}

TEST(UcxTransport, OutOfRangePeerIsInvalidArgument) {
  runThreads(1, [](Transport& t, bootstrap::Bootstrap&) {
    RequestPtr request;
    uint8_t byte = 0;
    EXPECT_EQ(t.send(1, rawTag(1, 0), &byte, 1, &request), Status::kInvalidArgument);
    EXPECT_EQ(t.recv(-1, rawTag(1, 0), &byte, 1, &request), Status::kInvalidArgument);
  });
}

// ----- ranks as processes -----

#define CHILD_CHECK(cond)                                                                   \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "rank %d: check failed at line %d: %s (last error: %s)\n", rank, \
                   __LINE__, #cond, lastError().c_str());                                   \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

class UcxProcesses : public ::testing::TestWithParam<int> {};

TEST_P(UcxProcesses, AllSizesToAllRanks) {
  std::vector<int> statuses = squall::testing::runForked(GetParam(), [](ForkBootstrap& b) {
    const int rank = b.rank();
    std::unique_ptr<Transport> t = makeUcx(b);
    CHILD_CHECK(t != nullptr);
    ::testing::TestPartResultArray failures;
    bool ok;
    {
      ::testing::ScopedFakeTestPartResultReporter reporter(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
      ok = exchangeAll(*t, 1) && exchangeAll(*t, 2);
    }
    for (int i = 0; i < failures.size(); ++i)
      std::fprintf(stderr, "rank %d: %s\n", rank, failures.GetTestPartResult(i).message());
    CHILD_CHECK(ok && failures.size() == 0);
    CHILD_CHECK(b.barrier() == Status::kOk);
    return 0;
  });
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(WIFEXITED(statuses[r])) << "rank " << r;
    EXPECT_EQ(WEXITSTATUS(statuses[r]), 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, UcxProcesses, ::testing::Values(2, 3, 4));

// Rank 2 dies mid-exchange; ranks 0 and 1 must fail with kRemoteError (or
// kTimeout) naming it, within a few seconds.
TEST(UcxProcessFailure, KilledPeerIsNamed) {
  std::vector<int> statuses = squall::testing::runForked(3, [](ForkBootstrap& b) {
    const int rank = b.rank();
    std::unique_ptr<Transport> t = makeUcx(b);
    CHILD_CHECK(t != nullptr);
    // Round 1 completes everywhere, so all endpoints are wired up.
    uint64_t out = rank, in[3] = {};
    std::vector<RequestPtr> requests(6);
    for (int p = 0; p < 3; ++p) {
      CHILD_CHECK(t->send(p, rawTag(1, 0), &out, sizeof(out), &requests[p]) == Status::kOk);
      CHILD_CHECK(t->recv(p, rawTag(1, 0), &in[p], sizeof(in[p]), &requests[3 + p]) == Status::kOk);
    }
    CHILD_CHECK(t->waitAll(requests, soon()) == Status::kOk);
    if (rank == 2) ::_exit(0);  // no teardown: as if it crashed
    // Round 2: rank 2 never sends.
    uint64_t from2 = 0;
    RequestPtr pending;
    CHILD_CHECK(t->recv(2, rawTag(2, 0), &from2, sizeof(from2), &pending) == Status::kOk);
    auto start = Clock::now();
    Status st = t->waitAll({&pending, 1}, soon(8s));
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::fprintf(stderr, "rank %d saw rank 2's death after %.2f s: %s\n", rank, seconds,
                 lastError().c_str());
    CHILD_CHECK(st == Status::kRemoteError || st == Status::kTimeout);
    CHILD_CHECK(lastError().find("rank 2") != std::string::npos ||
                lastError().find("rank(s) 2") != std::string::npos);
    // Later traffic with it fails at once too.
    if (st == Status::kRemoteError) {
      RequestPtr later;
      CHILD_CHECK(t->send(2, rawTag(3, 0), &out, sizeof(out), &later) == Status::kOk);
      CHILD_CHECK(later->done() && later->status() == Status::kRemoteError);
    }
    // The survivors still talk to each other.
    const int peer = 1 - rank;
    uint64_t got = 0;
    RequestPtr s, r;
    CHILD_CHECK(t->send(peer, rawTag(4, 0), &out, sizeof(out), &s) == Status::kOk);
    CHILD_CHECK(t->recv(peer, rawTag(4, 0), &got, sizeof(got), &r) == Status::kOk);
    RequestPtr both[] = {std::move(s), std::move(r)};
    CHILD_CHECK(t->waitAll(both, soon()) == Status::kOk);
    CHILD_CHECK(got == static_cast<uint64_t>(peer));
    return 0;
  });
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(WIFEXITED(statuses[r])) << "rank " << r;
    EXPECT_EQ(WEXITSTATUS(statuses[r]), 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace squall::transport

int main(int argc, char** argv) {
  // Loopback only, and fast failure detection for the killed-peer test.
  setenv("UCX_NET_DEVICES", "lo", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
