// UCX backend.
//
// Loading. UCX is opened at run time (ucx_api.h) and every call below goes
// through its table; a rank that cannot load it fails init, and its peers
// fail naming it.
//
// Matching. A UCP tag is 64 bits: source rank (20) | step (20) | sequence
// (24), always matched with a full mask. Every message is sent as a two-entry
// iov, [40-byte header, payload], the header holding the full Tag and the
// payload size (message_header.h). Receives are not posted to UCX directly:
// they wait in our queue, in post order, and progress() probes UCX for a
// message with their tag (ucp_tag_probe_nb, remove=1). Probing first tells us
// the sender's length, so a message of the wrong size is received whole into
// a bounce buffer and reported with both sides' descriptors instead of being
// truncated; one of the right size lands straight in the caller's buffer.
// UCX buffers unexpected messages itself. Tag bits wrap (2^24 operations,
// 2^20 steps); messages between a pair with the same tag match in order, and
// the header check catches anything that still aliases.
//
// Blocking. With UCP_FEATURE_WAKEUP, waitForActivity sleeps on the worker's
// event fd, so a rank that waits sleeps instead of spinning on a core it may
// share; a rank that owns a core first polls for WaitOptions::spin. The
// protocol, in order: drain ucp_worker_progress until it returns
// 0; match waiting receives; if any request moved since waitForActivity last
// returned (activity_ vs seenActivity_), return without sleeping; otherwise
// ucp_worker_arm, and on UCS_ERR_BUSY start over; only after a successful arm
// poll the fd. The "since it last returned" matters: callers such as
// Transport::waitAll run progress() themselves between waits, and a request
// that completes there leaves nothing for UCX to signal; comparing against a
// snapshot taken on entry used to miss it and sleep a whole kMaxSleep per
// wait. Arming after a full drain means every later UCX event makes the fd
// readable, so kMaxSleep is only a safety net. Wakeups that keep finding
// nothing to do (a descriptor that stays readable) turn into short naps.
// Without wakeup support it yields.
//
// Failure. Endpoints use UCP_ERR_HANDLING_MODE_PEER unless
// SQUALL_UCX_PEER_FAILURE=0 (UCX 1.13's shared-memory transports cannot
// report peer failure, so with it UCX keeps intra-host traffic on TCP
// loopback). The error callback marks the rank failed: UCX fails its in-flight requests, waiting
// receives with no buffered message fail in progress(), and later sends and receives fail at once,
// all with kRemoteError naming the rank.
//
// Cancellation. Destroying a pending request removes a waiting receive from
// the queue; one in UCX's hands is cancelled with ucp_request_cancel and
// waited for. If UCX cannot cancel it within kCancelGrace (a rendezvous send
// whose receiver never comes), the endpoint to that peer is force-closed,
// which completes everything on it: the pair's message stream is broken at
// that point anyway, so later traffic with that peer fails. Without peer
// error handling a forced close is undefined, so there it waits for the peer.
#include "src/transport/ucx/ucx_transport.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include "src/common/params.h"
#include "src/transport/message_header.h"
#include "src/transport/ucx/ucx_api.h"

namespace squall::transport {
namespace {

constexpr int kSequenceBits = 24;
constexpr int kStepBits = 20;
constexpr int kRankBits = 20;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};
constexpr auto kMaxSleep = std::chrono::milliseconds(100);
constexpr int kEmptyWakeupsBeforeNap = 4;
constexpr auto kNap = std::chrono::microseconds(200);
// Long enough for a live peer on a loaded host (ranks sharing cores) to take
// an eager transfer; a peer that is gone is noticed by error handling anyway.
constexpr auto kCancelGrace = std::chrono::seconds(1);
constexpr auto kCloseTimeout = std::chrono::seconds(3);

ucp_tag_t ucxTag(const Tag& tag, int source) {
  return (static_cast<uint64_t>(source) << (kSequenceBits + kStepBits)) |
         (static_cast<uint64_t>(tag.step & ((1u << kStepBits) - 1)) << kSequenceBits) |
         (tag.sequence & ((uint64_t{1} << kSequenceBits) - 1));
}

class UcxTransport;

class UcxRequest final : public HeaderedRequest<UcxRequest> {
 public:
  UcxRequest(UcxTransport* owner, bool isSend, int peer, const Tag& tag, void* data, size_t bytes)
      : HeaderedRequest(isSend, peer, tag, data, bytes), owner_(owner) {}
  ~UcxRequest() override;

