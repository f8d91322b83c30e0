// Several processes sharing one GPU, for the NCCL tests and benchmark.
//
// The parent never touches CUDA (a forked CUDA context is unusable): it
// re-executes its own binary n times with `--rank R --nranks N --dir D
// <args>`, each child with a distinct NCCL_HOSTID (so NCCL treats the ranks
// as separate hosts on one GPU) and NCCL_MNNVL_ENABLE=0, and waits. Children
// meet through files in D: rank 0 writes a blob to D/<name> (via a rename, so
// readers never see half of it) and the others poll for it.
// A child exits 0 on success, 77 to skip (no GPU), anything else on failure.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace squall::gpu_test {

constexpr int kSkip = 77;

struct Child {
  int rank = -1;
  int nranks = 0;
  std::string dir;
  std::vector<std::string> args;  // what followed the harness's own options
};

// True in a child (and fills `child`).
inline bool parseChild(int argc, char** argv, Child* child) {
  if (argc < 7 || std::strcmp(argv[1], "--rank") != 0) return false;
  child->rank = std::atoi(argv[2]);
  child->nranks = std::atoi(argv[4]);
  child->dir = argv[6];
  for (int i = 7; i < argc; ++i) child->args.emplace_back(argv[i]);
  return true;
}

// Runs n children with `args`; returns 0 when all passed, kSkip when all
// skipped, 1 otherwise (a child still running after timeoutS is killed).
inline int spawn(int n, const std::vector<std::string>& args, int timeoutS) {
  char dirTemplate[] = "/tmp/squall-gpu-test.XXXXXX";
  if (mkdtemp(dirTemplate) == nullptr) return 1;
  const std::string dir = dirTemplate;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string host = "squall-test-host-" + std::to_string(r);
      setenv("NCCL_HOSTID", host.c_str(), 1);
      setenv("NCCL_MNNVL_ENABLE", "0", 1);
      std::vector<std::string> all = {
          "/proc/self/exe", "--rank", std::to_string(r), "--nranks", std::to_string(n),
          "--dir",          dir};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> cargs;
      for (std::string& a : all) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execv("/proc/self/exe", cargs.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutS);
  std::vector<int> codes(pids.size(), -1);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -1) continue;
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      std::printf("FAIL: ranks still running after %d s; killing them\n", timeoutS);
      for (size_t i = 0; i < pids.size(); ++i)
        if (codes[i] == -1) kill(pids[i], SIGKILL);
      for (size_t i = 0; i < pids.size(); ++i)
        if (codes[i] == -1) waitpid(pids[i], nullptr, 0), codes[i] = 124;
      left = 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  bool allSkip = true, allPass = true;
  for (int code : codes) {
    allSkip = allSkip && code == kSkip;
    allPass = allPass && code == 0;
  }
  return allPass ? 0 : allSkip ? kSkip : 1;
}

// Rank 0 publishes `bytes` under `name`; the others wait for it (up to 60 s).
inline bool exchangeBlob(const Child& c, const char* name, void* data, size_t bytes) {
  const std::string path = c.dir + "/" + name;
  if (c.rank == 0) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
      if (!out) return false;
    }
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::string blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (blob.size() == bytes) {
        std::memcpy(data, blob.data(), bytes);
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace squall::gpu_test
