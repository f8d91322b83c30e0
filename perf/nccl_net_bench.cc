// Throughput of the NCCL plugin's net transport against a raw TCP stream
// between the same two hosts, the way NCCL's proxy uses a connection: 512 KiB
// messages (one SIMPLE-protocol step), 8 in flight per connection, every
// connection driven by one polling thread. The raw baseline is N blocking
// sockets, one thread each, with the same socket buffer size.
//
//   perf/links.sh --rate 1gbit --ranks 2 -- build/plugin/nccl/nccl_net_bench --mode plugin --conns
//   4
//
// Rank 1 sends, rank 0 receives and prints the result. Roles and the control
// channel come from RANK, MASTER_ADDR and MASTER_PORT (set by links.sh).
// Every call is timed as well (isend, irecv and test in plugin mode, send
// and recv in raw mode): count, median, p99, maximum and the calls over
// 0.5 ms per kind, both ranks' in rank 0's JSON line ("calls") and as a
// table on stderr. Without shaping, RANK=0 and RANK=1 on one host over
// 127.0.0.1 measure the calls alone.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "perf/plugin_bench.h"

namespace wire = squall::nccl_abi;
using Clock = std::chrono::steady_clock;

namespace {

using squall::bench::die;
using squall::bench::recvAll;
using squall::bench::sendAll;

sockaddr_in addressOf(const char* host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) die("MASTER_ADDR is not an IPv4 address");
  return a;
}

int listenOn(sockaddr_in a) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("bind");
  if (listen(fd, 16) != 0) die("listen");
  return fd;
}

int connectTo(sockaddr_in a) {
  auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    close(fd);
    if (Clock::now() > deadline) die("connect");
    usleep(20000);
  }
}

void tune(int fd) {
  int one = 1;
  int buf = 4 << 20;  // as SQUALL_SOCKET_BUFFER_BYTES' default
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

struct Options {
  std::string mode = "plugin";
  int conns = 1;
  size_t bytes = size_t{512} << 20;  // per run, split over the connections
  size_t chunk = 512 << 10;
  int inflight = 8;
  const char* plugin = nullptr;
};

// ---- raw TCP ----------------------------------------------------------------

using squall::bench::CallTimes;

// Raw mode times every send() and recv() as plugin mode times the plugin's
// calls: with --chunk set to the plugin's per-call cap (256 KiB) and
// --cpu-times 1, the CPU time of a system call that moves as much as one
// plugin call may, on the same machine: the floor of any design that moves
// the bytes in the caller.
double runRaw(const Options& o, int rank, int control, const char* host, std::string* callsJson) {
  size_t perConn = o.bytes / static_cast<size_t>(o.conns);
  std::vector<int> fds(static_cast<size_t>(o.conns));
  if (rank == 0) {
    for (int c = 0; c < o.conns; ++c) {
      int l = listenOn(addressOf(host, 0));
      sockaddr_in bound{};
      socklen_t len = sizeof(bound);
      getsockname(l, reinterpret_cast<sockaddr*>(&bound), &len);
      uint16_t port = ntohs(bound.sin_port);
      sendAll(control, &port, sizeof(port));
      fds[static_cast<size_t>(c)] = accept(l, nullptr, nullptr);
      close(l);
      tune(fds[static_cast<size_t>(c)]);
    }
  } else {
    for (int c = 0; c < o.conns; ++c) {
      uint16_t port = 0;
      recvAll(control, &port, sizeof(port));
      fds[static_cast<size_t>(c)] = connectTo(addressOf(host, port));
      tune(fds[static_cast<size_t>(c)]);
    }
  }
  char go = 1;
  if (rank == 1)
    recvAll(control, &go, 1);
  else
    sendAll(control, &go, 1);
  auto start = Clock::now();
  std::vector<std::thread> threads;
  std::vector<CallTimes> times(static_cast<size_t>(o.conns));
  threads.reserve(static_cast<size_t>(o.conns));
  for (int c = 0; c < o.conns; ++c) {
    threads.emplace_back([&, c] {
      std::vector<char> buf(o.chunk, 1);
      size_t left = perConn;
      int fd = fds[static_cast<size_t>(c)];
      CallTimes& mine = times[static_cast<size_t>(c)];
      while (left > 0) {
        size_t n = std::min(left, buf.size());
        ssize_t k = mine.time([&] {
          return rank == 1 ? send(fd, buf.data(), n, MSG_NOSIGNAL) : recv(fd, buf.data(), n, 0);
        });
        if (k <= 0) die("raw stream");
        left -= static_cast<size_t>(k);
      }
    });
  }
  for (auto& t : threads) t.join();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int fd : fds) close(fd);
  for (int c = 1; c < o.conns; ++c) times[0].absorb(times[static_cast<size_t>(c)]);
  CallTimes::Summary mine = times[0].summary();
  if (rank == 1) {
    sendAll(control, &mine, sizeof(mine));
  } else {
    CallTimes::Summary theirs;
    recvAll(control, &theirs, sizeof(theirs));
    std::string json;
    squall::bench::callJson(&json, "send", theirs);
    squall::bench::callJson(&json, "recv", mine);
    *callsJson = "{" + json + "}";
    squall::bench::callLine("send", theirs);
    squall::bench::callLine("recv", mine);
  }
  return seconds;
}

