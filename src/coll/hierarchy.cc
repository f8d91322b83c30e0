#include "src/coll/hierarchy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace squall::coll {
namespace {

constexpr uint64_t kShmMagic = 0x53515541'4c4c5348ull;  // "SQUALLSH"
// The header takes one cache line, so the slots after it stay aligned.
constexpr size_t kHeaderBytes = 64;

struct ShmHeader {
  uint64_t magic;
  uint64_t nonce;
  uint64_t bytes;
};

Status randomNonce(uint64_t* out) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                       "cannot open /dev/urandom to name a shared-memory segment: %s",
                       std::strerror(errno));
  const ssize_t got = ::read(fd, out, sizeof(*out));
  ::close(fd);
  SQUALL_REQUIRE(got == static_cast<ssize_t>(sizeof(*out)), Status::kSystemError, Subsys::kColl,
                 "cannot read /dev/urandom to name a shared-memory segment");
  return Status::kOk;
}

// The nonce is the name's last 16 hex digits.
bool nonceOfName(const std::string& name, uint64_t* nonce) {
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos || name.size() - dash - 1 != 16) return false;
  char* end = nullptr;
  *nonce = std::strtoull(name.c_str() + dash + 1, &end, 16);
  return end != nullptr && *end == '\0';
}

}  // namespace

bool layoutFromKeys(const std::vector<std::string>& keys, int rank, HostLayout* out,
                    std::string* why) {
  std::map<std::string, int> hostOf;  // key -> host index, by first appearance
  std::vector<std::vector<int>> members;
  for (size_t r = 0; r < keys.size(); ++r) {
    auto [it, fresh] = hostOf.emplace(keys[r], static_cast<int>(members.size()));
    if (fresh) members.emplace_back();
    members[static_cast<size_t>(it->second)].push_back(static_cast<int>(r));
  }
  char text[160];
  if (members.size() < 2) {
    std::snprintf(text, sizeof(text), "all %zu ranks are on one host", keys.size());
    *why = text;
    return false;
  }
  const size_t local = members[0].size();
  for (size_t h = 1; h < members.size(); ++h) {
    if (members[h].size() != local) {
      std::snprintf(text, sizeof(text),
                    "the hosts have different numbers of ranks (host 0 has %zu, host %zu has %zu)",
                    local, h, members[h].size());
      *why = text;
      return false;
    }
  }
  if (local < 2) {
    std::snprintf(text, sizeof(text), "every one of the %zu hosts has one rank", members.size());
    *why = text;
    return false;
  }
  HostLayout l;
  l.hosts = static_cast<int>(members.size());
  l.local = static_cast<int>(local);
  l.host = hostOf.at(keys[static_cast<size_t>(rank)]);
  const std::vector<int>& mine = members[static_cast<size_t>(l.host)];
  for (size_t j = 0; j < mine.size(); ++j)
    if (mine[j] == rank) l.localIndex = static_cast<int>(j);
  l.localRanks = mine;
  for (const std::vector<int>& host : members)
    l.crossRanks.push_back(host[static_cast<size_t>(l.localIndex)]);
  *out = std::move(l);
  return true;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::release() {
  unlinkName();
  if (map_ != nullptr) ::munmap(map_, mapBytes_);
  map_ = nullptr;
  data_ = nullptr;
}

void ShmSegment::unlinkName() {
  if (!name_.empty()) ::shm_unlink(name_.c_str());
  name_.clear();
}

Status ShmSegment::create(size_t bytes, std::string* name) {
  release();
  uint64_t nonce = 0;
  SQUALL_TRY(randomNonce(&nonce));
  char text[64];
  std::snprintf(text, sizeof(text), "/squall-%ld-%016" PRIx64, static_cast<long>(::getpid()),
                nonce);
  const size_t total = kHeaderBytes + bytes;
  const int fd = ::shm_open(text, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                       "cannot create the shared-memory segment %s: %s (is /dev/shm mounted?)",
                       text, std::strerror(errno));
  name_ = text;
  // posix_fallocate reserves the pages now, so a /dev/shm too small fails
  // here with ENOSPC rather than later with SIGBUS on first touch.
  int err = ::ftruncate(fd, static_cast<off_t>(total)) == 0
                ? ::posix_fallocate(fd, 0, static_cast<off_t>(total))
                : errno;
  if (err != 0) {
    ::close(fd);
    unlinkName();
    return SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                       "cannot size the shared-memory segment %s to %zu bytes: %s (/dev/shm may "
                       "be too small)",
                       text, total, std::strerror(err));
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    unlinkName();
    return SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                       "cannot map the shared-memory segment %s (%zu bytes): %s", text, total,
                       std::strerror(err));
  }
  map_ = p;
  mapBytes_ = total;
  auto* header = static_cast<ShmHeader*>(p);
  header->magic = kShmMagic;
  header->nonce = nonce;
  header->bytes = bytes;
  data_ = static_cast<uint8_t*>(p) + kHeaderBytes;
  bytes_ = bytes;
  *name = text;
  return Status::kOk;
}

Status ShmSegment::open(const std::string& name, size_t bytes) {
  release();
  uint64_t nonce = 0;
  SQUALL_REQUIRE(nonceOfName(name, &nonce), Status::kInvalidArgument, Subsys::kColl,
                 "'%s' is not the name of a squall shared-memory segment", name.c_str());
  const size_t total = kHeaderBytes + bytes;
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                       "cannot open the shared-memory segment %s that local rank 0 created: %s "
                       "(the ranks of this host may not share /dev/shm: another IPC namespace "
                       "or container)",
                       name.c_str(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != total) {
    ::close(fd);
    return SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                       "the shared-memory segment %s holds %lld bytes where %zu were expected",
                       name.c_str(), static_cast<long long>(st.st_size), total);
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED)
    return SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                       "cannot map the shared-memory segment %s (%zu bytes): %s", name.c_str(),
                       total, std::strerror(err));
  map_ = p;
  mapBytes_ = total;
  const auto* header = static_cast<const ShmHeader*>(p);
  if (header->magic != kShmMagic || header->nonce != nonce || header->bytes != bytes) {
    release();
    return SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                       "the shared-memory segment %s is not the one local rank 0 created (its "
                       "header differs)",
                       name.c_str());
  }
  data_ = static_cast<uint8_t*>(p) + kHeaderBytes;
  bytes_ = bytes;
  return Status::kOk;
}

}  // namespace squall::coll
