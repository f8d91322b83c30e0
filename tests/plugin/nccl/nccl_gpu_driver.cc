// Real NCCL loading libnccl-net-squall.so on one GPU: N processes share the
// GPU, each its own "node" (a distinct NCCL_HOSTID, NCCL_MNNVL_ENABLE=0), so
// NCCL can only reach the others through the network plugin. Each rank runs
// ncclAllReduce (sum, fp32) and checks the result exactly, then times it.
//
//   nccl_plugin_gpu_test --plugin build/plugin/nccl/libnccl-net-squall.so
//       --ranks 2 --net squall|socket [--collnet] [--mib 16] [--iters 10] --logs DIR
//
// --net squall sets NCCL_NET_PLUGIN to the plugin and NCCL_NET=squall;
// --net socket runs NCCL's built-in Socket network (NCCL_NET_PLUGIN=none) as
// the baseline. --collnet adds NCCL_COLLNET_ENABLE=1 NCCL_ALGO=CollNetChain.
// NCCL_DEBUG=INFO goes to DIR/<tag>.rank<r>.log; run.sh greps those. Exit 0
// when every rank's results were right; prints one line per rank and a
// summary line "RESULT net=... ranks=... ms=...".
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string plugin;
  std::string net = "squall";
  std::string logs = "/tmp";
  bool collnet = false;
  int ranks = 2;
  size_t mib = 16;
  int iters = 10;
  int timeoutS = 90;
};

#define CUDA_OK(x)                                                            \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #x, cudaGetErrorString(e_)); \
      _exit(3);                                                               \
    }                                                                         \
  } while (0)
#define NCCL_OK(x)                                                                \
  do {                                                                            \
    ncclResult_t r_ = (x);                                                        \
    if (r_ != ncclSuccess) {                                                      \
      fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, #x, ncclGetErrorString(r_), \
              ncclGetLastError(nullptr));                                         \
      _exit(4);                                                                   \
    }                                                                             \
  } while (0)

std::string tagOf(const Options& o) {
  return o.net + (o.collnet ? "-collnet" : "") + "-n" + std::to_string(o.ranks);
}

