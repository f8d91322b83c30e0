#include "src/transport/tcp/progress.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace squall::transport::tcp {
namespace {
constexpr uint64_t kWakeId = ~uint64_t{0};  // ids are 32-bit, so this is never a socket's
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
  for (auto [fd, id] : sockets) {
    if (rc != 0) break;
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = id;
    rc = epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ev);
  }
  if (rc != 0) {
    int err = errno;
    close(epoll);
    close(wake);
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "cannot watch the tcp transport's sockets with epoll: %s",
                       std::strerror(err));
  }
  out->reset(new ProgressThread(epoll, wake, std::move(serve)));
  return Status::kOk;
}

ProgressThread::ProgressThread(int epoll, int wake, Serve serve)
    : epoll_(epoll), wake_(wake), serve_(std::move(serve)) {
  thread_ = std::thread([this] { loop(); });
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
    int n = epoll_wait(epoll_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      SQUALL_WARN(Subsys::kTransport, "epoll_wait failed: %s; the tcp progress thread stops",
                  std::strerror(errno));
      return;
    }
    int count = 0;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kWakeId) return;  // shutting down
      ids[count++] = static_cast<uint32_t>(events[i].data.u64);
    }
    serve_(ids, count);
  }
}

}  // namespace squall::transport::tcp
