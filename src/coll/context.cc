#include "src/coll/context.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace squall::coll {
namespace {

transport::Tag abortTag(uint64_t sequence) {
  return transport::Tag{sequence, kAbortStep, transport::Descriptor{}};
}

// A peer's abort text as it may be printed: control and non-ASCII bytes
// become \xNN, so a confused or hostile peer cannot write escape sequences
// into our logs.
std::string printable(const char* text) {
  std::string out;
  for (const char* c = text; *c != '\0'; ++c) {
    const auto byte = static_cast<unsigned char>(*c);
    if (byte >= 0x20 && byte < 0x7f) {
      out.push_back(*c);
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out.append(escaped);
    }
  }
  return out;
}

// Keeps the thread's last error across best-effort work whose own failures
// must not replace the first cause (status.h: the first cause wins).
class KeepLastError {
 public:
  KeepLastError() : saved_(lastError()) {}
  ~KeepLastError() { setLastError(saved_); }
  KeepLastError(const KeepLastError&) = delete;
  KeepLastError& operator=(const KeepLastError&) = delete;

 private:
  std::string saved_;
};

}  // namespace

Status OpContext::waitAll(std::span<const transport::RequestPtr> requests) const {
  for (;;) {
    bool all = true;
    const transport::Request* failed = nullptr;
    for (const transport::RequestPtr& r : requests) {
      if (r == nullptr) continue;
      if (!r->done()) {
        all = false;
      } else if (r->status() != Status::kOk) {
        failed = r.get();
        break;
      }
    }
    if (failed == nullptr && all) return Status::kOk;
    // A request this rank failed on its own evidence (a message of the wrong
    // size: the ranks called different collectives) is the first cause here.
    if (failed != nullptr && failed->status() != Status::kRemoteError) {
      return transport::failureOf(*failed);
    }
    // A peer's notice wins over a request that failed with its connection: a
    // peer that gave up sends its notice and then goes, so that request would
    // otherwise blame a rank that is only the messenger (the notice names the
    // first cause).
    for (AbortWatch* watch : {abort, previousAbort}) {
      if (watch == nullptr) continue;
      for (size_t peer = 0; peer < watch->requests.size(); ++peer) {
        const transport::RequestPtr& notice = watch->requests[peer];
        if (notice == nullptr || !notice->done()) continue;
        // A notice receive that failed only says the connection to that peer
        // ended. A peer that completed the operation and destroyed its
        // communicator ends it too, so this is no failure of the operation:
        // if the peer really died, a data request with it fails, or a rank
        // that talks to it sends a notice.
        if (notice->status() != Status::kOk) continue;
        // A notice on this operation reached every peer from its sender, so
        // this rank has nothing to add. One on the operation before reached
        // only the ranks still watching it: a peer already past this one
        // (a broadcast root that finished early) learns why this rank stops
        // only from this rank's own notice, so it is sent.
        if (abort != nullptr && watch == abort) abort->received = true;
        char* reason = watch->reasons[peer].data();
        reason[kAbortBytes - 1] = '\0';
        const std::string what = transport::describe(tag(0));
        char text[kAbortBytes + 256];
        std::snprintf(
            text, sizeof(text), "rank %d stops %s because rank %zu gave up on %s: %s",
            (whole != nullptr ? whole : transport)->rank(), what.c_str(), peer,
            watch == abort ? "it" : "the operation before it (which this rank had completed)",
            printable(reason).c_str());
        if (abortLogged == nullptr || !*abortLogged) {
          if (abortLogged != nullptr) *abortLogged = true;
          return SQUALL_FAIL(Status::kRemoteError, Subsys::kColl, "%s", text);
        }
        setLastError(text);
        SQUALL_INFO(Subsys::kColl, "%s", text);
        return Status::kRemoteError;
      }
    }
    if (failed != nullptr) return transport::failureOf(*failed);
    transport::Transport* t = whole != nullptr ? whole : transport;
    SQUALL_TRY(t->progress());
    // Past the deadline, the transport reports which peers are missing.
    if (transport::Clock::now() >= deadline) return t->waitAll(requests, deadline);
    SQUALL_TRY(t->waitForActivity(deadline));
  }
}

Status watchForAborts(const OpContext& ctx, AbortWatch* watch) {
  const auto n = static_cast<size_t>(ctx.size());
  watch->reasons.resize(n);
  watch->requests.resize(n);
  for (size_t peer = 0; peer < n; ++peer) {
    if (peer == static_cast<size_t>(ctx.rank())) continue;
    SQUALL_TRY(ctx.transport->watch(static_cast<int>(peer), abortTag(ctx.sequence),
                                    watch->reasons[peer].data(), kAbortBytes,
                                    &watch->requests[peer]));
  }
  return Status::kOk;
}

void sendAbortNotices(const OpContext& ctx, const std::string& reason) {
  // A notice that cannot be sent (the peer is gone) is not the operation's
  // failure: the caller must still read the reason it failed for.
  const KeepLastError keep;
  std::array<char, kAbortBytes> text{};
  std::memcpy(text.data(), reason.data(), std::min(reason.size(), kAbortBytes - 1));
  std::vector<transport::RequestPtr> sends(static_cast<size_t>(ctx.size()));
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == ctx.rank()) continue;
    // Best effort: a peer that is gone cannot be told.
    (void)ctx.transport->send(peer, abortTag(ctx.sequence), text.data(), kAbortBytes,
                              &sends[static_cast<size_t>(peer)]);
  }
  // Destroying a pending send cancels it, so give the notices a moment.
  const auto limit = transport::Clock::now() + std::chrono::seconds(1);
  for (;;) {
    bool all = true;
    for (const transport::RequestPtr& s : sends) all = all && (s == nullptr || s->done());
    if (all || transport::Clock::now() >= limit) return;
    if (ctx.transport->progress() != Status::kOk) return;
    if (ctx.transport->waitForActivity(std::min(
            limit, transport::Clock::now() + std::chrono::milliseconds(10))) != Status::kOk)
      return;
  }
}

}  // namespace squall::coll
