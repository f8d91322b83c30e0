#include "src/transport/local/local_transport.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>

#include "src/transport/message_header.h"

namespace squall::transport {
namespace {

bool sameMatch(const Tag& a, const Tag& b) { return a.sequence == b.sequence && a.step == b.step; }

class RecvRequest;

struct Unexpected {
  int source;
  Tag tag;
  std::vector<uint8_t> bytes;
};

struct Mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t generation = 0;             // bumped whenever a receive here advances
  std::list<RecvRequest*> posted;      // receives waiting for their message
  std::list<RecvRequest*> mismatched;  // matched a message that disagrees; fail them
  std::list<Unexpected> unexpected;    // messages that arrived before their receive
};

struct Hub {
  explicit Hub(int n) : boxes(static_cast<size_t>(n)) {}
  std::vector<Mailbox> boxes;
};

class RecvRequest : public Request {
 public:
  RecvRequest(Mailbox* box, int source, const Tag& tag, void* data, size_t bytes)
      : Request(source, bytes), box_(box), tag_(tag), data_(data) {}
  ~RecvRequest() override {
    std::lock_guard<std::mutex> lock(box_->mutex);
    if (inList_ != nullptr) inList_->remove(this);
  }

  Mailbox* box_;
  Tag tag_;
  void* data_;
  std::list<RecvRequest*>* inList_ = nullptr;  // guarded by box_->mutex
  Tag theirTag_;                               // valid in `mismatched`
  size_t theirBytes_ = 0;
};

// Both sides of a mismatch, described the way every backend does.
Status mismatchError(int rank, int source, const Tag& mine, size_t myBytes, const Tag& theirs,
                     size_t theirBytes) {
  return failMismatch(rank, source, theirs, theirBytes, mine, myBytes);
}

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(hub_->boxes.size()); }
  const char* name() const override { return "local"; }

  Status send(int peer, const Tag& tag, const void* data, size_t bytes,
              RequestPtr* request) override {
    SQUALL_TRY(checkPeer(peer, data, bytes, request, "send to"));
    Mailbox& box = hub_->boxes[static_cast<size_t>(peer)];
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      auto it = std::find_if(box.posted.begin(), box.posted.end(), [&](RecvRequest* r) {
        return r->peer() == rank_ && sameMatch(r->tag_, tag);
      });
      if (it == box.posted.end()) {
        const auto* p = static_cast<const uint8_t*>(data);
        box.unexpected.push_back(Unexpected{rank_, tag, std::vector<uint8_t>(p, p + bytes)});
      } else {
        RecvRequest* r = *it;
        box.posted.erase(it);
        if (r->tag_.descriptor == tag.descriptor && r->bytes() == bytes) {
          if (bytes != 0) std::memcpy(r->data_, data, bytes);
          r->inList_ = nullptr;
          r->complete(Status::kOk);
        } else {
          // The receiver describes the error in its own thread (progress()).
          r->theirTag_ = tag;
          r->theirBytes_ = bytes;
          box.mismatched.push_back(r);
          r->inList_ = &box.mismatched;
        }
        ++box.generation;
      }
    }
    box.changed.notify_all();
    auto done = std::make_unique<Request>(peer, bytes);
    done->complete(Status::kOk);
    *request = std::move(done);
    return Status::kOk;
  }

  Status recv(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) override {
    SQUALL_TRY(checkPeer(peer, data, bytes, request, "receive from"));
    Mailbox& box = hub_->boxes[static_cast<size_t>(rank_)];
    auto r = std::make_unique<RecvRequest>(&box, peer, tag, data, bytes);
    std::unique_lock<std::mutex> lock(box.mutex);
    auto it = std::find_if(box.unexpected.begin(), box.unexpected.end(), [&](const Unexpected& u) {
      return u.source == peer && sameMatch(u.tag, tag);
    });
    if (it == box.unexpected.end()) {
      box.posted.push_back(r.get());
      r->inList_ = &box.posted;
      // Unlocked before *request is replaced: destroying the request it held
      // (often a receive on this same mailbox) takes the mailbox lock.
      lock.unlock();
    } else {
      Unexpected u = std::move(*it);
      box.unexpected.erase(it);
      lock.unlock();
      if (!(u.tag.descriptor == tag.descriptor) || u.bytes.size() != bytes) {
        // Fail the request, not the call, so the caller still posts its
        // sends and its peers see the mismatch too instead of timing out.
        r->complete(mismatchError(rank_, peer, tag, bytes, u.tag, u.bytes.size()));
      } else {
        if (bytes != 0) std::memcpy(data, u.bytes.data(), bytes);
        r->complete(Status::kOk);
      }
    }
    *request = std::move(r);
    return Status::kOk;
  }

  Status progress() override {
    Mailbox& box = hub_->boxes[static_cast<size_t>(rank_)];
    std::unique_lock<std::mutex> lock(box.mutex);
    if (box.mismatched.empty()) return Status::kOk;
    RecvRequest* r = box.mismatched.front();
    box.mismatched.pop_front();
    r->inList_ = nullptr;
    ++box.generation;  // a request advanced: waitForActivity must not sleep
    lock.unlock();
    Status status =
        mismatchError(rank_, r->peer(), r->tag_, r->bytes(), r->theirTag_, r->theirBytes_);
    r->complete(status);
    return Status::kOk;
  }

  Status waitForActivity(Deadline until) override {
    SQUALL_TRY(progress());
    Mailbox& box = hub_->boxes[static_cast<size_t>(rank_)];
    std::unique_lock<std::mutex> lock(box.mutex);
    // Anything that advanced since the last return was already visible to
    // the caller's check, so waiting for the next change loses no wake-up.
    box.changed.wait_until(lock, until, [&] { return box.generation != seen_; });
    seen_ = box.generation;
    return Status::kOk;
  }

 private:
  Status checkPeer(int peer, const void* data, size_t bytes, RequestPtr* request,
                   const char* verb) const {
    SQUALL_REQUIRE(peer >= 0 && peer < size(), Status::kInvalidArgument, Subsys::kTransport,
                   "rank %d tried to %s rank %d, but the group has ranks 0..%d", rank_, verb, peer,
                   size() - 1);
    SQUALL_REQUIRE(data != nullptr || bytes == 0, Status::kInvalidArgument, Subsys::kTransport,
                   "the buffer pointer is NULL but the message has %zu bytes", bytes);
    SQUALL_REQUIRE(request != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                   "the request output pointer is NULL");
    return Status::kOk;
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
  uint64_t seen_ = 0;
};

}  // namespace

Status createLocalTransports(int n, std::vector<std::unique_ptr<Transport>>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "the output vector pointer is NULL");
  SQUALL_REQUIRE(n >= 1 && n <= 4096, Status::kInvalidArgument, Subsys::kTransport,
                 "a local group needs 1 to 4096 ranks, not %d", n);
  auto hub = std::make_shared<Hub>(n);
  out->clear();
  for (int r = 0; r < n; ++r) out->push_back(std::make_unique<LocalTransport>(hub, r));
  return Status::kOk;
}

}  // namespace squall::transport
