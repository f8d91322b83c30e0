// Ranks as threads for the collective tests, over the local transport or a
// real one (tcp, ucx) on loopback.
//
// The collective suites are parameterised over Wire: a fixture derived from
// WireTest runs every test once per wire it is instantiated for, and every
// Group a test builds uses that wire. Over tcp and ucx each rank has its own
// bootstrap (all from one unique id) and its own transport, exactly as in a
// job whose ranks are processes.
#pragma once

#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.h"
#include "src/coll/communicator.h"
#include "src/transport/local/local_transport.h"
#include "src/transport/tcp/tcp_transport.h"
#ifdef SQUALL_HAVE_UCX
#include "src/transport/ucx/ucx_transport.h"
#endif

namespace squall::testing {

enum class Wire { kLocal, kTcp, kUcx };

inline const char* wireName(Wire wire) {
  switch (wire) {
    case Wire::kLocal: return "local";
    case Wire::kTcp: return "tcp";
    case Wire::kUcx: return "ucx";
  }
  return "?";
}

// The wire of the running test (set by WireTest).
inline Wire& currentWire() {
  static Wire wire = Wire::kLocal;
  return wire;
}

// The wires this build can run: ucx only where it was found.
inline std::vector<Wire> allWires() {
#ifdef SQUALL_HAVE_UCX
  return {Wire::kLocal, Wire::kTcp, Wire::kUcx};
#else
  return {Wire::kLocal, Wire::kTcp};
#endif
}

class WireTest : public ::testing::TestWithParam<Wire> {
 protected:
  void SetUp() override {
    currentWire() = GetParam();
    if (GetParam() != Wire::kLocal) {
      setenv("SQUALL_SOCKET_IFNAME", "lo", 1);
      setenv("UCX_NET_DEVICES", "lo", 0);
    }
  }
  void TearDown() override { currentWire() = Wire::kLocal; }
  Wire wire() const { return GetParam(); }
};

inline std::string wireCaseName(const ::testing::TestParamInfo<Wire>& info) {
  return wireName(info.param);
}

inline coll::Options testOptions() {
  coll::Options options = coll::Options::fromEnvironment();
  options.timeout = std::chrono::seconds(30);
  return options;
}

class Group {
 public:
  explicit Group(int n, coll::Options options = testOptions(), Wire wire = currentWire())
      : wire_(wire) {
    if (wire == Wire::kLocal) {
      EXPECT_EQ(transport::createLocalTransports(n, &transports_), Status::kOk);
    } else {
      connect(n);
    }
    for (auto& t : transports_) {
      if (t == nullptr) return;  // setup failed (reported); comms_ stays short
      comms_.push_back(std::make_unique<coll::Communicator>(t.get(), options));
    }
  }
  ~Group() {
    comms_.clear();  // joins the workers before the transports go
    if (wire_ == Wire::kLocal) return;
    // Real transports go down together, after a barrier, so none closes while
    // a peer still flushes to it.
    std::vector<std::thread> threads;
    for (size_t r = 0; r < transports_.size(); ++r)
      threads.emplace_back([this, r] {
        if (boots_[r] != nullptr) boots_[r]->barrier();
        transports_[r].reset();
        boots_[r].reset();
      });
    for (std::thread& t : threads) t.join();
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
  void connect(int n) {
    bootstrap::UniqueId id;
    ASSERT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
    transports_.resize(static_cast<size_t>(n));
    boots_.resize(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        auto& boot = boots_[static_cast<size_t>(r)];
        ASSERT_EQ(bootstrap::Bootstrap::create(id, n, r, std::chrono::seconds(30), &boot),
                  Status::kOk)
            << lastError();
        Status st = Status::kUnsupported;
        if (wire_ == Wire::kTcp) st = transport::createTcpTransport(*boot, &transports_[r]);
#ifdef SQUALL_HAVE_UCX
        if (wire_ == Wire::kUcx) st = transport::createUcxTransport(*boot, &transports_[r]);
#endif
        EXPECT_EQ(st, Status::kOk) << wireName(wire_) << ": " << lastError();
      });
    for (std::thread& t : threads) t.join();
  }

  Wire wire_;
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> boots_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<std::unique_ptr<coll::Communicator>> comms_;
};

}  // namespace squall::testing