 private:
  friend class UcxTransport;
  UcxTransport* owner_;  // nullptr once the transport is gone
  ucp_dt_iov_t iov_[2];
  ucp_tag_recv_info_t info_{};
  void* handle_ = nullptr;  // the UCX request while UCX holds our buffers
  bool cancelling_ = false;
  size_t oversized_ = 0;  // the length of a message over the cap, received truncated
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(int rank, int size, std::chrono::microseconds spin)
      : rank_(rank), size_(size), eps_(size, nullptr), failure_(size), spin_(spin) {
    slots_.reserve(size);
    for (int i = 0; i < size; ++i) slots_.push_back(PeerSlot{this, i});
  }
  ~UcxTransport() override;

  Status init(bootstrap::Bootstrap& bootstrap);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "ucx"; }

  Status send(int peer, const Tag& tag, const void* data, size_t bytes,
              RequestPtr* request) override;
  Status recv(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) override;
  Status progress() override;
  Status waitForActivity(Deadline until) override;

  void cancel(UcxRequest* r);

 private:
  struct PeerSlot {
    UcxTransport* owner;
    int rank;
  };

  static void onSend(void* handle, ucs_status_t status, void* user);
  static void onRecv(void* handle, ucs_status_t status, const ucp_tag_recv_info_t* info,
                     void* user);
  static void onPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

  Status openWorker(bool wakeup);
  Status wireUp(std::chrono::milliseconds timeout);
  Status checkPeer(int peer, const char* what) const;
  void post(UcxRequest* r, ucp_tag_message_h message, size_t length);
  void matchReceives();
  void finish(UcxRequest* r, ucs_status_t status, size_t length);
  void markFailed(int peer, ucs_status_t status);
  void closeEndpoint(int peer, bool force);

  const int rank_;
  const int size_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<ucp_ep_h> eps_;
  std::vector<PeerSlot> slots_;       // error-callback arguments; never reallocated
  std::vector<std::string> failure_;  // why a peer is unusable; empty while healthy
  PendingRequests<UcxRequest> pending_;
  std::vector<void*> closing_;            // endpoint-close requests
  const std::chrono::microseconds spin_;  // WaitOptions::spin
  uint64_t activity_ = 0;                 // bumped whenever a request moves
  uint64_t seenActivity_ = 0;             // activity_ when waitForActivity last returned
  int emptyWakeups_ = 0;                  // wakeups in a row that moved nothing
  // How the waits went, said at INFO when the transport closes: sleeps that
  // ran into their timeout are wakeups UCX never signalled.
  struct WaitCounts {
    uint64_t sleeps = 0, timeouts = 0, naps = 0;
    Clock::duration slept{};
  } waits_;
  bool shuttingDown_ = false;
  const bool peerFailure_ = paramBool(Param::kUcxPeerFailure);
  const size_t maxMessageBytes_ =
      static_cast<size_t>(std::max<int64_t>(paramInt(Param::kUnexpectedMessageMaxBytes), 1));
};

UcxRequest::~UcxRequest() {
  if (owner_ != nullptr && !done()) owner_->cancel(this);
}

namespace {

// True when the host has an RDMA device (InfiniBand, RoCE, iWARP all appear
// in /sys/class/infiniband).
bool hostHasRdma() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

}  // namespace

