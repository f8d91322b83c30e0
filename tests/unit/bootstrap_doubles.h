// Test doubles of bootstrap::Bootstrap, so transport tests do not depend on
// the real (TCP) bootstrap.
//
// ThreadBootstrap: ranks are threads of one process sharing a buffer and a
// barrier. ForkBootstrap: ranks are forked processes, each with a socketpair
// to the parent, which relays every allGather round (ForkHub::serve) and
// stops when any child closes its socket (exits or dies).
#pragma once

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "src/bootstrap/bootstrap.h"

namespace squall::testing {

class ThreadBootstrapGroup {
 public:
  explicit ThreadBootstrapGroup(int size) : size_(size), barrier_(size) {}
  int size() const { return size_; }

 private:
  friend class ThreadBootstrap;
  int size_;
  std::barrier<> barrier_;
  std::vector<uint8_t> buffer_;
};

class ThreadBootstrap final : public bootstrap::Bootstrap {
 public:
  ThreadBootstrap(ThreadBootstrapGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  Status allGather(const void* mine, size_t bytes, void* all) override {
    if (rank_ == 0) group_->buffer_.assign(bytes * size(), 0);
    group_->barrier_.arrive_and_wait();
    if (bytes > 0) std::memcpy(group_->buffer_.data() + bytes * rank_, mine, bytes);
    group_->barrier_.arrive_and_wait();
    if (bytes > 0) std::memcpy(all, group_->buffer_.data(), bytes * size());
    group_->barrier_.arrive_and_wait();
    return Status::kOk;
  }
  Status barrier() override {
    group_->barrier_.arrive_and_wait();
    return Status::kOk;
  }

 private:
  ThreadBootstrapGroup* group_;
  int rank_;
};

inline bool readAll(int fd, void* data, size_t bytes) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = ::read(fd, p, bytes);
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

inline bool writeAll(int fd, const void* data, size_t bytes) {
  auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// The child side: one socket to the parent.
class ForkBootstrap final : public bootstrap::Bootstrap {
 public:
  ForkBootstrap(int fd, int rank, int size) : fd_(fd), rank_(rank), size_(size) {}
  ~ForkBootstrap() override { ::close(fd_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status allGather(const void* mine, size_t bytes, void* all) override {
    uint64_t length = bytes;
    if (!writeAll(fd_, &length, sizeof(length)) || !writeAll(fd_, mine, bytes) ||
        !readAll(fd_, all, bytes * size_))
      return SQUALL_FAIL(Status::kRemoteError, Subsys::kBootstrap,
                         "test bootstrap: the parent or a sibling went away");
    return Status::kOk;
  }
  Status barrier() override {
    uint8_t none = 0;
    std::vector<uint8_t> all(size_);
    return allGather(&none, 1, all.data());
  }

 private:
  int fd_;
  int rank_;
  int size_;
};

// Forks `size` children running body(bootstrap) and exiting with its result
// (0 = pass), relays their allGathers, and returns each child's exit status
// as waitpid reports it.
template <typename Body>
std::vector<int> runForked(int size, Body body) {
  std::vector<int> parentEnds(size);
  std::vector<pid_t> pids(size);
  for (int r = 0; r < size; ++r) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
    pid_t pid = ::fork();
    if (pid == 0) {
      for (int i = 0; i < r; ++i) ::close(parentEnds[i]);
      ::close(fds[0]);
      int code;
      {
        ForkBootstrap bootstrap(fds[1], r, size);
        code = body(bootstrap);
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    ::close(fds[1]);
    parentEnds[r] = fds[0];
    pids[r] = pid;
  }
  // Relay rounds until a child goes away.
  for (bool running = true; running;) {
    std::vector<uint8_t> all;
    uint64_t width = 0;
    for (int r = 0; r < size && running; ++r) {
      uint64_t length;
      if (!readAll(parentEnds[r], &length, sizeof(length))) {
        running = false;
        break;
      }
      if (r == 0) {
        width = length;
        all.resize(width * size);
      }
      if (length != width || !readAll(parentEnds[r], all.data() + r * width, width))
        running = false;
    }
    for (int r = 0; r < size && running; ++r)
      if (!writeAll(parentEnds[r], all.data(), all.size())) running = false;
  }
  for (int fd : parentEnds) ::close(fd);
  std::vector<int> statuses(size);
  for (int r = 0; r < size; ++r) ::waitpid(pids[r], &statuses[r], 0);
  return statuses;
}

}  // namespace squall::testing
