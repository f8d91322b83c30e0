// The local transport: matching, mismatch reporting, timeouts, cancellation
// and wake-ups.
#include "src/transport/local/local_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace squall {
namespace {

TEST(LocalTransport, MatchesBySourceSequenceAndStepInAnyOrder) {
  std::vector<std::unique_ptr<transport::Transport>> t;
  ASSERT_EQ(transport::createLocalTransports(2, &t), Status::kOk);
  transport::Descriptor d;
  int a = 1, b = 2, ra = 0, rb = 0;
  transport::RequestPtr s1, s2, r1, r2;
  // Sent before the receives are posted (unexpected), in the opposite order.
  ASSERT_EQ(t[0]->send(1, transport::Tag{5, 1, d}, &b, 4, &s2), Status::kOk);
  ASSERT_EQ(t[0]->send(1, transport::Tag{5, 0, d}, &a, 4, &s1), Status::kOk);
  ASSERT_EQ(t[1]->recv(0, transport::Tag{5, 0, d}, &ra, 4, &r1), Status::kOk);
  ASSERT_EQ(t[1]->recv(0, transport::Tag{5, 1, d}, &rb, 4, &r2), Status::kOk);
  const auto deadline = transport::Clock::now() + std::chrono::seconds(5);
  transport::RequestPtr all[] = {std::move(r1), std::move(r2)};
  ASSERT_EQ(t[1]->waitAll(all, deadline), Status::kOk);
  EXPECT_EQ(ra, 1);
  EXPECT_EQ(rb, 2);
}

TEST(LocalTransport, MismatchedDescriptorFailsWithBothSides) {
  std::vector<std::unique_ptr<transport::Transport>> t;
  ASSERT_EQ(transport::createLocalTransports(2, &t), Status::kOk);
  transport::Descriptor mine, theirs;
  mine.kind = theirs.kind = CollKind::kAllReduce;
  mine.count = 10;
  theirs.count = 11;
  int x = 0;
  const auto deadline = transport::Clock::now() + std::chrono::seconds(5);
  // Receive posted first: the sender finds the mismatch, the receiver reports it.
  transport::RequestPtr r, s;
  ASSERT_EQ(t[1]->recv(0, transport::Tag{1, 0, mine}, &x, 4, &r), Status::kOk);
  ASSERT_EQ(t[0]->send(1, transport::Tag{1, 0, theirs}, &x, 4, &s), Status::kOk);
  clearLastError();
  EXPECT_EQ(t[1]->waitAll({&r, 1}, deadline), Status::kInvalidUsage);
  EXPECT_NE(lastError().find("10 elements"), std::string::npos) << lastError();
  EXPECT_NE(lastError().find("11 elements"), std::string::npos) << lastError();
  // Message first: the receive request fails at once.
  ASSERT_EQ(t[0]->send(1, transport::Tag{2, 0, theirs}, &x, 4, &s), Status::kOk);
  ASSERT_EQ(t[1]->recv(0, transport::Tag{2, 0, mine}, &x, 4, &r), Status::kOk);
  EXPECT_EQ(t[1]->waitAll({&r, 1}, deadline), Status::kInvalidUsage);
  // Size mismatch with equal descriptors.
  ASSERT_EQ(t[0]->send(1, transport::Tag{3, 0, mine}, &x, 2, &s), Status::kOk);
  ASSERT_EQ(t[1]->recv(0, transport::Tag{3, 0, mine}, &x, 4, &r), Status::kOk);
  EXPECT_EQ(t[1]->waitAll({&r, 1}, deadline), Status::kInvalidUsage);
}

TEST(LocalTransport, TimesOutNamingThePeerAndCancels) {
  std::vector<std::unique_ptr<transport::Transport>> t;
  ASSERT_EQ(transport::createLocalTransports(3, &t), Status::kOk);
  int x = 0;
  transport::RequestPtr r;
  ASSERT_EQ(t[0]->recv(2, transport::Tag{}, &x, 4, &r), Status::kOk);
  clearLastError();
  EXPECT_EQ(t[0]->waitAll({&r, 1}, transport::Clock::now() + std::chrono::milliseconds(50)),
            Status::kTimeout);
  EXPECT_NE(lastError().find("rank(s) 2"), std::string::npos) << lastError();
  r.reset();  // cancelled: a late message is buffered, not written to x
  int y = 7;
  transport::RequestPtr s;
  ASSERT_EQ(t[2]->send(0, transport::Tag{}, &y, 4, &s), Status::kOk);
  EXPECT_EQ(x, 0);
}

// Posting into a RequestPtr that still holds a pending receive destroys that
// receive (cancelling it) while the new one is posted to the same mailbox.
TEST(LocalTransport, PostingOverAPendingReceiveCancelsIt) {
  std::vector<std::unique_ptr<transport::Transport>> t;
  ASSERT_EQ(transport::createLocalTransports(2, &t), Status::kOk);
  int x = 0, y = 0, value = 5;
  transport::RequestPtr r, s;
  ASSERT_EQ(t[0]->recv(1, transport::Tag{1, 0, {}}, &x, 4, &r), Status::kOk);
  ASSERT_EQ(t[0]->recv(1, transport::Tag{2, 0, {}}, &y, 4, &r), Status::kOk);
  ASSERT_EQ(t[1]->send(0, transport::Tag{2, 0, {}}, &value, 4, &s), Status::kOk);
  ASSERT_EQ(t[1]->send(0, transport::Tag{1, 0, {}}, &value, 4, &s), Status::kOk);
  EXPECT_EQ(t[0]->waitAll({&r, 1}, transport::Clock::now() + std::chrono::seconds(5)), Status::kOk);
  EXPECT_EQ(y, 5);
  EXPECT_EQ(x, 0);  // the first receive was cancelled; its message is buffered
}

TEST(LocalTransport, WakesASleepingReceiver) {
  std::vector<std::unique_ptr<transport::Transport>> t;
  ASSERT_EQ(transport::createLocalTransports(2, &t), Status::kOk);
  int x = 0, y = 42;
  transport::RequestPtr r, s;
  ASSERT_EQ(t[0]->recv(1, transport::Tag{}, &x, 4, &r), Status::kOk);
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(t[1]->send(0, transport::Tag{}, &y, 4, &s), Status::kOk);
  });
  const auto begin = transport::Clock::now();
  EXPECT_EQ(t[0]->waitAll({&r, 1}, begin + std::chrono::seconds(5)), Status::kOk);
  EXPECT_LT(transport::Clock::now() - begin, std::chrono::seconds(2));
  sender.join();
  EXPECT_EQ(x, 42);
}

}  // namespace
}  // namespace squall