Status UcxTransport::openWorker(bool wakeup) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucx().ucp_config_read(nullptr, nullptr, &config);
  SQUALL_REQUIRE(st == UCS_OK, Status::kSystemError, Subsys::kTransport,
                 "could not read the UCX configuration: %s; check the UCX_* environment "
                 "variables",
                 ucx().ucs_status_string(st));
  const std::string rndv = ucxRendezvousThreshold(
      paramString(Param::kUcxRndvThresh), std::getenv("UCX_RNDV_THRESH") != nullptr, hostHasRdma());
  if (!rndv.empty()) {
    st = ucx().ucp_config_modify(config, "RNDV_THRESH", rndv.c_str());
    if (st != UCS_OK) {
      ucx().ucp_config_release(config);
      return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kTransport,
                         "UCX refused RNDV_THRESH=%s (from SQUALL_UCX_RNDV_THRESH): %s; use a "
                         "size such as 64k, inf, auto (Squall's choice) or ucx (UCX's own)",
                         rndv.c_str(), ucx().ucs_status_string(st));
    }
    SQUALL_INFO(Subsys::kTransport, "UCX rendezvous threshold %s", rndv.c_str());
  }
  // SQUALL_SOCKET_IFNAME names the one interface the job may use; UCX would
  // otherwise listen and connect on every one. The user's UCX_NET_DEVICES wins.
  const std::string ifname = paramString(Param::kSocketIfname);
  if (!ifname.empty() && std::getenv("UCX_NET_DEVICES") == nullptr) {
    st = ucx().ucp_config_modify(config, "NET_DEVICES", ifname.c_str());
    if (st != UCS_OK) {
      ucx().ucp_config_release(config);
      return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kTransport,
                         "UCX refused NET_DEVICES=%s (from SQUALL_SOCKET_IFNAME): %s; name an "
                         "interface of this host (ip link) or set UCX_NET_DEVICES",
                         ifname.c_str(), ucx().ucs_status_string(st));
    }
    SQUALL_INFO(Subsys::kTransport, "UCX restricted to interface %s", ifname.c_str());
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_TAG | (wakeup ? UCP_FEATURE_WAKEUP : 0);
  params.estimated_num_eps = static_cast<size_t>(size_);
  st = ucx().init(&params, config, &context_);
  ucx().ucp_config_release(config);
  if (st != UCS_OK) {
    context_ = nullptr;
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "rank %d could not initialise UCX: %s; check UCX_TLS and "
                       "UCX_NET_DEVICES, or choose another transport",
                       rank_, ucx().ucs_status_string(st));
  }
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucx().ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "rank %d could not create a UCX worker: %s; check UCX_TLS and "
                       "UCX_NET_DEVICES",
                       rank_, ucx().ucs_status_string(st));
  }
  if (wakeup && ucx().ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;
  return Status::kOk;
}

Status UcxTransport::init(bootstrap::Bootstrap& bootstrap) {
  SQUALL_REQUIRE(size_ <= (1 << kRankBits), Status::kUnsupported, Subsys::kTransport,
                 "the UCX transport supports at most %d ranks, not %d; use fewer ranks",
                 1 << kRankBits, size_);
  // A rank that cannot load UCX fails here but still takes part in the
  // exchanges below, so that its peers fail too instead of timing out.
  Status opened =
      requireUcx("", "or choose the TCP transport (SQUALL_TRANSPORT=tcp, squallTransportTcp)");
  // Some transports cannot signal events; fall back to polling rather than
  // refusing to run.
  if (opened == Status::kOk && (opened = openWorker(true)) != Status::kOk) {
    if (context_ != nullptr) {
      ucx().ucp_cleanup(context_);
      context_ = nullptr;
    }
    SQUALL_INFO(Subsys::kTransport, "UCX without wakeup support; waits will poll");
    opened = openWorker(false);
  }
  ucp_address_t* address = nullptr;
  size_t addressBytes = 0;
  if (opened == Status::kOk &&
      ucx().ucp_worker_get_address(worker_, &address, &addressBytes) != UCS_OK) {
    opened = SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                         "rank %d could not get its UCX worker address", rank_);
  }
  // Every rank takes part in both exchanges even when its own setup failed
  // (length 0), so a local failure becomes a clear error everywhere instead
  // of a bootstrap timeout.
  uint64_t mine = opened == Status::kOk ? addressBytes : 0;
  std::vector<uint64_t> lengths(size_);
  Status gathered = bootstrap.allGather(&mine, sizeof(mine), lengths.data());
  if (gathered != Status::kOk) {
    if (address != nullptr) ucx().ucp_worker_release_address(worker_, address);
    return gathered;
  }
  if (opened != Status::kOk) return opened;
  for (int i = 0; i < size_; ++i) {
    if (lengths[i] == 0) {
      ucx().ucp_worker_release_address(worker_, address);
      return SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "rank %d could not start UCX (see its log); every rank must be able "
                         "to use the UCX transport",
                         i);
    }
  }
  size_t width = *std::max_element(lengths.begin(), lengths.end());
  std::vector<uint8_t> padded(width, 0), all(width * size_);
  std::memcpy(padded.data(), address, addressBytes);
  ucx().ucp_worker_release_address(worker_, address);
  SQUALL_TRY(bootstrap.allGather(padded.data(), width, all.data()));

  for (int peer = 0; peer < size_; ++peer) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(all.data() + peer * width);
    ep.err_mode = peerFailure_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &UcxTransport::onPeerError;
    ep.err_handler.arg = &slots_[peer];
    ucs_status_t st = ucx().ucp_ep_create(worker_, &ep, &eps_[peer]);
    if (st != UCS_OK) {
      eps_[peer] = nullptr;
      return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                         "rank %d could not create a UCX endpoint to rank %d: %s; the ranks "
                         "may have no transport in common (check UCX_TLS and UCX_NET_DEVICES "
                         "on both)",
                         rank_, peer, ucx().ucs_status_string(st));
    }
  }
  SQUALL_TRY(wireUp(bootstrap.timeout()));
  SQUALL_INFO(Subsys::kTransport, "rank %d: UCX transport up with %d ranks (%s waits)", rank_,
              size_, efd_ >= 0 ? "blocking" : "polling");
  return Status::kOk;
}

