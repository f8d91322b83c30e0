#include "src/transport/tcp/progress.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace squall::transport::tcp {
namespace {
constexpr uint64_t kWakeId = ~uint64_t{0};  // slots are small, so this is never a socket's
constexpr uint32_t kSocketEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
// A parked socket: nothing asked for (errors and hang-ups, which epoll
// always reports, reported once).
constexpr uint32_t kParkedEvents = EPOLLET;
// The longest a parked socket waits to be watched again (see progress.h).
constexpr int kParkedForMs = 1;
}  // namespace

Status ProgressThread::start(const std::vector<std::pair<int, uint32_t>>& sockets, Serve serve,
                             std::unique_ptr<ProgressThread>* out) {
  int epoll = epoll_create1(EPOLL_CLOEXEC);
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll < 0 || wake < 0) {
    int err = errno;
    if (epoll >= 0) close(epoll);
    if (wake >= 0) close(wake);
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "cannot create the tcp progress thread's epoll set: %s", std::strerror(err));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  int rc = epoll_ctl(epoll, EPOLL_CTL_ADD, wake, &ev);
  for (size_t slot = 0; slot < sockets.size() && rc == 0; ++slot) {
    ev.events = kSocketEvents;
    ev.data.u64 = slot;
    rc = epoll_ctl(epoll, EPOLL_CTL_ADD, sockets[slot].first, &ev);
  }
  if (rc != 0) {
    int err = errno;
    close(epoll);
    close(wake);
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "cannot watch the tcp transport's sockets with epoll: %s",
                       std::strerror(err));
  }
  out->reset(new ProgressThread(epoll, wake, sockets, std::move(serve)));
  return Status::kOk;
}

ProgressThread::ProgressThread(int epoll, int wake, std::vector<std::pair<int, uint32_t>> sockets,
                               Serve serve)
    : epoll_(epoll),
      wake_(wake),
      sockets_(std::move(sockets)),
      parked_(new std::atomic<bool>[sockets_.size()]),
      serve_(std::move(serve)) {
  for (size_t slot = 0; slot < sockets_.size(); ++slot) parked_[slot] = false;
  thread_ = std::thread([this] { loop(); });
}

void ProgressThread::release(bool watchNow) {
  if (holders_.fetch_sub(1) == 1 && watchNow && anyParked_.load()) watchParked();
}

void ProgressThread::watch(size_t slot, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = slot;
  // Fails only when the socket is gone, which the transport finds itself.
  (void)epoll_ctl(epoll_, EPOLL_CTL_MOD, sockets_[slot].first, &ev);
}

// Stops watching a socket until watchParked(). The socket is unwatched
// before it is marked: a watchParked() that takes the mark watches it after.
void ProgressThread::park(size_t slot) {
  if (parked_[slot].load()) return;
  watch(slot, kParkedEvents);
  parked_[slot].store(true);
  anyParked_.store(true);
}

// Watches every parked socket again; any thread may call it, and two at once
// watch a socket at most twice, which is harmless.
void ProgressThread::watchParked() {
  anyParked_.store(false);
  for (size_t slot = 0; slot < sockets_.size(); ++slot)
    if (parked_[slot].exchange(false)) watch(slot, kSocketEvents);  // reports it if ready
}

ProgressThread::~ProgressThread() {
  uint64_t one = 1;
  ssize_t ignored = write(wake_, &one, sizeof(one));
  (void)ignored;
  thread_.join();
  close(epoll_);
  close(wake_);
}

void ProgressThread::loop() {
  epoll_event events[64];
  uint32_t ids[64];
  for (;;) {
    int n = epoll_wait(epoll_, events, 64, anyParked_.load() ? kParkedForMs : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      SQUALL_WARN(Subsys::kTransport, "epoll_wait failed: %s; the tcp progress thread stops",
                  std::strerror(errno));
      return;
    }
    if (n == 0) {  // the parked sockets' time is up
      watchParked();
      continue;
    }
    int count = 0;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kWakeId) return;  // shutting down
      const auto slot = static_cast<size_t>(events[i].data.u64);
      if (holders_.load() > 0) {
        park(slot);
        // A release(true) that came before park() saw nothing parked.
        if (holders_.load() == 0) watchParked();
        continue;
      }
      ids[count++] = sockets_[slot].second;
    }
    if (count > 0) serve_(ids, count);
  }
}

}  // namespace squall::transport::tcp
