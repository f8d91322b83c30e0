// What a peer can make a rank hold (docs/protocol.md, "Limits"): a fake peer
// speaks the TCP framing over one end of a socket pair to a Connection on the
// other, and sends over-long, flooding and malformed frames; a UCX peer
// sends a message far larger than the receive that matches it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/transport/message_header.h"
#include "src/transport/tcp/connection.h"
#include "src/transport/tcp/tcp_transport.h"
#include "tests/unit/bootstrap_doubles.h"
#ifdef SQUALL_HAVE_UCX
#include "src/transport/ucx/ucx_transport.h"
#endif

namespace squall::transport {
namespace {

using namespace std::chrono_literals;
using tcp::Connection;
using tcp::ConnectionRequest;
using tcp::UnexpectedLimits;

Tag tagOf(uint64_t sequence, uint32_t step) {
  Tag tag;
  tag.sequence = sequence;
  tag.step = step;
  tag.descriptor.kind = CollKind::kAllGather;
  return tag;
}

// Rank 0's Connection to a fake rank 1 that writes raw bytes into the pair.
class FakePeer : public ::testing::Test {
 protected:
  void open(UnexpectedLimits limits) {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    ASSERT_EQ(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
    conn_ = std::make_unique<Connection>(fds[0], 0, 1, limits);
    peer_ = fds[1];
  }
  void TearDown() override {
    if (writer_.joinable()) writer_.join();
    if (peer_ >= 0) close(peer_);
    if (conn_ != nullptr) conn_->abandon(Status::kInvalidUsage);
  }
  // Writes on a thread so the Connection can read while a large frame goes.
  void write(std::vector<uint8_t> bytes) {
    if (writer_.joinable()) writer_.join();
    writer_ = std::thread([this, bytes = std::move(bytes)] {
      size_t done = 0;
      while (done < bytes.size()) {
        ssize_t n = send(peer_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
        if (n <= 0) return;  // the connection closed us: expected in some tests
        done += static_cast<size_t>(n);
      }
    });
  }
  static void frame(std::vector<uint8_t>* out, const Tag& tag, uint64_t announced, size_t payload,
                    uint8_t fill = 0x5a) {
    uint8_t header[kMessageHeaderBytes];
    encodeMessageHeader(tag, announced, header);
    out->insert(out->end(), header, header + kMessageHeaderBytes);
    out->insert(out->end(), payload, fill);
  }
  // Runs progress() until `done` or 10 s.
  bool pump(const std::function<bool()>& done) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!done()) {
      if (std::chrono::steady_clock::now() > until) return false;
      conn_->progress();
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }
  // The failure a receive posted now meets (the connection's description).
  std::string failureText() {
    uint8_t byte;
    ConnectionRequest r(ConnectionRequest::Kind::kRecv, 1, tagOf(999, 0), &byte, 1);
    conn_->postRecv(&r);
    EXPECT_TRUE(r.done());
    EXPECT_NE(r.status(), Status::kOk);
    return r.error();
  }

  std::unique_ptr<Connection> conn_;
  int peer_ = -1;
  std::thread writer_;
};

// A header announcing 256 MiB followed by 1 MiB: the buffer follows the
// bytes that came, not the announcement (it was resized to 256 MiB at once).
TEST_F(FakePeer, UnexpectedBufferGrowsWithArrivingBytes) {
  open(UnexpectedLimits{});
  std::vector<uint8_t> bytes;
  frame(&bytes, tagOf(1, 0), uint64_t{256} << 20, size_t{1} << 20);
  write(std::move(bytes));
  ASSERT_TRUE(pump([&] {
    return conn_->unexpectedMessages() == 1 && conn_->unexpectedBytesHeld() >= (size_t{1} << 20);
  }));
  std::this_thread::sleep_for(50ms);
  conn_->progress();
  EXPECT_FALSE(conn_->failed());
  EXPECT_LE(conn_->unexpectedBytesHeld(), size_t{2} << 20);
}

// Buffered frames under the limits arrive intact once their receive comes.
TEST_F(FakePeer, UnexpectedFramesUnderTheLimitsAreDelivered) {
  open(UnexpectedLimits{});
  std::vector<uint8_t> bytes;
  const size_t big = 300000;  // several growth steps
  frame(&bytes, tagOf(1, 0), big, big, 0x11);
  frame(&bytes, tagOf(1, 1), 0, 0);
  write(std::move(bytes));
  ASSERT_TRUE(pump([&] { return conn_->unexpectedMessages() == 2; }));
  std::vector<uint8_t> got(big);
  ConnectionRequest r(ConnectionRequest::Kind::kRecv, 1, tagOf(1, 0), got.data(), big);
  conn_->postRecv(&r);
  ASSERT_TRUE(pump([&] { return r.done(); }));
  EXPECT_EQ(r.status(), Status::kOk) << r.error();
  EXPECT_EQ(got.front(), 0x11);
  EXPECT_EQ(got.back(), 0x11);
  ConnectionRequest empty(ConnectionRequest::Kind::kRecv, 1, tagOf(1, 1), nullptr, 0);
  conn_->postRecv(&empty);
  EXPECT_TRUE(empty.done());
  EXPECT_EQ(empty.status(), Status::kOk);
  EXPECT_EQ(conn_->unexpectedMessages(), 0u);
}

// A frame over the per-message cap is not buffered and does not fail the
// peer: it waits in the socket (the frames behind it too) until its receive
// is posted, then lands in the receive's buffer; the stream goes on after it.
TEST_F(FakePeer, OverLongUnexpectedFrameIsHeldUntilItsReceive) {
  UnexpectedLimits limits;
  limits.messageBytes = 1 << 16;
  open(limits);
  std::vector<uint8_t> bytes;
  const size_t big = size_t{1} << 20;
  frame(&bytes, tagOf(1, 0), big, big, 0x22);
  frame(&bytes, tagOf(1, 1), 8, 8, 0x33);
  write(std::move(bytes));
  std::this_thread::sleep_for(100ms);
  for (int i = 0; i < 20; ++i) conn_->progress();
  EXPECT_FALSE(conn_->failed()) << failureText();
  EXPECT_EQ(conn_->unexpectedMessages(), 0u);
  EXPECT_EQ(conn_->unexpectedBytesHeld(), 0u);
  std::vector<uint8_t> got(big, 0);
  ConnectionRequest r(ConnectionRequest::Kind::kRecv, 1, tagOf(1, 0), got.data(), big);
  conn_->postRecv(&r);
  ASSERT_TRUE(pump([&] { return r.done(); }));
  EXPECT_EQ(r.status(), Status::kOk) << r.error();
  EXPECT_EQ(got.front(), 0x22);
  EXPECT_EQ(got.back(), 0x22);
  ASSERT_TRUE(pump([&] { return conn_->unexpectedMessages() == 1; }));
  uint8_t small[8] = {};
  ConnectionRequest s(ConnectionRequest::Kind::kRecv, 1, tagOf(1, 1), small, sizeof(small));
  conn_->postRecv(&s);
  EXPECT_TRUE(s.done());
  EXPECT_EQ(small[7], 0x33);
}

// A header announcing 2^39 bytes costs no allocation: the frame is held, and
// the connection stays up.
TEST_F(FakePeer, HugeAnnouncedFrameAllocatesNothing) {
  open(UnexpectedLimits{});
  std::vector<uint8_t> bytes;
  frame(&bytes, tagOf(1, 0), uint64_t{1} << 39, 0);
  write(std::move(bytes));
  std::this_thread::sleep_for(100ms);
  for (int i = 0; i < 20; ++i) conn_->progress();
  EXPECT_FALSE(conn_->failed()) << failureText();
  EXPECT_EQ(conn_->unexpectedBytesHeld(), 0u);
}

// 200,000 empty unexpected frames: the peer is failed at the count cap
// instead of all of them being kept until destroy.
TEST_F(FakePeer, FloodOfEmptyFramesFailsThePeer) {
  open(UnexpectedLimits{});
  std::vector<uint8_t> bytes;
  for (uint32_t i = 0; i < 200000; ++i) frame(&bytes, tagOf(2, i), 0, 0);
  write(std::move(bytes));
  ASSERT_TRUE(pump([&] { return conn_->failed(); }))
      << conn_->unexpectedMessages() << " empty frames kept";
  EXPECT_LE(conn_->unexpectedMessages(), UnexpectedLimits{}.messages);
  const std::string why = failureText();
  EXPECT_NE(why.find("SQUALL_UNEXPECTED_MAX_MESSAGES=65536"), std::string::npos) << why;
  EXPECT_NE(why.find("rank 1 sent"), std::string::npos) << why;
}

// The total over every buffered frame of a peer is bounded too: the frame
// that would pass it is held until a receive frees room, then buffered.
TEST_F(FakePeer, TotalUnexpectedBytesAreBounded) {
  UnexpectedLimits limits;
  limits.totalBytes = 1 << 20;
  open(limits);
  std::vector<uint8_t> bytes;
  for (uint32_t i = 0; i < 3; ++i)
    frame(&bytes, tagOf(3, i), 400000, 400000, static_cast<uint8_t>(0x40 + i));
  write(std::move(bytes));
  ASSERT_TRUE(pump([&] { return conn_->unexpectedMessages() == 2; }));
  std::this_thread::sleep_for(50ms);
  for (int i = 0; i < 20; ++i) conn_->progress();
  EXPECT_FALSE(conn_->failed()) << failureText();
  EXPECT_EQ(conn_->unexpectedMessages(), 2u);
  EXPECT_LE(conn_->unexpectedBytesHeld(), size_t{1} << 20);
  std::vector<uint8_t> got(400000);
  ConnectionRequest r(ConnectionRequest::Kind::kRecv, 1, tagOf(3, 0), got.data(), got.size());
  conn_->postRecv(&r);
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.status(), Status::kOk) << r.error();
  // The first frame's room takes the third.
  ASSERT_TRUE(pump([&] { return conn_->unexpectedMessages() == 2 && !conn_->failed(); }));
  ConnectionRequest third(ConnectionRequest::Kind::kRecv, 1, tagOf(3, 2), got.data(), got.size());
  conn_->postRecv(&third);
  ASSERT_TRUE(pump([&] { return third.done(); }));
  EXPECT_EQ(third.status(), Status::kOk) << third.error();
  EXPECT_EQ(got.back(), 0x42);
}

// A malformed header (wrong magic) closes the connection, naming the peer;
// so does a frame over the hard 2^40 bound that matches a posted receive.
TEST_F(FakePeer, MalformedHeaderFailsThePeer) {
  open(UnexpectedLimits{});
  std::vector<uint8_t> bytes(kMessageHeaderBytes, 0xee);
  write(std::move(bytes));
  ASSERT_TRUE(pump([&] { return conn_->failed(); }));
  const std::string why = failureText();
  EXPECT_NE(why.find("rank 1 sent a malformed frame header"), std::string::npos) << why;
}

TEST_F(FakePeer, FrameLongerThanItsPostedReceiveIsAMismatchNotABuffer) {
  open(UnexpectedLimits{});
  uint8_t got[16];
  ConnectionRequest r(ConnectionRequest::Kind::kRecv, 1, tagOf(4, 0), got, sizeof(got));
  conn_->postRecv(&r);
  std::vector<uint8_t> bytes;
  frame(&bytes, tagOf(4, 0), 1 << 20, 1 << 20);
  frame(&bytes, tagOf(4, 1), 8, 8);
  write(std::move(bytes));
  ASSERT_TRUE(pump([&] { return r.done(); }));
  EXPECT_EQ(r.status(), Status::kInvalidUsage);
  // The stream stays in step: the next frame is buffered normally.
  ASSERT_TRUE(pump([&] { return conn_->unexpectedMessages() == 1; }));
  EXPECT_FALSE(conn_->failed());
  EXPECT_LE(conn_->unexpectedBytesHeld(), size_t{1} << 16);
}

// Two ranks as threads over the transport `create` makes: rank 0 sends
// `sent` on one tag, rank 1 posts a receive of `got` after `delay`; each
// waits until its deadline. Returns each rank's status and error.
struct PairResult {
  Status status[2] = {Status::kInternal, Status::kInternal};
  std::string error[2];
};
using CreateTransport = Status (*)(bootstrap::Bootstrap&, std::unique_ptr<Transport>*);
PairResult sendOnce(CreateTransport create, const std::vector<uint8_t>& sent,
                    std::vector<uint8_t>* got, std::chrono::milliseconds delay,
                    std::chrono::seconds senderWait) {
  testing::ThreadBootstrapGroup group(2);
  PairResult result;
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      testing::ThreadBootstrap boot(&group, r);
      std::unique_ptr<Transport> t;
      if (create(boot, &t) != Status::kOk) {
        result.error[r] = lastError();
        boot.barrier();
        return;
      }
      RequestPtr request;
      if (r == 0) {
        result.status[r] = t->send(1, tagOf(6, 0), sent.data(), sent.size(), &request);
      } else {
        std::this_thread::sleep_for(delay);
        result.status[r] = t->recv(0, tagOf(6, 0), got->data(), got->size(), &request);
      }
      RequestPtr requests[] = {std::move(request)};
      if (result.status[r] == Status::kOk)
        result.status[r] = t->waitAll(requests, Clock::now() + (r == 1 ? 20s : senderWait));
      result.error[r] = lastError();
      boot.barrier();
    });
  for (auto& t : threads) t.join();
  return result;
}