// UCX connects an endpoint on its first message, in a handshake that needs
// the peer's worker to progress. A peer busy elsewhere (in a bootstrap
// barrier, computing) would then stall even a small eager send, which should
// complete on its own. So every pair exchanges one empty message here, while
// every rank progresses. The tag is the highest (sequence, step) the UCX tag
// holds; these messages are all received before init returns, so nothing
// later can match them.
Status UcxTransport::wireUp(std::chrono::milliseconds timeout) {
  Tag tag;
  tag.sequence = (uint64_t{1} << kSequenceBits) - 1;
  tag.step = (1u << kStepBits) - 1;
  std::vector<RequestPtr> requests(2 * static_cast<size_t>(size_));
  for (int peer = 0; peer < size_; ++peer) {
    SQUALL_TRY(recv(peer, tag, nullptr, 0, &requests[2 * static_cast<size_t>(peer)]));
    SQUALL_TRY(send(peer, tag, nullptr, 0, &requests[2 * static_cast<size_t>(peer) + 1]));
  }
  return waitAll(requests, Clock::now() + timeout);
}

UcxTransport::~UcxTransport() {
  shuttingDown_ = true;
  SQUALL_INFO(Subsys::kTransport,
              "rank %d: UCX waits slept %llu times for %.1f ms in all, %llu ran into their "
              "timeout, %llu naps after empty wakeups",
              rank_, static_cast<unsigned long long>(waits_.sleeps),
              std::chrono::duration<double, std::milli>(waits_.slept).count(),
              static_cast<unsigned long long>(waits_.timeouts),
              static_cast<unsigned long long>(waits_.naps));
  if (worker_ != nullptr) {
    // Requests still pending are a caller bug; cancel them so UCX lets go of
    // their buffers before the worker disappears.
    for (UcxRequest* r : pending_.waiting) r->waiting_ = false;
    pending_.waiting.clear();
    // Cancelling may complete a request on the spot, which unlinks it.
    std::vector<UcxRequest*> pendingRequests(pending_.live.begin(), pending_.live.end());
    for (UcxRequest* r : pendingRequests) {
      r->cancelling_ = true;
      if (r->handle_ != nullptr) ucx().ucp_request_cancel(worker_, r->handle_);
    }
    // A flush close lets queued eager data reach healthy peers; failed
    // endpoints and ones with transfers left must be forced.
    bool force = peerFailure_ && !pending_.live.empty();
    for (int peer = 0; peer < size_; ++peer)
      if (eps_[peer] != nullptr) closeEndpoint(peer, force || !failure_[peer].empty());
    Deadline deadline = Clock::now() + kCloseTimeout;
    auto pending = [&] {
      bool any = false;
      for (void* c : closing_) any |= ucx().ucp_request_check_status(c) == UCS_INPROGRESS;
      for (UcxRequest* r : pending_.live) any |= r->handle_ != nullptr;
      return any;
    };
    while (pending() && Clock::now() < deadline) ucx().ucp_worker_progress(worker_);
    for (void* c : closing_) ucx().ucp_request_free(c);
    for (UcxRequest* r : pending_.live) {
      r->owner_ = nullptr;
      if (!r->done()) r->complete(Status::kRemoteError);
    }
    ucx().ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) ucx().ucp_cleanup(context_);
}

