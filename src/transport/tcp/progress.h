// A thread that waits in epoll on a set of sockets and hands the ready ones
// to a callback, so a transport's bytes move while its user computes.
//
// Sockets are watched edge-triggered for reading and writing: the callback
// must move bytes until the socket would block (Connection::progress does).
#pragma once

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
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

 private:
  ProgressThread(int epoll, int wake, Serve serve);
  void loop();

  int epoll_;
  int wake_;  // an eventfd whose readiness means "stop"
  Serve serve_;
  std::thread thread_;
};

}  // namespace squall::transport::tcp
