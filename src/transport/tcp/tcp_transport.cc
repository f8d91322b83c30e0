// TCP transport: a full mesh of connections (mesh.h), one Connection per peer
// for framing and matching (connection.h), and one progress thread moving
// their bytes (progress.h).
//
// Concurrency: one mutex guards every connection, including the reads into
// user buffers. Posting threads take it and try to write their send at once,
// so a small message leaves without a thread switch; the progress thread
// takes it for each batch of ready sockets. A waiting thread polls the
// sockets itself for a short while (WaitOptions::spin) before it sleeps:
// a small message's reply usually lands within microseconds, and taking it
// here saves waking the progress thread and then this one, which on a
// loaded machine is most of a small collective's time. Meanwhile the
// progress thread parks the sockets that become ready instead of waking for
// each message to contend for the mutex (progress.h). Destroying a pending request
// takes the same mutex and withdraws it from its connection, so the backend
// never touches a cancelled request's buffer afterwards. Waiters sleep on a
// condition variable that is signalled whenever a request completes.
#include "src/transport/tcp/tcp_transport.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "src/common/params.h"
#include "src/transport/tcp/connection.h"
#include "src/transport/tcp/mesh.h"
#include "src/transport/tcp/progress.h"

namespace squall::transport {
namespace {

using tcp::Connection;
using tcp::ConnectionRequest;

// How long a closing transport waits for its peers to take what it sent.
constexpr auto kLinger = std::chrono::seconds(1);

// What the transport and its requests share; requests keep it alive so a
// request destroyed after its transport still finds the mutex.
struct Core {
  int rank = 0;
  int size = 0;
  std::mutex mutex;
  std::condition_variable activity;
  uint64_t generation = 0;  // requests completed so far, over every connection
  bool closed = false;
  std::vector<std::unique_ptr<Connection>> connections;

  // With `mutex` held: runs `op` on connection p and wakes the waiters when
  // it completed anything.
  template <typename Op>
  void with(int p, Op&& op) {
    Connection& c = *connections[static_cast<size_t>(p)];
    uint64_t before = c.completions();
    op(c);
    if (c.completions() != before) {
      generation += c.completions() - before;
      activity.notify_all();
    }
  }
};

class TcpRequest final : public ConnectionRequest {
 public:
  TcpRequest(std::shared_ptr<Core> core, Kind kind, int peer, const Tag& tag, void* data,
             size_t bytes)
      : ConnectionRequest(kind, peer, tag, data, bytes), core_(std::move(core)) {}
  ~TcpRequest() override {
    if (done()) return;
    std::lock_guard<std::mutex> lock(core_->mutex);
    if (!done() && !core_->closed) core_->connections[static_cast<size_t>(peer())]->cancel(this);
  }

 private:
  std::shared_ptr<Core> core_;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(std::shared_ptr<Core> core, std::chrono::microseconds spin)
      : core_(std::move(core)), spin_(spin) {}

  Status start() {
    std::vector<std::pair<int, uint32_t>> sockets;
    for (int p = 0; p < core_->size; ++p) {
      int fd = core_->connections[static_cast<size_t>(p)]->fd();
      if (fd >= 0) sockets.emplace_back(fd, static_cast<uint32_t>(p));
    }
    return tcp::ProgressThread::start(
        sockets, [this](const uint32_t* ids, int count) { serve(ids, count); }, &progress_);
  }

  ~TcpTransport() override {
    progress_.reset();  // joins the thread
    SQUALL_INFO(Subsys::kTransport,
                "rank %d: tcp waits slept %llu times for %.1f ms in all (%llu ran into the "
                "cap); the progress thread woke %llu times",
                core_->rank, static_cast<unsigned long long>(waits_.sleeps),
                std::chrono::duration<double, std::milli>(waits_.slept).count(),
                static_cast<unsigned long long>(waits_.capped),
                static_cast<unsigned long long>(serves_.load(std::memory_order_relaxed)));
    std::vector<int> fds;
    const Deadline until = Clock::now() + kLinger;
    {
      std::lock_guard<std::mutex> lock(core_->mutex);
      size_t pending = 0;
      for (auto& c : core_->connections) {
        // The peers then know that this end is a shutdown, not a crash.
        c->sayGoodbye(until);
        pending += c->abandon(Status::kInvalidUsage);
        fds.push_back(c->releaseFd());
      }
      if (pending > 0)
        SQUALL_WARN(Subsys::kTransport,
                    "the tcp transport of rank %d was destroyed with %zu requests pending; they "
                    "were failed",
                    core_->rank, pending);
      core_->connections.clear();
      core_->closed = true;
    }
    // A live peer answers our end of stream with its own at once (its
    // progress thread closes the connection), so this rarely waits long.
    tcp::closeGracefully(fds, until);
  }

  int rank() const override { return core_->rank; }
  int size() const override { return core_->size; }
  const char* name() const override { return "tcp"; }

  Status send(int peer, const Tag& tag, const void* data, size_t bytes,
              RequestPtr* request) override {
    return post(ConnectionRequest::Kind::kSend, peer, tag, const_cast<void*>(data), bytes, request);
  }