void UcxTransport::closeEndpoint(int peer, bool force) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t closing = ucx().ucp_ep_close_nbx(eps_[peer], &param);
  eps_[peer] = nullptr;
  if (UCS_PTR_IS_PTR(closing)) closing_.push_back(closing);
}

void UcxTransport::onPeerError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* slot = static_cast<PeerSlot*>(arg);
  slot->owner->markFailed(slot->rank, status);
}

void UcxTransport::markFailed(int peer, ucs_status_t status) {
  if (shuttingDown_) return;
  if (!failure_[peer].empty()) {
    // Said once per peer; every later request that fails for it carries the
    // same description (a request must never fail without one).
    setLastError(failure_[peer]);
    return;
  }
  char text[256];
  std::snprintf(text, sizeof(text),
                "rank %d's UCX endpoint failed: %s; it may have crashed or lost its network "
                "connection (seen by rank %d)",
                peer, ucx().ucs_status_string(status), rank_);
  failure_[peer] = text;
  SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport, "%s", text);
}

Status UcxTransport::checkPeer(int peer, const char* what) const {
  SQUALL_REQUIRE(peer >= 0 && peer < size_, Status::kInvalidArgument, Subsys::kTransport,
                 "%s rank %d is outside the group of %d ranks", what, peer, size_);
  return Status::kOk;
}

Status UcxTransport::send(int peer, const Tag& tag, const void* data, size_t bytes,
                          RequestPtr* request) {
  SQUALL_TRY(checkPeer(peer, "send to"));
  auto r = std::make_unique<UcxRequest>(this, true, peer, tag, const_cast<void*>(data), bytes);
  if (!failure_[peer].empty()) {
    setLastError(failure_[peer]);  // logged once, when the peer failed
    r->complete(Status::kRemoteError);
    *request = std::move(r);
    return Status::kOk;
  }
  encodeMessageHeader(tag, bytes, r->header());
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  param.cb.send = &UcxTransport::onSend;
  param.user_data = r.get();
  void* buffer = r->header();
  size_t count = kMessageHeaderBytes;
  param.datatype = ucp_dt_make_contig(1);
  if (bytes > 0) {
    r->iov_[0] = {r->header(), kMessageHeaderBytes};
    r->iov_[1] = {r->data(), bytes};
    buffer = r->iov_;
    count = 2;
    param.datatype = ucp_dt_make_iov();
  }
  pending_.track(r.get());
  ucs_status_ptr_t sent =
      ucx().ucp_tag_send_nbx(eps_[peer], buffer, count, ucxTag(tag, rank_), &param);
  if (UCS_PTR_IS_PTR(sent)) {
    r->handle_ = sent;
  } else {
    finish(r.get(), UCS_PTR_STATUS(sent), 0);
  }
  *request = std::move(r);
  return Status::kOk;
}

Status UcxTransport::recv(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) {
  SQUALL_TRY(checkPeer(peer, "receive from"));
  auto r = std::make_unique<UcxRequest>(this, false, peer, tag, data, bytes);
  pending_.queueReceive(r.get());
  *request = std::move(r);
  return Status::kOk;
}

void UcxTransport::post(UcxRequest* r, ucp_tag_message_h message, size_t length) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_RECV_INFO;
  param.cb.recv = &UcxTransport::onRecv;
  param.user_data = r;
  param.recv_info.tag_info = &r->info_;
  param.datatype = ucp_dt_make_contig(1);
  void* buffer;
  size_t count = length;
  if (!r->fits(length) && length > kMessageHeaderBytes &&
      length - kMessageHeaderBytes > maxMessageBytes_) {
    // A message of the wrong size is taken whole into a bounce buffer to
    // report the mismatch, but never one over the cap: its length comes from
    // the sender, so only its header is taken (UCX truncates the rest) and
    // the peer is failed.
    r->oversized_ = length;
    buffer = r->bounce(kMessageHeaderBytes);
    count = kMessageHeaderBytes;
  } else if (!r->fits(length)) {
    buffer = r->bounce(length);
  } else if (r->bytes() == 0) {
    buffer = r->header();
  } else {
    r->iov_[0] = {r->header(), kMessageHeaderBytes};
    r->iov_[1] = {r->data(), r->bytes()};
    buffer = r->iov_;
    count = 2;
    param.datatype = ucp_dt_make_iov();
  }
  ucs_status_ptr_t received = ucx().ucp_tag_msg_recv_nbx(worker_, buffer, count, message, &param);
  if (UCS_PTR_IS_PTR(received)) {
    r->handle_ = received;
    ++activity_;
  } else {
    finish(r, UCS_PTR_STATUS(received), length);
  }
}

