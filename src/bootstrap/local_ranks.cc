#include "src/bootstrap/local_ranks.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace squall::bootstrap {
namespace {

constexpr size_t kKeyBytes = 64;

std::array<char, kKeyBytes> machineKey() {
  std::array<char, kKeyBytes> key{};
  const std::string text = machineId();
  std::memcpy(key.data(), text.data(), std::min(text.size(), kKeyBytes - 1));
  return key;
}

}  // namespace

std::string machineId() {
  std::string text;
  std::ifstream bootId("/proc/sys/kernel/random/boot_id");
  if (!std::getline(bootId, text) || text.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) text = std::string("host ") + host;
  }
  return text;
}

Status countLocalRanks(Bootstrap& bootstrap, int* localRanks) {
  // The machine key, then the CPUs this rank may run on: ranks bound to
  // disjoint cores (Slurm --cpu-bind, mpirun --bind-to) do not share them,
  // so they must not divide them either; ranks confined to the same set (a
  // container's cpuset, no binding at all) do.
  struct Entry {
    std::array<char, kKeyBytes> key;
    cpu_set_t cpus;
  };
  Entry mine{};
  mine.key = machineKey();
  CPU_ZERO(&mine.cpus);
  const bool known = sched_getaffinity(0, sizeof(mine.cpus), &mine.cpus) == 0;
  if (!known) CPU_ZERO(&mine.cpus);  // unknown: counts as sharing every core
  std::vector<Entry> all(static_cast<size_t>(bootstrap.size()));
  SQUALL_TRY(bootstrap.allGather(&mine, sizeof(Entry), all.data()));
  int count = 0;
  for (const Entry& other : all) {
    if (other.key != mine.key) continue;
    cpu_set_t both;
    CPU_AND(&both, &mine.cpus, &other.cpus);
    const bool unknown = CPU_COUNT(&mine.cpus) == 0 || CPU_COUNT(&other.cpus) == 0;
    count += unknown || CPU_COUNT(&both) > 0 ? 1 : 0;
  }
  *localRanks = std::max(count, 1);
  return Status::kOk;
}

}  // namespace squall::bootstrap
