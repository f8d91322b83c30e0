// Ranks as threads over the local transport, for the collective tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "src/coll/communicator.h"
#include "src/transport/local/local_transport.h"

namespace squall::testing {

inline coll::Options testOptions() {
  coll::Options options = coll::Options::fromEnvironment();
  options.timeout = std::chrono::seconds(30);
  return options;
}

class Group {
 public:
  explicit Group(int n, coll::Options options = testOptions()) {
    EXPECT_EQ(transport::createLocalTransports(n, &transports_), Status::kOk);
    for (auto& t : transports_)
      comms_.push_back(std::make_unique<coll::Communicator>(t.get(), options));
  }
  ~Group() {
    comms_.clear();  // joins the workers before the transports go
  }

  int size() const { return static_cast<int>(comms_.size()); }
  coll::Communicator& comm(int r) { return *comms_[static_cast<size_t>(r)]; }

  // Runs fn(communicator, rank) on one thread per rank and joins them.
  template <typename F>
  void run(F&& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back([&, r] { fn(comm(r), r); });
    for (std::thread& t : threads) t.join();
  }

 private:
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<std::unique_ptr<coll::Communicator>> comms_;
};

}  // namespace squall::testing
