// Time of the plugin's CollNet iallreduce with the codec in
// SQUALL_COLLNET_CODEC, the way NCCL issues it: a float sum over a staging
// region, cut into --chunk-KiB slices with up to 8 in flight on one collComm.
// Run it once per codec on the same link and compare with `none`.
//
//   SQUALL_COLLNET_CODEC=bf16 perf/links.sh --rate 1gbit --ranks 4 --
//       build/plugin/nccl/nccl_collnet_bench --mib 64      (one line)
//
// Ranks and the control channel come from RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT (set by links.sh); rank 0 prints one JSON line. Every
// iallreduce and test call, warm-up included, is timed too: count, median,
// p99, maximum and the calls over 0.5 ms, rank 0's in the JSON line
// ("calls"), every rank's as a table on stderr.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "perf/plugin_bench.h"

namespace wire = squall::nccl_abi;
using Clock = std::chrono::steady_clock;

namespace {

using squall::bench::die;
using squall::bench::recvAll;
using squall::bench::sendAll;

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 64, chunkKiB = 1024;
  int iters = 3;
  const char* plugin = SQUALL_PLUGIN_PATH;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--mib")
      mib = strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--chunk-kib")
      chunkKiB = strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--iters")
      iters = atoi(argv[i + 1]);
    else if (k == "--plugin")
      plugin = argv[i + 1];
    else if (k == "--cpu-times")
      squall::bench::CallTimes::cpuToo = atoi(argv[i + 1]) != 0;
    else {
      fprintf(stderr,
              "usage: %s [--mib N] [--chunk-kib N] [--iters N] [--plugin path] [--cpu-times 0|1]\n",
              argv[0]);
      return 2;
    }
  }
  const char* rankText = getenv("RANK");
  const char* sizeText = getenv("WORLD_SIZE");
  const char* host = getenv("MASTER_ADDR");
  const char* portText = getenv("MASTER_PORT");
  if (!rankText || !sizeText || !host || !portText) {
    fprintf(stderr,
            "nccl_collnet_bench: needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (use "
            "perf/links.sh)\n");
    return 2;
  }
  int rank = atoi(rankText), nranks = atoi(sizeText);
  sockaddr_in master{};
  master.sin_family = AF_INET;
  master.sin_port = htons(static_cast<uint16_t>(atoi(portText)));
  inet_pton(AF_INET, host, &master.sin_addr);

  void* lib = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    fprintf(stderr, "dlopen %s: %s\n", plugin, dlerror());
    return 1;
  }
  auto* t = static_cast<wire::CollNetV12*>(dlsym(lib, "ncclCollNetPlugin_v12"));
  if (t == nullptr) die("no ncclCollNetPlugin_v12");
  void* ctx = nullptr;
  SQUALL_BENCH_OK(t->init(&ctx, 1, squall::bench::pluginLogger));
  char handle[wire::kHandleMaxBytes];
  void* lc = nullptr;
  SQUALL_BENCH_OK(t->listen(ctx, 0, handle, &lc));
  // All-gather the handles through rank 0, as NCCL's bootstrap would.
  std::vector<char> all(static_cast<size_t>(nranks) * sizeof(handle));
  if (rank == 0) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(l, reinterpret_cast<sockaddr*>(&master), sizeof(master)) != 0 || listen(l, 64) != 0)
      die("control listen");
    std::vector<int> peers;
    memcpy(all.data(), handle, sizeof(handle));
    for (int r = 1; r < nranks; ++r) {
      int fd = accept(l, nullptr, nullptr);
      int who = 0;
      recvAll(fd, &who, sizeof(who));
      recvAll(fd, all.data() + static_cast<size_t>(who) * sizeof(handle), sizeof(handle));
      peers.push_back(fd);
    }
    for (int fd : peers) {
      sendAll(fd, all.data(), all.size());
      close(fd);
    }
    close(l);
  } else {
    int fd = -1;
    auto deadline = Clock::now() + std::chrono::seconds(30);
    for (;;) {
      fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&master), sizeof(master)) == 0) break;
      close(fd);
      if (Clock::now() > deadline) die("control connect");
      usleep(20000);
    }
    sendAll(fd, &rank, sizeof(rank));
    sendAll(fd, handle, sizeof(handle));
    recvAll(fd, all.data(), all.size());
    close(fd);
  }
  std::vector<void*> handles(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r)
    handles[static_cast<size_t>(r)] = all.data() + static_cast<size_t>(r) * sizeof(handle);
  void* comm = nullptr;
  SQUALL_BENCH_OK(t->connect(handles.data(), nranks, rank, lc, &comm));
  SQUALL_BENCH_OK(t->closeListen(lc));

  size_t count = (mib << 20) / sizeof(float);
  size_t chunk = (chunkKiB << 10) / sizeof(float);
  std::vector<float> in(count), out(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((rank + 1) * (1 + i % 7)) * 0.01f;
  squall::bench::CallTimes postTimes, testTimes;
  auto once = [&] {
    std::vector<void*> live;
    size_t next = 0, done = 0;
    size_t ops = (count + chunk - 1) / chunk;
    std::vector<void*> reqs(ops, nullptr);
    while (done < ops) {
      while (next < ops && next - done < 8) {
        size_t off = next * chunk;
        size_t n = std::min(chunk, count - off);
        void* req = nullptr;
        SQUALL_BENCH_OK(postTimes.time([&] {
          return t->iallreduce(comm, in.data() + off, out.data() + off, n, wire::kFloat32,
                               wire::kSum, nullptr, nullptr, &req);
        }));
        if (req == nullptr) break;
        reqs[next++] = req;
      }
      int finished = 0;
      SQUALL_BENCH_OK(testTimes.time([&] { return t->test(reqs[done], &finished, nullptr); }));
      if (finished) ++done;
    }
  };
  once();  // warmup (codec states for each slice size)
  auto start = Clock::now();
  for (int it = 0; it < iters; ++it) once();
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / iters;
  double maxErr = 0;
  double total = nranks * (nranks + 1) / 2.0;
  for (size_t i = 0; i < count; ++i)
    maxErr = std::max(maxErr, std::abs(out[i] - total * (1 + i % 7) * 0.01));
  SQUALL_BENCH_OK(t->closeColl(comm));
  SQUALL_BENCH_OK(t->finalize(ctx));
  fprintf(stderr, "rank %d:\n", rank);
  squall::bench::callLine("iallreduce", postTimes.summary());
  squall::bench::callLine("test", testTimes.summary());
  if (rank == 0) {
    const char* codec = getenv("SQUALL_COLLNET_CODEC");
    std::string calls;
    squall::bench::callJson(&calls, "iallreduce", postTimes.summary());
    squall::bench::callJson(&calls, "test", testTimes.summary());
    printf(
        "{\"codec\": \"%s\", \"ranks\": %d, \"mib\": %zu, \"chunk_kib\": %zu, \"ms\": %.1f, "
        "\"algbw_gbit\": %.3f, \"max_abs_err\": %.3g, \"calls\": {%s}}\n",
        codec ? codec : "none", nranks, mib, chunkKiB, ms,
        static_cast<double>(mib << 20) * 8 / (ms * 1e6), maxErr, calls.c_str());
  }
  return 0;
}
