// MPI backend.
//
// Our traffic runs on a duplicate of the caller's communicator, so it never
// matches the application's own messages. The MPI tag holds the low bits of
// (sequence, step), sized to the communicator's MPI_TAG_UB; MPI's
// non-overtaking rule keeps same-tag messages between a pair in order, and
// the 40-byte header (message_header.h) that precedes every payload carries
// the full Tag and size so anything that still aliases is caught.
//
// Header and payload travel as one message through an hindexed datatype
// over their absolute addresses (split into 1 GiB blocks, so sizes beyond
// INT_MAX work). Receives wait in our queue, in post order; progress() looks
// for their message with MPI_Improbe, which also tells the sender's length:
// a message of the right size is received straight into [header, buffer]
// with MPI_Imrecv, one of the wrong size whole into a bounce buffer, so the
// mismatch is reported with both sides' descriptors instead of truncating.
//
// Progress is MPI_Test on each request in flight; waitForActivity yields, and
// sleeps briefly once nothing has moved for a while, because MPI offers no
// descriptor to block on.
//
// Cancellation: a waiting receive is simply dropped; a matched one is waited
// for (its message exists, so it completes); a send is MPI_Cancel'ed and
// waited for. MPI implementations may decline to cancel a send (Open MPI
// does for sends already started), so destroying a large pending send can
// block until the receiver takes it.
//
// Every MPI call goes through the table of the process's libmpi
// (mpi_table.h), so nothing here links libmpi.
//
// Failures: the communicator gets MPI_ERRORS_RETURN and every failing call is
// described with MPI's error string, but most MPI libraries abort the job
// when a process dies, so a crashed peer usually ends the run rather than
// producing kRemoteError.
#include "src/transport/mpi/mpi_transport.h"

#include <algorithm>
#include <list>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/transport/message_header.h"
#include "src/transport/mpi/mpi_table.h"

namespace squall::transport {
namespace {

constexpr size_t kMaxBlock = size_t{1} << 30;
constexpr auto kSpinBeforeSleep = std::chrono::milliseconds(1);
constexpr auto kIdleSleep = std::chrono::microseconds(50);

std::string mpiError(const mpi::Table& lib, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  lib.Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// One committed datatype covering `pieces` at their absolute addresses, to be
// used with MPI_BOTTOM and count 1.
Status makeType(const mpi::Table& lib, std::initializer_list<std::pair<void*, size_t>> pieces,
                MPI_Datatype* type) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> displacements;
  for (auto [base, bytes] : pieces) {
    for (size_t off = 0; off < bytes; off += kMaxBlock) {
      MPI_Aint address;
      lib.Get_address(static_cast<char*>(base) + off, &address);
      displacements.push_back(address);
      lengths.push_back(static_cast<int>(std::min(kMaxBlock, bytes - off)));
    }
  }
  int rc = lib.Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(),
                                    displacements.data(), lib.byte, type);
  if (rc == MPI_SUCCESS) rc = lib.Type_commit(type);
  SQUALL_REQUIRE(rc == MPI_SUCCESS, Status::kSystemError, Subsys::kTransport,
                 "could not build an MPI datatype for a message: %s", mpiError(lib, rc).c_str());
  return Status::kOk;
}

class MpiTransport;

class MpiRequest final : public HeaderedRequest<MpiRequest> {
 public:
  MpiRequest(MpiTransport* owner, MPI_Request none, bool isSend, int peer, const Tag& tag,
             void* data, size_t bytes)
      : HeaderedRequest(isSend, peer, tag, data, bytes), owner_(owner), mpi_(none) {}
  ~MpiRequest() override;

 private:
  friend class MpiTransport;
  MpiTransport* owner_;   // nullptr once the transport is gone
  MPI_Count length_ = 0;  // a matched receive's message length
  MPI_Request mpi_;       // MPI_REQUEST_NULL when none is in flight
};

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(const mpi::Table& lib) : lib_(lib), comm_(lib.commNull) {}
  ~MpiTransport() override;