void UcxTransport::matchReceives() {
  for (auto it = pending_.waiting.begin(); it != pending_.waiting.end();) {
    UcxRequest* r = *it;
    ucp_tag_recv_info_t info;
    ucp_tag_message_h message =
        ucx().ucp_tag_probe_nb(worker_, ucxTag(r->tag(), r->peer()), kFullMask, 1, &info);
    if (message != nullptr) {
      it = pending_.matched(r);
      post(r, message, info.length);
    } else if (!failure_[r->peer()].empty()) {
      // Nothing buffered from a failed peer: nothing ever will be. The
      // failure was described when it was detected.
      it = pending_.matched(r);
      finish(r, UCS_ERR_CONNECTION_RESET, 0);
    } else {
      ++it;
    }
  }
}

void UcxTransport::onSend(void* handle, ucs_status_t status, void* user) {
  auto* r = static_cast<UcxRequest*>(user);
  r->handle_ = nullptr;
  ucx().ucp_request_free(handle);
  r->owner_->finish(r, status, 0);
}

void UcxTransport::onRecv(void* handle, ucs_status_t status, const ucp_tag_recv_info_t* info,
                          void* user) {
  auto* r = static_cast<UcxRequest*>(user);
  r->handle_ = nullptr;
  size_t length = status == UCS_OK ? info->length : 0;
  ucx().ucp_request_free(handle);
  r->owner_->finish(r, status, length);
}

void UcxTransport::finish(UcxRequest* r, ucs_status_t status, size_t length) {
  pending_.untrack(r);
  ++activity_;
  Status result = Status::kOk;
  if (r->cancelling_) {
    result = Status::kRemoteError;  // nobody will look: the request is being destroyed
  } else if (r->oversized_ != 0 && failure_[r->peer()].empty()) {
    char text[384];
    std::snprintf(text, sizeof(text),
                  "rank %d sent a %zu-byte UCX message where rank %d expected %zu payload bytes "
                  "for %s; it exceeds SQUALL_UNEXPECTED_MESSAGE_MAX_BYTES=%zu, so it was not "
                  "buffered and rank %d treats rank %d as failed",
                  r->peer(), r->oversized_ - kMessageHeaderBytes, rank_, r->bytes(),
                  describe(r->tag()).c_str(), maxMessageBytes_, rank_, r->peer());
    failure_[r->peer()] = text;
    SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport, "%s", text);
    result = Status::kRemoteError;
  } else if (status != UCS_OK) {
    markFailed(r->peer(), status);  // describes it (once per peer in the log)
    result = Status::kRemoteError;
  } else if (!r->isSend()) {
    result = r->checkReceived("UCX", rank_, length);
  }
  r->complete(result);
}

void UcxTransport::cancel(UcxRequest* r) {
  if (r->waiting_) {
    pending_.untrack(r);
    return;
  }
  if (r->handle_ == nullptr) return;
  r->cancelling_ = true;
  ucx().ucp_request_cancel(worker_, r->handle_);
  Deadline forceAt = Clock::now() + kCancelGrace;
  bool warned = false;
  while (r->handle_ != nullptr) {
    // Idle rounds give the core away: the peer that must take the data may
    // be waiting for it.
    if (ucx().ucp_worker_progress(worker_) == 0) std::this_thread::yield();
    if (r->handle_ == nullptr || eps_[r->peer()] == nullptr || Clock::now() < forceAt) continue;
    if (!peerFailure_) {
      // Forcing a close is undefined without peer error handling: all we
      // can do is wait for the peer to take the data.
      if (!warned)
        SQUALL_WARN(Subsys::kTransport,
                    "rank %d is waiting for rank %d to take a cancelled %zu-byte transfer: "
                    "UCX cannot abandon it with SQUALL_UCX_PEER_FAILURE=0",
                    rank_, r->peer(), r->bytes());
      warned = true;
      continue;
    }
    if (failure_[r->peer()].empty()) {
      char text[256];
      std::snprintf(text, sizeof(text),
                    "rank %d's UCX endpoint was closed because a transfer with it was "
                    "abandoned mid-flight; the pair's message stream is broken",
                    r->peer());
      failure_[r->peer()] = text;
      SQUALL_WARN(Subsys::kTransport, "%s", text);
    }
    closeEndpoint(r->peer(), true);
  }
}

