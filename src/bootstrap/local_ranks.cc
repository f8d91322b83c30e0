#include "src/bootstrap/local_ranks.h"

#include <unistd.h>

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
  std::string text;
  std::ifstream bootId("/proc/sys/kernel/random/boot_id");
  if (!std::getline(bootId, text) || text.empty()) {
    char host[kKeyBytes] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) text = std::string("host ") + host;
  }
  std::memcpy(key.data(), text.data(), std::min(text.size(), kKeyBytes - 1));
  return key;
}

}  // namespace

Status countLocalRanks(Bootstrap& bootstrap, int* localRanks) {
  const std::array<char, kKeyBytes> mine = machineKey();
  std::vector<std::array<char, kKeyBytes>> all(static_cast<size_t>(bootstrap.size()));
  SQUALL_TRY(bootstrap.allGather(mine.data(), kKeyBytes, all.data()));
  int count = 0;
  for (const auto& key : all) count += key == mine ? 1 : 0;
  *localRanks = count;
  return Status::kOk;
}

}  // namespace squall::bootstrap