  Status init(MPI_Comm comm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  Status send(int peer, const Tag& tag, const void* data, size_t bytes,
              RequestPtr* request) override;
  Status recv(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) override;
  Status progress() override;
  Status waitForActivity(Deadline until) override;

  void cancel(MpiRequest* r);

 private:
  int mpiTag(const Tag& tag) const {
    uint64_t step = tag.step & ((uint64_t{1} << stepBits_) - 1);
    uint64_t sequence = tag.sequence & ((uint64_t{1} << (tagBits_ - stepBits_)) - 1);
    return static_cast<int>((sequence << stepBits_) | step);
  }
  Status checkPeer(int peer, const char* what) const;
  Status post(MpiRequest* r, MPI_Message message, MPI_Count length);
  void finish(MpiRequest* r, Status status);

  const mpi::Table& lib_;  // the process's libmpi
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 0;
  int tagBits_ = 15;
  int stepBits_ = 7;
  PendingRequests<MpiRequest> pending_;
  Clock::time_point lastActivity_ = Clock::now();
};

MpiRequest::~MpiRequest() {
  if (owner_ != nullptr && !done()) owner_->cancel(this);
}

Status MpiTransport::init(MPI_Comm comm) {
  int initialized = 0, finalized = 0;
  lib_.Initialized(&initialized);
  lib_.Finalized(&finalized);
  SQUALL_REQUIRE(initialized && !finalized, Status::kInvalidUsage, Subsys::kTransport,
                 "the MPI transport needs MPI to be initialised (and not yet finalised); call "
                 "MPI_Init_thread before creating it");
  int level = MPI_THREAD_SINGLE, isMain = 0;
  lib_.Query_thread(&level);
  lib_.Is_thread_main(&isMain);
  SQUALL_REQUIRE(level >= MPI_THREAD_SERIALIZED || isMain, Status::kUnsupported, Subsys::kTransport,
                 "MPI was initialised below MPI_THREAD_SERIALIZED and this is not the thread "
                 "that initialised it; initialise MPI with MPI_THREAD_SERIALIZED or use the "
                 "transport from the main thread");
  int rc = lib_.Comm_dup(comm, &comm_);
  if (rc != MPI_SUCCESS) {
    comm_ = lib_.commNull;
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "could not duplicate the MPI communicator: %s", mpiError(lib_, rc).c_str());
  }
  lib_.Comm_set_errhandler(comm_, lib_.errorsReturn);
  lib_.Comm_rank(comm_, &rank_);
  lib_.Comm_size(comm_, &size_);
  void* attribute = nullptr;
  int found = 0;
  lib_.Comm_get_attr(comm_, MPI_TAG_UB, &attribute, &found);
  int64_t tagUb = found ? *static_cast<int*>(attribute) : 32767;  // the standard's minimum
  tagBits_ = 0;
  while (tagBits_ < 62 && (int64_t{1} << (tagBits_ + 1)) - 1 <= tagUb) ++tagBits_;
  stepBits_ = std::min(tagBits_ / 2, 12);
  SQUALL_INFO(Subsys::kTransport, "rank %d: MPI transport up with %d ranks (%d tag bits)", rank_,
              size_, tagBits_);
  return Status::kOk;
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  lib_.Finalized(&finalized);
  std::vector<MpiRequest*> pending(pending_.live.begin(), pending_.live.end());
  for (MpiRequest* r : pending) {
    if (!finalized) cancel(r);
    r->owner_ = nullptr;
    if (!r->done()) r->complete(Status::kInternal);
  }
  if (comm_ != lib_.commNull && !finalized) lib_.Comm_free(&comm_);
}

Status MpiTransport::checkPeer(int peer, const char* what) const {
  SQUALL_REQUIRE(peer >= 0 && peer < size_, Status::kInvalidArgument, Subsys::kTransport,
                 "%s rank %d is outside the group of %d ranks", what, peer, size_);
  return Status::kOk;
}

Status MpiTransport::send(int peer, const Tag& tag, const void* data, size_t bytes,
                          RequestPtr* request) {
  SQUALL_TRY(checkPeer(peer, "send to"));
  auto r = std::make_unique<MpiRequest>(this, lib_.requestNull, true, peer, tag,
                                        const_cast<void*>(data), bytes);
  encodeMessageHeader(tag, bytes, r->header());
  MPI_Datatype type;
  SQUALL_TRY(makeType(lib_, {{r->header(), kMessageHeaderBytes}, {r->data(), bytes}}, &type));
  int rc = lib_.Isend(MPI_BOTTOM, 1, type, peer, mpiTag(tag), comm_, &r->mpi_);
  lib_.Type_free(&type);  // pending operations keep their own reference
  SQUALL_REQUIRE(rc == MPI_SUCCESS, Status::kRemoteError, Subsys::kTransport,
                 "rank %d could not send %s to rank %d: %s", rank_, describe(tag).c_str(), peer,
                 mpiError(lib_, rc).c_str());
  pending_.track(r.get());
  *request = std::move(r);
  return Status::kOk;
}