Status UcxTransport::progress() {
  // Drain: the worker can only be armed once ucp_worker_progress reports no
  // more events (a partial drain makes ucp_worker_arm answer busy).
  while (ucx().ucp_worker_progress(worker_) != 0) {
  }
  matchReceives();
  return Status::kOk;
}

Status UcxTransport::waitForActivity(Deadline until) {
  bool spun = false;
  for (;;) {
    SQUALL_TRY(progress());
    // activity_ moved since the last return from here: the caller must look
    // at its requests before anyone sleeps. This includes progress the
    // caller ran itself between two waits (waitAll calls progress() first),
    // which a snapshot taken on entry would miss.
    if (activity_ != seenActivity_) {
      emptyWakeups_ = 0;
      break;
    }
    Deadline now = Clock::now();
    if (now >= until) break;
    if (spin_.count() > 0 && !spun) {
      // Poll before sleeping (WaitOptions): a reply that lands within the
      // window is taken without arming the worker and waking up again.
      spun = true;
      const Deadline stop = std::min(until, now + spin_);
      // The CPU is yielded between polls: UCX's own async thread (its TCP
      // transport's events) shares the core, and starving it until the end of
      // a time slice cost more than sleeping would.
      while (activity_ == seenActivity_ && Clock::now() < stop) {
        SQUALL_TRY(progress());
        if (activity_ == seenActivity_) sched_yield();
      }
      if (activity_ != seenActivity_) continue;
      now = Clock::now();
    }
    if (efd_ < 0) {
      std::this_thread::yield();
      break;
    }
    ucs_status_t st = ucx().ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events arrived since the drain: progress them
    SQUALL_REQUIRE(st == UCS_OK, Status::kSystemError, Subsys::kTransport,
                   "rank %d could not arm its UCX worker for a blocking wait: %s", rank_,
                   ucx().ucs_status_string(st));
    auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now);
    pollfd fd{efd_, POLLIN, 0};
    int timeout = static_cast<int>(std::clamp<int64_t>(left.count(), 1, kMaxSleep.count()));
    const Deadline asleep = Clock::now();
    int ready = poll(&fd, 1, timeout);
    ++waits_.sleeps;
    waits_.slept += Clock::now() - asleep;
    if (ready == 0) ++waits_.timeouts;
    if (ready < 0 && errno != EINTR) {
      return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                         "rank %d could not wait on its UCX event descriptor: %s", rank_,
                         std::strerror(errno));
    }
    // The descriptor can stay readable without anything for us to do (a TCP
    // connection whose peer is not progressing yet keeps signalling); after a
    // few such empty wakeups, nap briefly so the wait does not turn into a
    // spin.
    if (ready == 0) emptyWakeups_ = 0;
    if (ready > 0 && ++emptyWakeups_ > kEmptyWakeupsBeforeNap) {
      ++waits_.naps;
      std::this_thread::sleep_for(std::min<Clock::duration>(kNap, until - Clock::now()));
    }
    break;
  }
  seenActivity_ = activity_;
  return Status::kOk;
}

}  // namespace

std::string ucxRendezvousThreshold(const std::string& param, bool userSetting, bool rdma) {
  if (param == "ucx") return std::string();
  if (param != "auto") return param;
  return userSetting || rdma ? std::string() : std::string("inf");
}

Status createUcxTransport(bootstrap::Bootstrap& bootstrap, std::unique_ptr<Transport>* out) {
  return createUcxTransport(bootstrap, out, WaitOptions{});
}

Status createUcxTransport(bootstrap::Bootstrap& bootstrap, std::unique_ptr<Transport>* out,
                          const WaitOptions& wait) {
  auto transport = std::make_unique<UcxTransport>(bootstrap.rank(), bootstrap.size(), wait.spin);
  SQUALL_TRY(transport->init(bootstrap));
  *out = std::move(transport);
  return Status::kOk;
}

}  // namespace squall::transport