// End to end over the tcp transport: a message 16 times the per-message
// cap, sent while its receiver is still busy elsewhere for 300 ms, arrives
// whole once the receive is posted (a collective's whole-buffer message must
// not fail a job whose ranks run a little apart).
TEST(TcpLimits, LateReceiverOfAMessageOverTheCapGetsIt) {
  setenv("SQUALL_UNEXPECTED_MESSAGE_MAX_BYTES", "65536", 1);
  const std::vector<uint8_t> big(size_t{1} << 20, 0x6b);
  std::vector<uint8_t> got(big.size(), 0);
  const PairResult r = sendOnce(createTcpTransport, big, &got, 300ms, 20s);
  unsetenv("SQUALL_UNEXPECTED_MESSAGE_MAX_BYTES");
  EXPECT_EQ(r.status[0], Status::kOk) << r.error[0];
  EXPECT_EQ(r.status[1], Status::kOk) << r.error[1];
  EXPECT_EQ(got.front(), 0x6b);
  EXPECT_EQ(got.back(), 0x6b);
}

#ifdef SQUALL_HAVE_UCX
// A UCX message far larger than the receive it matches is not taken whole
// into a bounce buffer sized by the sender: the peer is failed by name.
TEST(UcxLimits, OversizedMismatchedMessageFailsThePeer) {
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("SQUALL_UNEXPECTED_MESSAGE_MAX_BYTES", "65536", 1);
  const std::vector<uint8_t> big(size_t{1} << 20, 7);
  std::vector<uint8_t> small(16);
  const PairResult r = sendOnce(createUcxTransport, big, &small, 0ms, 5s);
  unsetenv("SQUALL_UNEXPECTED_MESSAGE_MAX_BYTES");
  EXPECT_EQ(r.status[1], Status::kRemoteError) << r.error[1];
  EXPECT_NE(r.error[1].find("SQUALL_UNEXPECTED_MESSAGE_MAX_BYTES=65536"), std::string::npos)
      << r.error[1];
  EXPECT_NE(r.error[1].find("rank 0 sent a 1048576-byte UCX message"), std::string::npos)
      << r.error[1];
}
#endif

}  // namespace
}  // namespace squall::transport
