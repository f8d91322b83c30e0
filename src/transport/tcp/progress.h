// A thread that waits in epoll on a set of sockets and hands the ready ones
// to a callback, so a transport's bytes move while its user computes.
//
// Sockets are watched edge-triggered for reading and writing: the callback
// must move bytes until the socket would block (Connection::progress does).
//
// Standing aside. While a thread of the transport polls the sockets itself
// (hold() .. release()), the progress thread would only wake for every
// message to find the work done and contend for the lock. So a socket that
// becomes ready while someone holds is parked instead of served: unwatched,
// so that its later messages do not wake the thread either. Parked
// sockets are watched again by the thread itself at most kParkedForMs
// later, or at once by a release(true) that leaves nobody holding: one
// before the caller sleeps, so that its wakeup is not late. A caller that
// found what it polled for releases lazily (release(false)): its next wait
// will likely poll again, and the thread stays asleep meanwhile. Watching a
// socket again reports it at once if it is ready, so no event is lost, and
// bytes that arrive while the user computes still move within kParkedForMs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "src/common/status.h"

namespace squall::transport::tcp {

class ProgressThread {
 public:
  // Called on the thread with the ids of the sockets that became ready.
  using Serve = std::function<void(const uint32_t* ids, int count)>;

  // Watches each (fd, id) of `sockets` and starts the thread.
  static Status start(const std::vector<std::pair<int, uint32_t>>& sockets, Serve serve,
                      std::unique_ptr<ProgressThread>* out);
  // Stops the thread and joins it; `serve` is not called afterwards.
  ~ProgressThread();
  // A thread of the transport polls the sockets itself from hold() to
  // release(); calls nest and may come from several threads.
  void hold() { holders_.fetch_add(1); }
  void release(bool watchNow);
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

 private:
  ProgressThread(int epoll, int wake, std::vector<std::pair<int, uint32_t>> sockets, Serve serve);
  void loop();
  void watch(size_t slot, uint32_t events);
  void park(size_t slot);
  void watchParked();

  int epoll_;
  int wake_;                                             // an eventfd whose readiness means "stop"
  const std::vector<std::pair<int, uint32_t>> sockets_;  // (fd, id); epoll data is the slot
  std::unique_ptr<std::atomic<bool>[]> parked_;          // per slot
  std::atomic<int> holders_{0};
  std::atomic<bool> anyParked_{false};
  Serve serve_;
  std::thread thread_;
};

}  // namespace squall::transport::tcp