// ---- the plugin ----------------------------------------------------------------

// The timed plugin calls, in the order they are reported.
struct Calls {
  CallTimes post;  // isend on rank 1, irecv on rank 0
  CallTimes test;
};

double runPlugin(const Options& o, int rank, int control, std::string* callsJson) {
  Calls calls;
  void* lib = dlopen(o.plugin, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    fprintf(stderr, "nccl_net_bench: dlopen %s: %s\n", o.plugin, dlerror());
    exit(1);
  }
  auto* t = static_cast<wire::NetV12*>(dlsym(lib, "ncclNetPlugin_v12"));
  if (t == nullptr) die("no ncclNetPlugin_v12");
  void* ctx = nullptr;
  wire::CommConfig config{-1};
  SQUALL_BENCH_OK(t->init(&ctx, 1, &config, squall::bench::pluginLogger, nullptr));
  int ndev = 0;
  SQUALL_BENCH_OK(t->devices(&ndev));
  if (ndev < 1) die("the plugin found no device");
  size_t perConn = o.bytes / static_cast<size_t>(o.conns);
  size_t messages = (perConn + o.chunk - 1) / o.chunk;
  std::vector<void*> comms(static_cast<size_t>(o.conns), nullptr);
  // One registered buffer of `inflight` chunks per connection, as NCCL has.
  std::vector<std::vector<char>> buffers(
      static_cast<size_t>(o.conns),
      std::vector<char>(o.chunk * static_cast<size_t>(o.inflight), 1));
  std::vector<void*> mh(static_cast<size_t>(o.conns));
  if (rank == 0) {
    std::vector<void*> listens(static_cast<size_t>(o.conns));
    for (int c = 0; c < o.conns; ++c) {
      char handle[wire::kHandleMaxBytes];
      SQUALL_BENCH_OK(t->listen(ctx, 0, handle, &listens[static_cast<size_t>(c)]));
      sendAll(control, handle, sizeof(handle));
    }
    for (int c = 0; c < o.conns; ++c) {
      wire::NetDeviceHandle* dh = nullptr;
      while (comms[static_cast<size_t>(c)] == nullptr)
        SQUALL_BENCH_OK(
            t->accept(listens[static_cast<size_t>(c)], &comms[static_cast<size_t>(c)], &dh));
      SQUALL_BENCH_OK(t->closeListen(listens[static_cast<size_t>(c)]));
    }
  } else {
    for (int c = 0; c < o.conns; ++c) {
      char handle[wire::kHandleMaxBytes];
      recvAll(control, handle, sizeof(handle));
      wire::NetDeviceHandle* dh = nullptr;
      while (comms[static_cast<size_t>(c)] == nullptr)
        SQUALL_BENCH_OK(t->connect(ctx, 0, handle, &comms[static_cast<size_t>(c)], &dh));
    }
  }
  for (int c = 0; c < o.conns; ++c)
    SQUALL_BENCH_OK(t->regMr(comms[static_cast<size_t>(c)], buffers[static_cast<size_t>(c)].data(),
                             buffers[static_cast<size_t>(c)].size(), wire::kPtrHost,
                             &mh[static_cast<size_t>(c)]));
  char go = 1;
  if (rank == 1)
    recvAll(control, &go, 1);
  else
    sendAll(control, &go, 1);
  auto start = Clock::now();
  struct Conn {
    size_t posted = 0, completed = 0;
    std::vector<void*> reqs;
  };
  std::vector<Conn> conns(static_cast<size_t>(o.conns));
  for (auto& c : conns) c.reqs.assign(static_cast<size_t>(o.inflight), nullptr);
  size_t finished = 0;
  // The proxy's progress loop: post while there is room, test the oldest;
  // a pass that completed nothing yields the CPU, as NCCL's proxy does when
  // idle (on a small machine the spinning would starve the kernel's copies).
  while (finished < static_cast<size_t>(o.conns)) {
    bool progressed = false;
    for (int ci = 0; ci < o.conns; ++ci) {
      Conn& c = conns[static_cast<size_t>(ci)];
      if (c.completed == messages) continue;
      void* comm = comms[static_cast<size_t>(ci)];
      while (c.posted < messages && c.posted - c.completed < static_cast<size_t>(o.inflight)) {
        size_t slot = c.posted % static_cast<size_t>(o.inflight);
        size_t size = std::min(o.chunk, perConn - c.posted * o.chunk);
        void* data = buffers[static_cast<size_t>(ci)].data() + slot * o.chunk;
        void* req = nullptr;
        if (rank == 1) {
          SQUALL_BENCH_OK(calls.post.time([&] {
            return t->isend(comm, data, size, 1, mh[static_cast<size_t>(ci)], nullptr, &req);
          }));
        } else {
          int tag = 1;
          size_t cap = o.chunk;
          void* m = mh[static_cast<size_t>(ci)];
          SQUALL_BENCH_OK(calls.post.time(
              [&] { return t->irecv(comm, 1, &data, &cap, &tag, &m, nullptr, &req); }));
        }
        if (req == nullptr) break;
        c.reqs[slot] = req;
        ++c.posted;
      }
      int done = 0;
      int sizes[8];
      void* oldest = c.reqs[c.completed % static_cast<size_t>(o.inflight)];
      SQUALL_BENCH_OK(calls.test.time([&] { return t->test(oldest, &done, sizes); }));
      if (done) {
        progressed = true;
        if (++c.completed == messages) ++finished;
      }
    }
    if (!progressed) sched_yield();
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int c = 0; c < o.conns; ++c) {
    SQUALL_BENCH_OK(t->deregMr(comms[static_cast<size_t>(c)], mh[static_cast<size_t>(c)]));
    SQUALL_BENCH_OK(rank == 1 ? t->closeSend(comms[static_cast<size_t>(c)])
                              : t->closeRecv(comms[static_cast<size_t>(c)]));
  }
  SQUALL_BENCH_OK(t->finalize(ctx));
  // Rank 1 hands its digests to rank 0, which reports both.
  CallTimes::Summary mine[2] = {calls.post.summary(), calls.test.summary()};
  CallTimes::Summary theirs[2];
  if (rank == 1) {
    sendAll(control, mine, sizeof(mine));
  } else {
    recvAll(control, theirs, sizeof(theirs));
    std::string json;
    squall::bench::callJson(&json, "isend", theirs[0]);
    squall::bench::callJson(&json, "test_send", theirs[1]);
    squall::bench::callJson(&json, "irecv", mine[0]);
    squall::bench::callJson(&json, "test_recv", mine[1]);
    *callsJson = "{" + json + "}";
    squall::bench::callLine("isend", theirs[0]);
    squall::bench::callLine("test (send)", theirs[1]);
    squall::bench::callLine("irecv", mine[0]);
    squall::bench::callLine("test (receive)", mine[1]);
  }
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.plugin = SQUALL_PLUGIN_PATH;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--mode")
      o.mode = argv[i + 1];
    else if (k == "--conns")
      o.conns = atoi(argv[i + 1]);
    else if (k == "--bytes")
      o.bytes = strtoull(argv[i + 1], nullptr, 10) << 20;  // MiB
    else if (k == "--chunk")
      o.chunk = strtoull(argv[i + 1], nullptr, 10) << 10;  // KiB
    else if (k == "--plugin")
      o.plugin = argv[i + 1];
    else if (k == "--cpu-times")
      squall::bench::CallTimes::cpuToo = atoi(argv[i + 1]) != 0;
    else {
      fprintf(stderr,
              "usage: %s [--mode plugin|raw] [--conns N] [--bytes MiB] [--chunk KiB] [--plugin "
              "path] [--cpu-times 0|1]\n",
              argv[0]);
      return 2;
    }
  }
  const char* rankText = getenv("RANK");
  const char* host = getenv("MASTER_ADDR");
  const char* portText = getenv("MASTER_PORT");
  if (rankText == nullptr || host == nullptr || portText == nullptr) {
    fprintf(
        stderr,
        "nccl_net_bench: needs RANK, MASTER_ADDR and MASTER_PORT (run it under perf/links.sh)\n");
    return 2;
  }
  int rank = atoi(rankText);
  int port = atoi(portText);
  int control;
  if (rank == 0) {
    int l = listenOn(addressOf(host, port));
    control = accept(l, nullptr, nullptr);
    close(l);
  } else {
    control = connectTo(addressOf(host, port));
  }
  std::string callsJson;
  double seconds = o.mode == "raw" ? runRaw(o, rank, control, host, &callsJson)
                                   : runPlugin(o, rank, control, &callsJson);
  if (rank == 0) {
    double gbps = static_cast<double>(o.bytes) * 8 / seconds / 1e9;
    const char* plane = getenv("SQUALL_NET_TRANSPORT");
    printf(
        "{\"mode\": \"%s\", \"plane\": \"%s\", \"conns\": %d, \"bytes\": %zu, \"seconds\": "
        "%.3f, \"gbit_s\": %.3f%s%s}\n",
        o.mode.c_str(), o.mode == "raw" ? "raw" : (plane != nullptr ? plane : "auto"), o.conns,
        o.bytes, seconds, gbps, callsJson.empty() ? "" : ", \"calls\": ", callsJson.c_str());
  }
  close(control);
  return 0;
}