Status MpiTransport::recv(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) {
  SQUALL_TRY(checkPeer(peer, "receive from"));
  auto r = std::make_unique<MpiRequest>(this, lib_.requestNull, false, peer, tag, data, bytes);
  pending_.queueReceive(r.get());
  *request = std::move(r);
  return Status::kOk;
}

Status MpiTransport::post(MpiRequest* r, MPI_Message message, MPI_Count length) {
  r->length_ = length;
  MPI_Datatype type;
  if (r->fits(static_cast<size_t>(length))) {
    SQUALL_TRY(
        makeType(lib_, {{r->header(), kMessageHeaderBytes}, {r->data(), r->bytes()}}, &type));
  } else {
    size_t bytes = static_cast<size_t>(length);
    SQUALL_TRY(makeType(lib_, {{r->bounce(bytes), bytes}}, &type));
  }
  int rc = lib_.Imrecv(MPI_BOTTOM, 1, type, &message, &r->mpi_);
  lib_.Type_free(&type);
  SQUALL_REQUIRE(rc == MPI_SUCCESS, Status::kRemoteError, Subsys::kTransport,
                 "rank %d could not receive %s from rank %d: %s", rank_, describe(r->tag()).c_str(),
                 r->peer(), mpiError(lib_, rc).c_str());
  return Status::kOk;
}

void MpiTransport::finish(MpiRequest* r, Status status) {
  pending_.untrack(r);
  lastActivity_ = Clock::now();
  if (status == Status::kOk && !r->isSend())
    status = r->checkReceived("MPI", rank_, static_cast<size_t>(r->length_));
  r->complete(status);
}

Status MpiTransport::progress() {
  for (auto it = pending_.waiting.begin(); it != pending_.waiting.end();) {
    MpiRequest* r = *it;
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    int rc = lib_.Improbe(r->peer(), mpiTag(r->tag()), comm_, &flag, &message, &status);
    SQUALL_REQUIRE(rc == MPI_SUCCESS, Status::kRemoteError, Subsys::kTransport,
                   "rank %d could not probe for a message from rank %d: %s", rank_, r->peer(),
                   mpiError(lib_, rc).c_str());
    if (!flag) {
      ++it;
      continue;
    }
    it = pending_.matched(r);
    MPI_Count length = 0;
    lib_.Get_elements_x(&status, lib_.byte, &length);
    Status posted = post(r, message, length);
    if (posted != Status::kOk) finish(r, posted);
  }
  std::vector<MpiRequest*> active;
  for (MpiRequest* r : pending_.live)
    if (!r->waiting_) active.push_back(r);
  for (MpiRequest* r : active) {
    int flag = 0;
    MPI_Status status;
    int rc = lib_.Test(&r->mpi_, &flag, &status);
    if (rc != MPI_SUCCESS) {
      finish(r, SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                            "rank %d's %s rank %d failed: %s", rank_,
                            r->isSend() ? "send to" : "receive from", r->peer(),
                            mpiError(lib_, rc).c_str()));
    } else if (flag) {
      finish(r, Status::kOk);
    }
  }
  return Status::kOk;
}

Status MpiTransport::waitForActivity(Deadline until) {
  SQUALL_TRY(progress());
  Clock::time_point now = Clock::now();
  if (now >= until) return Status::kOk;
  if (now - lastActivity_ < kSpinBeforeSleep) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::min<Clock::duration>(kIdleSleep, until - now));
  }
  return Status::kOk;
}

void MpiTransport::cancel(MpiRequest* r) {
  if (!r->waiting_ && r->mpi_ != lib_.requestNull) {
    if (r->isSend()) lib_.Cancel(&r->mpi_);
    lib_.Wait(&r->mpi_, MPI_STATUS_IGNORE);
  }
  pending_.untrack(r);
}

}  // namespace

Status createMpiTransport(MPI_Comm comm, std::unique_ptr<Transport>* out) {
  const mpi::Table* lib = nullptr;
  SQUALL_TRY(mpi::mpiTable(&lib));
  auto transport = std::make_unique<MpiTransport>(*lib);
  SQUALL_TRY(transport->init(comm));
  *out = std::move(transport);
  return Status::kOk;
}

}  // namespace squall::transport
