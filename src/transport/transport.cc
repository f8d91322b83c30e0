#include "src/transport/transport.h"

#include <cstdio>
#include <set>
#include <thread>

namespace squall::transport {

std::string describe(const Tag& tag) {
  const Descriptor& d = tag.descriptor;
  char text[256];
  int n = std::snprintf(text, sizeof(text), "#%llu %s",
                        static_cast<unsigned long long>(tag.sequence), collKindName(d.kind));
  auto append = [&](const char* format, auto... args) {
    if (n >= 0 && static_cast<size_t>(n) < sizeof(text))
      n += std::snprintf(text + n, sizeof(text) - n, format, args...);
  };
  if (d.kind == CollKind::kNone) {
    append(" (step %u)", tag.step);
    return text;
  }
  append(" %s", dataTypeName(d.dtype));
  const bool compressed =
      d.kind == CollKind::kCompressedAllReduce || d.kind == CollKind::kCompressedReduceScatter;
  if (d.kind == CollKind::kAllReduce || compressed) append(" %s", reduceOpName(d.op));
  if (compressed) append(" codec %u block %u", d.codec, d.block);
  if (d.kind == CollKind::kBroadcast) append(" root %u", d.block);
  append(
      d.kind == CollKind::kCompressedReduceScatter ? ", %llu elements per rank" : ", %llu elements",
      static_cast<unsigned long long>(d.count));
  return text;
}

Status failureOf(const Request& request) {
  if (!request.error().empty()) setLastError(request.error());
  return request.status();
}

Status Transport::waitAll(std::span<const RequestPtr> requests, Deadline deadline) {
  for (;;) {
    bool all = true;
    for (const RequestPtr& r : requests) {
      if (r == nullptr) continue;
      if (!r->done()) {
        all = false;
      } else if (r->status() != Status::kOk) {
        return failureOf(*r);
      }
    }
    if (all) return Status::kOk;
    SQUALL_TRY(progress());
    if (Clock::now() >= deadline) {
      std::set<int> peers;
      for (const RequestPtr& r : requests)
        if (r != nullptr && !r->done()) peers.insert(r->peer());
      std::string names;
      for (int p : peers) {
        if (!names.empty()) names.append(", ");
        names.append(std::to_string(p));
      }
      return SQUALL_FAIL(Status::kTimeout, Subsys::kTransport,
                         "rank %d timed out waiting for rank(s) %s; they may have crashed, "
                         "hung, or called a different collective (raise SQUALL_TIMEOUT_S if "
                         "they are only slow)",
                         rank(), names.c_str());
    }
    SQUALL_TRY(waitForActivity(deadline));
  }
}

Status Transport::watch(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) {
  return recv(peer, tag, data, bytes, request);
}

Status Transport::waitForActivity(Deadline until) {
  SQUALL_TRY(progress());
  if (Clock::now() < until) std::this_thread::yield();
  return Status::kOk;
}

}  // namespace squall::transport