void setRankEnvironment(const Options& o, int rank) {
  std::string host = "squall-gpu-node-" + std::to_string(rank);
  setenv("NCCL_HOSTID", host.c_str(), 1);
  setenv("NCCL_MNNVL_ENABLE", "0", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,NET,COLL,TUNING", 1);
  std::string log = o.logs + "/" + tagOf(o) + ".rank" + std::to_string(rank) + ".log";
  setenv("NCCL_DEBUG_FILE", log.c_str(), 1);
  // Keep NCCL off the GPU's peer paths: ranks are different "nodes".
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  setenv("SQUALL_SOCKET_IFNAME", "lo", 0);
  setenv("SQUALL_DEBUG", "INFO", 0);
  setenv("SQUALL_TRANSPORT", "tcp", 0);  // CollNet's data plane: the one the CPU suite tests
  if (o.net == "squall") {
    setenv("NCCL_NET_PLUGIN", o.plugin.c_str(), 1);
    setenv("NCCL_NET", "squall", 1);
  } else {
    setenv("NCCL_NET_PLUGIN", "none", 1);
    setenv("NCCL_NET", "Socket", 1);
  }
  if (o.collnet) {
    setenv("NCCL_COLLNET_ENABLE", "1", 1);
    setenv("NCCL_ALGO", "CollNetChain", 1);
  }
}

int runRank(const Options& o, int rank, int idRead, int idWrite) {
  setRankEnvironment(o, rank);
  CUDA_OK(cudaSetDevice(0));
  ncclUniqueId id;
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    for (int r = 1; r < o.ranks; ++r)
      if (write(idWrite, &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) _exit(5);
  } else if (read(idRead, &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
    _exit(5);
  }
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, o.ranks, id, rank));
  size_t count = o.mib * (size_t{1} << 20) / sizeof(float);
  // Rank r contributes (r + 1) * (1 + i % 7): integers, so the sum is exact
  // in fp32 whatever the order, and a missing rank changes every element.
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>((rank + 1) * (1 + i % 7));
  float *in = nullptr, *out = nullptr;
  CUDA_OK(cudaMalloc(&in, count * sizeof(float)));
  CUDA_OK(cudaMalloc(&out, count * sizeof(float)));
  CUDA_OK(cudaMemcpy(in, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  NCCL_OK(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, stream));  // warmup + check
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(host.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost));
  double total = o.ranks * (o.ranks + 1) / 2.0;
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i)
    if (host[i] != static_cast<float>(total * (1 + i % 7))) ++wrong;
  auto start = std::chrono::steady_clock::now();
  for (int it = 0; it < o.iters; ++it)
    NCCL_OK(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      o.iters;
  printf("rank %d: %s: %zu of %zu elements wrong, %.2f ms per %zu MiB allreduce\n", rank,
         tagOf(o).c_str(), wrong, count, ms, o.mib);
  if (rank == 0)
    printf("RESULT net=%s collnet=%d ranks=%d mib=%zu ms=%.2f busbw_gbit=%.3f\n", o.net.c_str(),
           o.collnet ? 1 : 0, o.ranks, o.mib, ms,
           2.0 * (o.ranks - 1) / o.ranks * static_cast<double>(o.mib << 20) * 8 / (ms * 1e6));
  fflush(stdout);
  NCCL_OK(ncclCommDestroy(comm));
  cudaFree(in);
  cudaFree(out);
  return wrong == 0 ? 0 : 6;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--plugin")
      o.plugin = next();
    else if (a == "--net")
      o.net = next();
    else if (a == "--logs")
      o.logs = next();
    else if (a == "--collnet")
      o.collnet = true;
    else if (a == "--ranks")
      o.ranks = atoi(next().c_str());
    else if (a == "--mib")
      o.mib = strtoull(next().c_str(), nullptr, 10);
    else if (a == "--iters")
      o.iters = atoi(next().c_str());
    else if (a == "--timeout")
      o.timeoutS = atoi(next().c_str());
    else {
      fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (o.net == "squall" && o.plugin.empty()) {
    fprintf(stderr, "--net squall needs --plugin PATH\n");
    return 2;
  }
  // CUDA must not be initialised in a process that forks ranks afterwards,
  // so a throwaway child asks whether there is a device.
  fflush(nullptr);
  pid_t probe = fork();
  if (probe == 0) {
    int count = 0;
    _exit(cudaGetDeviceCount(&count) == cudaSuccess && count >= 1 ? 0 : 77);
  }
  int probeStatus = 0;
  waitpid(probe, &probeStatus, 0);
  if (!WIFEXITED(probeStatus) || WEXITSTATUS(probeStatus) != 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  int pipeFds[2];
  if (pipe(pipeFds) != 0) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) _exit(runRank(o, r, pipeFds[0], pipeFds[1]));
    pids.push_back(pid);
  }
  close(pipeFds[0]);
  close(pipeFds[1]);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.timeoutS);
  int failed = 0;
  std::vector<bool> done(pids.size(), false);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          fprintf(stderr, "rank %zu failed (status %d)\n", r, status);
          failed = 1;
        }
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      fprintf(stderr, "timed out after %d s; killing the ranks\n", o.timeoutS);
      for (size_t r = 0; r < pids.size(); ++r)
        if (!done[r]) kill(pids[r], SIGKILL);
      for (size_t r = 0; r < pids.size(); ++r)
        if (!done[r]) waitpid(pids[r], nullptr, 0);
      return 124;
    }
    usleep(10000);
  }
  printf("%s: %s\n", failed ? "FAIL" : "PASS", tagOf(o).c_str());
  return failed;
}