  Status recv(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) override {
    return post(ConnectionRequest::Kind::kRecv, peer, tag, data, bytes, request);
  }

  Status watch(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) override {
    return post(ConnectionRequest::Kind::kWatch, peer, tag, data, bytes, request);
  }

  Status progress() override { return Status::kOk; }

  Status waitForActivity(Deadline until) override {
    std::unique_lock<std::mutex> lock(core_->mutex);
    if (core_->generation == seen_ && spin_.count() > 0) {
      // Poll from this thread first, while the progress thread stands aside
      // (progress.h). Between polls the lock is dropped and the CPU yielded,
      // so that, on a shared core, the peer this rank waits for can run.
      const Deadline stop = std::min(until, Clock::now() + spin_);
      progress_->hold();
      for (;;) {
        for (int p = 0; p < core_->size; ++p) core_->with(p, [](Connection& c) { c.progress(); });
        if (core_->generation != seen_ || Clock::now() >= stop) break;
        lock.unlock();
        sched_yield();
        lock.lock();
      }
      progress_->release(/*watchNow=*/core_->generation == seen_);
    }
    if (core_->generation == seen_) {
      // The cap bounds the cost of a wakeup missed by a second thread that
      // shares this transport (seen_ is per transport, not per thread).
      const Deadline asleep = Clock::now();
      Deadline cap = std::min(until, asleep + std::chrono::milliseconds(100));
      if (!core_->activity.wait_until(lock, cap, [&] { return core_->generation != seen_; }))
        ++waits_.capped;
      ++waits_.sleeps;
      waits_.slept += Clock::now() - asleep;
    }
    seen_ = core_->generation;
    return Status::kOk;
  }

 private:
  Status post(ConnectionRequest::Kind kind, int peer, const Tag& tag, void* data, size_t bytes,
              RequestPtr* request) {
    const char* op = kind == ConnectionRequest::Kind::kSend ? "send" : "recv";
    SQUALL_REQUIRE(request != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                   "tcp %s was given a null request pointer", op);
    SQUALL_REQUIRE(peer >= 0 && peer < core_->size, Status::kInvalidArgument, Subsys::kTransport,
                   "tcp %s to rank %d, but the ranks are 0..%d", op, peer, core_->size - 1);
    SQUALL_REQUIRE(data != nullptr || bytes == 0, Status::kInvalidArgument, Subsys::kTransport,
                   "tcp %s of %zu bytes was given a null buffer", op, bytes);
    auto r = std::make_unique<TcpRequest>(core_, kind, peer, tag, data, bytes);
    TcpRequest* raw = r.get();
    *request = std::move(r);
    std::lock_guard<std::mutex> lock(core_->mutex);
    core_->with(peer, [&](Connection& c) {
      if (kind == ConnectionRequest::Kind::kSend)
        c.postSend(raw);
      else
        c.postRecv(raw);
    });
    return Status::kOk;
  }

  void serve(const uint32_t* ids, int count) {
    serves_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(core_->mutex);
    for (int i = 0; i < count; ++i)
      core_->with(static_cast<int>(ids[i]), [](Connection& c) { c.progress(); });
  }

  std::shared_ptr<Core> core_;
  std::unique_ptr<tcp::ProgressThread> progress_;
  const std::chrono::microseconds spin_;
  uint64_t seen_ = ~0ull;
  // How the waits went, said at INFO when the transport closes (guarded by
  // core_->mutex; serves_ is the progress thread's).
  struct WaitCounts {
    uint64_t sleeps = 0, capped = 0;
    Clock::duration slept{};
  } waits_;
  std::atomic<uint64_t> serves_{0};
};

}  // namespace

Status createTcpTransport(bootstrap::Bootstrap& boot, std::unique_ptr<Transport>* out,
                          const WaitOptions& wait) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "createTcpTransport was given a null output pointer");
  std::vector<int> fds;
  SQUALL_TRY(tcp::connectMesh(boot, &fds));
  auto core = std::make_shared<Core>();
  core->rank = boot.rank();
  core->size = boot.size();
  for (int p = 0; p < core->size; ++p)
    core->connections.push_back(
        std::make_unique<Connection>(fds[static_cast<size_t>(p)], core->rank, p));
  const int64_t forced = paramInt(Param::kTcpSpinUs);
  const auto spin = forced > 0 ? std::chrono::microseconds(forced) : wait.spin;
  auto transport = std::make_unique<TcpTransport>(std::move(core), spin);
  SQUALL_TRY(transport->start());
  // Every rank has its connections before anyone sends: a rank that failed
  // setup makes this fail instead of leaving the others to time out later.
  SQUALL_TRY(boot.barrier());
  *out = std::move(transport);
  return Status::kOk;
}

Status createTcpTransport(bootstrap::Bootstrap& boot, std::unique_ptr<Transport>* out) {
  return createTcpTransport(boot, out, WaitOptions{});
}

}  // namespace squall::transport
