// The net's UCX data plane (SQUALL_NET_TRANSPORT=ucx, or auto when UCX
// starts): the same connections as the TCP plane, over UCP, so UCX picks
// RDMA on IB/RoCE where it finds it and TCP otherwise. UCX is opened at run
// time: every call goes through the table of src/transport/ucx/ucx_api.h.
//
// One UCP context and worker per process, shared by every connection and
// driven under one lock (the worker is single-threaded; NCCL's proxy threads
// and communicators take turns). It lives while any UCX listener, connection
// or pending connect does, so NCCL's unload finds no UCX thread of ours.
//
// Connection setup. A worker address does not fit NCCL's 128-byte handle, so
// listen() opens a UCP listener on the device's IP (port 0) and the handle
// carries that IP:port, a random nonce naming the listener and a connection
// number unique in the listening process. connect() creates an endpoint to
// the address and sends a hello (an active message asking for a reply
// endpoint) with the nonce; accept() turns the listener's connection
// requests into endpoints, and answers the hello that comes on one of them:
// yes when the nonce is its own, no otherwise. So a stale handle (nobody
// listening: the endpoint fails), a foreign one (refused) and a silent
// listener (no answer by SQUALL_TIMEOUT_S) all fail connect in bounded time.
//
// Data. Tagged messages, tag = connection (20 bits) | sequence (20) | NCCL
// tag (low 24); the connection field is scrambled with a per-process random
// key and the sequence starts at a value taken from the listener's nonce
// (firstSequence), so nobody outside the two ends can predict a tag. The sender numbers its sends;
// the receiver's k-th posted receive owns the next n sequence numbers (n buffers of a grouped
// receive), probes UCX for each with the NCCL-tag bits masked off, puts each message in the free
// buffer whose tag matches, and receives it straight there. Probing first gives the length: a
// receive larger than the send is fine, a send larger than its receive fails the connection instead
// of truncating. Zero-byte messages are ordinary messages. Requests progress in test().
//
// Bounded calls. isend, irecv and test each run the worker for at most
// kProgressRounds rounds and place at most kMaxMatchesPerCall messages, so
// one call never drains a whole window of traffic while NCCL's other
// channels wait for the proxy; what is left is picked up by the next call.
// (How much one round moves is UCX's: over its TCP transport, without an
// RDMA NIC, a round writes or reads what the socket takes.)
//
// Failure. Endpoints use UCX's peer error handling: a dead peer fails the
// endpoint, UCX fails what is in flight on it, and receives with nothing
// buffered fail in test(), all with kRemoteError.
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "plugin/nccl/abi/net_abi.h"
#include "plugin/nccl/net.h"
#include "src/bootstrap/bootstrap.h"
#include "src/transport/ucx/ucx_api.h"

namespace squall::nccl_plugin {
namespace {

using Clock = std::chrono::steady_clock;
using bootstrap::SocketAddress;
using transport::ucx;

constexpr uint32_t kAmHello = 0x5351;
constexpr uint32_t kAmAnswer = 0x5352;
constexpr uint32_t kHelloMagic = 0x53515548;  // "SQUH"
constexpr uint32_t kConnectionBits = 20;
constexpr uint32_t kSequenceBits = 20;
constexpr uint32_t kTagBits = 24;
constexpr ucp_tag_t kTagMask = (ucp_tag_t{1} << kTagBits) - 1;
constexpr ucp_tag_t kMatchMask = ~kTagMask;  // connection and sequence
constexpr uint32_t kSequenceMask = (1u << kSequenceBits) - 1;
constexpr size_t kMaxOutstanding = static_cast<size_t>(nccl_abi::kMaxRequests) * kMaxRecvs;
constexpr auto kCloseTimeout = std::chrono::seconds(2);
// Worker rounds and message placements per data call (see above).
constexpr int kProgressRounds = 2;
constexpr int kMaxMatchesPerCall = kMaxRecvs;

// Where a connection's sequence numbers start: from the listener's nonce,
// which only the two ends know (it travels in the handle, through NCCL's
// bootstrap). Tag matching is worker-wide and does not check the sending
// endpoint, so a message's tag is what tells a connection's data from a
// forgery: an endpoint the listener refused still reaches the worker, and
// with both the connection field and the sequence unpredictable it would
// have to guess 40 bits to land a message in a receive.
uint32_t firstSequence(uint64_t nonce) {
  return static_cast<uint32_t>(nonce >> 32) & kSequenceMask;
}

ucp_tag_t makeTag(uint32_t connection, uint32_t sequence, int tag) {
  return (static_cast<ucp_tag_t>(connection) << (kSequenceBits + kTagBits)) |
         (static_cast<ucp_tag_t>(sequence & kSequenceMask) << kTagBits) |
         (static_cast<ucp_tag_t>(static_cast<uint32_t>(tag)) & kTagMask);
}

struct Hello {
  uint32_t magic;
  uint32_t accepted;  // the answer: 1 yes, 0 no
  uint64_t nonce;
};

// One UCP endpoint and what arrived on it. Kept until the worker goes, so
// UCX's callbacks never see a freed one.
struct Endpoint {
  ucp_ep_h ep = nullptr;
  bool failed = false;
  std::string why;
  bool gotHello = false;  // the other side's hello (or answer) came
  Hello in{};
  Hello out{};  // what we sent; UCX may read it until the send completes
};

struct Listen;

struct State {
  std::mutex mutex;  // every UCX call and every object below
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int users = 0;
  uint32_t nextConnection = 1;
  // Connection fields are nextConnection XOR this (random, nonzero): unique
  // on this worker like the counter, unpredictable from outside.
  uint32_t connectionKey = 0;
  std::map<ucp_ep_h, Endpoint*> byEp;
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  std::vector<void*> closing;  // endpoint-close requests
};

State& state() {
  static State s;
  return s;
}

void onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* e = static_cast<Endpoint*>(arg);
  if (e->failed) return;
  e->failed = true;
  e->why = ucx().ucs_status_string(status);
  // A peer that closes its end normally lands here too; the requests it
  // fails say so at warning level.
  SQUALL_INFO(Subsys::kTransport, "NET/Squall: UCX endpoint failed: %s", e->why.c_str());
}

ucs_status_t onHello(void* /*arg*/, const void* header, size_t headerBytes, void* /*data*/,
                     size_t /*bytes*/, const ucp_am_recv_param_t* param) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || headerBytes != sizeof(Hello))
    return UCS_OK;
  auto it = state().byEp.find(param->reply_ep);
  if (it == state().byEp.end()) return UCS_OK;
  std::memcpy(&it->second->in, header, sizeof(Hello));
  it->second->gotHello = true;
  return UCS_OK;
}

void freeWhenDone(void* request, ucs_status_t, void*) { ucx().ucp_request_free(request); }

// Sends `e->out` as active message `id`, asking for a reply endpoint. UCX
// may hold the message until the endpoint's wireup finishes, which takes
// this side's worker: with `waitSentMs` > 0 the worker runs until the
// message has left (or the endpoint failed, or the time is up). accept()
// waits for its answer so: the connecting side waits for nothing else, and
// the accepting process may not call the plugin again for a while (NCCL's
// bootstrap between setup and the first collective).
void sendHello(Endpoint* e, uint32_t id, int64_t waitSentMs = 0) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  if (waitSentMs == 0) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK;
    param.cb.send = &freeWhenDone;
  }
  ucs_status_ptr_t sent =
      ucx().ucp_am_send_nbx(e->ep, id, &e->out, sizeof(Hello), nullptr, 0, &param);
  if (UCS_PTR_IS_ERR(sent) && !e->failed) {
    e->failed = true;
    e->why = ucx().ucs_status_string(UCS_PTR_STATUS(sent));
  }
  if (waitSentMs == 0 || !UCS_PTR_IS_PTR(sent)) return;
  auto deadline = Clock::now() + std::chrono::milliseconds(waitSentMs);
  while (ucx().ucp_request_check_status(sent) == UCS_INPROGRESS && !e->failed &&
         Clock::now() < deadline)
    ucx().ucp_worker_progress(state().worker);
  ucx().ucp_request_free(sent);  // a send still in flight goes on without us
}

Endpoint* track(ucp_ep_h ep, std::unique_ptr<Endpoint> e) {
  Endpoint* raw = e.get();
  raw->ep = ep;
  state().byEp[ep] = raw;
  state().endpoints.push_back(std::move(e));
  return raw;
}

void closeEndpoint(Endpoint* e, bool force) {
  if (e->ep == nullptr) return;
  state().byEp.erase(e->ep);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force || e->failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t closing = ucx().ucp_ep_close_nbx(e->ep, &param);
  e->ep = nullptr;
  if (UCS_PTR_IS_PTR(closing)) state().closing.push_back(closing);
}

// Connection setup and teardown: run the worker until it is idle (bounded).
void drain() {
  for (int i = 0; i < 64 && ucx().ucp_worker_progress(state().worker) != 0; ++i) {
  }
}

// A data call's share of the worker.
void progressSome() {
  for (int i = 0; i < kProgressRounds && ucx().ucp_worker_progress(state().worker) != 0; ++i) {
  }
}

Status openWorker() {
  // A connect to a peer's UCX listener comes here even where netPlane()
  // chose TCP because UCX cannot be loaded.
  SQUALL_TRY(
      transport::requireUcx("NET/Squall: ", "or set SQUALL_NET_TRANSPORT=tcp on every node"));
  State& s = state();
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucx().ucp_config_read(nullptr, nullptr, &config);
  SQUALL_REQUIRE(st == UCS_OK, Status::kSystemError, Subsys::kTransport,
                 "NET/Squall: cannot read the UCX configuration: %s; check the UCX_* variables",
                 ucx().ucs_status_string(st));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM;
  st = ucx().init(&params, config, &s.context);
  ucx().ucp_config_release(config);
  if (st != UCS_OK) {
    s.context = nullptr;
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "NET/Squall: cannot initialise UCX: %s; check UCX_TLS and UCX_NET_DEVICES, "
                       "or set SQUALL_NET_TRANSPORT=tcp",
                       ucx().ucs_status_string(st));
  }
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;  // s.mutex serialises every call
  st = ucx().ucp_worker_create(s.context, &wparams, &s.worker);
  if (st == UCS_OK) {
    for (uint32_t id : {kAmHello, kAmAnswer}) {
      ucp_am_handler_param_t handler{};
      handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                           UCP_AM_HANDLER_PARAM_FIELD_ARG;
      handler.id = id;
      handler.cb = &onHello;
      handler.arg = nullptr;
      if (st == UCS_OK) st = ucx().ucp_worker_set_am_recv_handler(s.worker, &handler);
    }
  }
  if (st != UCS_OK) {
    if (s.worker != nullptr) ucx().ucp_worker_destroy(s.worker);
    ucx().ucp_cleanup(s.context);
    s.worker = nullptr;
    s.context = nullptr;
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "NET/Squall: cannot create a UCX worker: %s; check UCX_TLS and "
                       "UCX_NET_DEVICES, or set SQUALL_NET_TRANSPORT=tcp",
                       ucx().ucs_status_string(st));
  }
  return Status::kOk;
}

// Under the lock: one more user of the worker (opened on the first).
Status acquire() {
  State& s = state();
  if (s.users == 0) SQUALL_TRY(openWorker());
  ++s.users;
  return Status::kOk;
}

// Under the lock: the last user closes every endpoint and the worker.
void release() {
  State& s = state();
  if (--s.users > 0) return;
  for (auto& e : s.endpoints) closeEndpoint(e.get(), true);
  auto deadline = Clock::now() + kCloseTimeout;
  auto busy = [&] {
    for (void* c : s.closing)
      if (ucx().ucp_request_check_status(c) == UCS_INPROGRESS) return true;
    return false;
  };
  while (busy() && Clock::now() < deadline) ucx().ucp_worker_progress(s.worker);
  for (void* c : s.closing) ucx().ucp_request_free(c);
  s.closing.clear();
  s.byEp.clear();
  s.endpoints.clear();
  ucx().ucp_worker_destroy(s.worker);
  ucx().ucp_cleanup(s.context);
  s.worker = nullptr;
  s.context = nullptr;
}

ucp_err_handler_t errorHandler(Endpoint* e) {
  ucp_err_handler_t h{};
  h.cb = &onEndpointError;
  h.arg = e;
  return h;
}

// ---- listen / connect / accept ----------------------------------------------

struct Listen : NetObject {
  Listen() : NetObject{kPlaneUcx} {}
  ucp_listener_h listener = nullptr;
  uint64_t nonce = 0;
  uint32_t connection = 0;                  // the tags' connection field of what this accepts
  std::deque<ucp_conn_request_h> requests;  // from UCX, not yet made endpoints
  std::vector<Endpoint*> pending;           // endpoints waiting for their hello
  bool accepted = false;
};

void onConnectionRequest(ucp_conn_request_h request, void* arg) {
  static_cast<Listen*>(arg)->requests.push_back(request);
}

struct PendingConnect {
  uint64_t nonce = 0;
  uint32_t connection = 0;
  Endpoint* e = nullptr;
  std::string where;
  Clock::time_point deadline;
};

std::map<const void*, std::unique_ptr<PendingConnect>>& connects() {
  static std::map<const void*, std::unique_ptr<PendingConnect>> m;
  return m;
}

// ---- data --------------------------------------------------------------------

struct Request;

struct Conn : NetObject {
  Conn(bool isSend, Endpoint* endpoint, uint32_t conn, uint64_t nonce)
      : NetObject{kPlaneUcx},
        send(isSend),
        e(endpoint),
        connection(conn),
        sequence(firstSequence(nonce)) {}
  bool send;
  Endpoint* e;
  uint32_t connection;
  uint32_t sequence;               // the next send's, or the next receive's first
  std::deque<Request*> unmatched;  // receives with messages still to find, in posting order
  std::unordered_set<Request*> live;
  Status failed = Status::kOk;
  std::string failure;
  std::vector<uint8_t> sink;  // takes a message that fits no buffer
};

// A UCX operation's user data; `request` is cleared when the request dies
// first, so a late completion only frees itself.
struct Op {
  Request* request;
  int slot;
};

struct Request : NetObject {
  Request() : NetObject{kPlaneUcx} {}
  Conn* conn = nullptr;
  bool send = false;
  int n = 1;
  void* data[kMaxRecvs];
  size_t capacity[kMaxRecvs];
  int tags[kMaxRecvs];
  size_t received[kMaxRecvs];
  bool assigned[kMaxRecvs];  // a message was placed in this buffer
  bool found[kMaxRecvs];     // sequence first + i was probed out of UCX
  uint32_t first = 0;
  int matched = 0;
  int completed = 0;
  Status error = Status::kOk;
  std::vector<std::pair<void*, Op*>> inFlight;  // UCX requests holding our buffers
};

void failConn(Conn* c, Status status, const std::string& why) {
  if (c->failed != Status::kOk) return;
  c->failed = status;
  c->failure = why;
  SQUALL_WARN(Subsys::kTransport, "NET/Squall: UCX %s connection failed: %s",
              c->send ? "send" : "receive", why.c_str());
}

void complete(Op* op, void* handle, ucs_status_t status, size_t length) {
  Request* r = op->request;
  if (r != nullptr) {
    for (auto it = r->inFlight.begin(); it != r->inFlight.end(); ++it)
      if (it->second == op) {
        r->inFlight.erase(it);
        break;
      }
    if (status == UCS_OK) {
      if (!r->send) r->received[op->slot] = length;
      ++r->completed;
    } else {
      r->error = Status::kRemoteError;
      failConn(r->conn, Status::kRemoteError,
               std::string("UCX failed a transfer: ") + ucx().ucs_status_string(status));
    }
  }
  delete op;
  if (handle != nullptr) ucx().ucp_request_free(handle);
}

void onSend(void* handle, ucs_status_t status, void* user) {
  complete(static_cast<Op*>(user), handle, status, 0);
}
void onRecv(void* handle, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  complete(static_cast<Op*>(user), handle, status, status == UCS_OK ? info->length : 0);
}

// Places the messages of the posted receives that UCX now holds, at most
// kMaxMatchesPerCall of them (each may copy an eager message).
void match(Conn* c) {
  int budget = kMaxMatchesPerCall;
  while (c->failed == Status::kOk && !c->unmatched.empty() && budget > 0) {
    bool progressed = false;
    for (auto it = c->unmatched.begin();
         it != c->unmatched.end() && c->failed == Status::kOk && budget > 0;) {
      Request* r = *it;
      for (int i = 0; i < r->n && c->failed == Status::kOk && budget > 0; ++i) {
        if (r->found[i]) continue;
        ucp_tag_recv_info_t info{};
        ucp_tag_message_h message = ucx().ucp_tag_probe_nb(
            state().worker, makeTag(c->connection, r->first + i, 0), kMatchMask, 1, &info);
        if (message == nullptr) continue;
        r->found[i] = true;
        ++r->matched;
        --budget;
        progressed = true;
        int tag = static_cast<int>(info.sender_tag & kTagMask);
        int slot = -1;
        for (int k = 0; k < r->n && slot < 0; ++k)
          if (!r->assigned[k] && (r->n == 1 || (static_cast<ucp_tag_t>(r->tags[k]) & kTagMask) ==
                                                   static_cast<ucp_tag_t>(tag)))
            slot = k;
        // A message that fits nowhere is still taken out of UCX, into a
        // throwaway buffer, and fails the connection.
        void* into = nullptr;
        if (slot < 0) {
          failConn(c, Status::kInvalidUsage,
                   "the peer sent a message with tag " + std::to_string(tag) +
                       " that matches no free buffer of the posted grouped receive");
        } else if (info.length > r->capacity[slot]) {
          failConn(c, Status::kInvalidUsage,
                   "the peer sent " + std::to_string(info.length) + " bytes into a receive of " +
                       std::to_string(r->capacity[slot]) +
                       " bytes; NCCL posts receives at least as large as the sends");
        } else {
          r->assigned[slot] = true;
          into = r->data[slot];
        }
        if (into == nullptr) {
          c->sink.resize(std::max<size_t>(info.length, 1));
          into = c->sink.data();
          slot = 0;
        }
        auto* op = new Op{c->failed == Status::kOk ? r : nullptr, slot};
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                             UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_RECV_INFO;
        param.cb.recv = &onRecv;
        param.user_data = op;
        param.datatype = ucp_dt_make_contig(1);
        ucp_tag_recv_info_t done{};
        param.recv_info.tag_info = &done;
        ucs_status_ptr_t got =
            ucx().ucp_tag_msg_recv_nbx(state().worker, into, info.length, message, &param);
        if (UCS_PTR_IS_PTR(got)) {
          if (op->request != nullptr) r->inFlight.push_back({got, op});
        } else {
          complete(op, nullptr, UCS_PTR_STATUS(got), info.length);
        }
      }
      if (r->matched == r->n)
        it = c->unmatched.erase(it);
      else
        ++it;
    }
    if (!progressed) break;
  }
  if (c->failed == Status::kOk && c->e->failed && !c->unmatched.empty())
    failConn(c, Status::kRemoteError, "the peer's endpoint failed: " + c->e->why);
}

void cancelAll(Request* r) {
  for (auto& [handle, op] : r->inFlight) {
    op->request = nullptr;
    ucx().ucp_request_cancel(state().worker, handle);
  }
  r->inFlight.clear();
}

}  // namespace

Status ucxAvailable() {
  std::lock_guard<std::mutex> lock(state().mutex);
  SQUALL_TRY(acquire());
  release();
  return Status::kOk;
}

Status ucxListen(const SocketAddress& address, void* handle, void** listenComm) {
  std::lock_guard<std::mutex> lock(state().mutex);
  SQUALL_TRY(acquire());
  auto l = std::make_unique<Listen>();
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address.storage);
  params.sockaddr.addrlen = address.length;
  params.conn_handler.cb = &onConnectionRequest;
  params.conn_handler.arg = l.get();
  ucs_status_t st = ucx().ucp_listener_create(state().worker, &params, &l->listener);
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (st == UCS_OK) st = ucx().ucp_listener_query(l->listener, &attr);
  if (st != UCS_OK) {
    if (l->listener != nullptr) ucx().ucp_listener_destroy(l->listener);
    release();
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "NET/Squall: UCX cannot listen on %s: %s; UCX needs a sockaddr transport "
                       "(tcp or rdmacm) there, or set SQUALL_NET_TRANSPORT=tcp",
                       address.toString().c_str(), ucx().ucs_status_string(st));
  }
  SocketAddress bound;
  std::memcpy(&bound.storage, &attr.sockaddr, sizeof(attr.sockaddr));
  bound.length = address.length;
  l->nonce = randomNonce();
  State& shared = state();
  const uint32_t fieldMask = (1u << kConnectionBits) - 1;
  while (shared.connectionKey == 0)
    shared.connectionKey = static_cast<uint32_t>(randomNonce()) & fieldMask;
  do {
    l->connection = (shared.nextConnection ^ shared.connectionKey) & fieldMask;
    shared.nextConnection = shared.nextConnection % fieldMask + 1;
  } while (l->connection == 0);
  writeHandle(kKindNetUcx, l->nonce, bound, l->connection, handle);
  *listenComm = l.release();
  return Status::kOk;
}

Status ucxConnect(void* handle, void** sendComm) {
  *sendComm = nullptr;
  HandleFields h;
  SQUALL_TRY(decodeHandle(handle, kKindNetUcx, &h));
  std::lock_guard<std::mutex> lock(state().mutex);
  auto& slot = connects()[handle];
  if (slot == nullptr || slot->nonce != h.nonce) {
    if (slot != nullptr) {  // NCCL reused the buffer for another handle
      closeEndpoint(slot->e, true);
      release();
    }
    slot.reset();
    auto p = std::make_unique<PendingConnect>();
    p->nonce = h.nonce;
    p->connection = h.connection;
    p->where = h.address.toString();
    p->deadline = Clock::now() + std::chrono::milliseconds(timeoutMs());
    Status got = acquire();
    if (got != Status::kOk) {
      connects().erase(handle);
      return got;
    }
    auto e = std::make_unique<Endpoint>();
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&h.address.storage);
    params.sockaddr.addrlen = h.address.length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler = errorHandler(e.get());
    ucp_ep_h ep = nullptr;
    ucs_status_t st = ucx().ucp_ep_create(state().worker, &params, &ep);
    if (st != UCS_OK) {
      release();
      connects().erase(handle);
      return SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "NET/Squall: UCX cannot connect to %s: %s; the handle is stale or from "
                         "another job",
                         p->where.c_str(), ucx().ucs_status_string(st));
    }
    p->e = track(ep, std::move(e));
    p->e->out = Hello{kHelloMagic, 0, h.nonce};
    sendHello(p->e, kAmHello);
    slot = std::move(p);
  }
  PendingConnect* p = slot.get();
  drain();
  Status status = Status::kOk;
  if (p->e->gotHello && p->e->in.magic == kHelloMagic && p->e->in.nonce == p->nonce &&
      p->e->in.accepted == 1) {
    auto* c = new Conn(true, p->e, p->connection, p->nonce);
    connects().erase(handle);
    *sendComm = c;
    return Status::kOk;
  }
  if (p->e->gotHello) {
    status = SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "NET/Squall: %s refused the connection: the handle is stale or from "
                         "another job (no listener with its identity there)",
                         p->where.c_str());
  } else if (p->e->failed) {
    status = SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "NET/Squall: UCX cannot connect to %s: %s; the handle is stale (its "
                         "listener closed) or from another job",
                         p->where.c_str(), p->e->why.c_str());
  } else if (Clock::now() > p->deadline) {
    status = SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "NET/Squall: no answer from %s within SQUALL_TIMEOUT_S (%lld ms); the "
                         "handle is stale, from another job, or the peer is stuck",
                         p->where.c_str(), static_cast<long long>(timeoutMs()));
  }
  if (status != Status::kOk) {
    closeEndpoint(p->e, true);
    connects().erase(handle);
    release();
  }
  return status;
}

void ucxAbandonConnects() {
  std::lock_guard<std::mutex> lock(state().mutex);
  for (auto& [handle, p] : connects()) {
    closeEndpoint(p->e, true);
    release();
  }
  connects().clear();
}

Status ucxAccept(void* listenComm, void** recvComm) {
  auto* l = static_cast<Listen*>(listenComm);
  *recvComm = nullptr;
  std::lock_guard<std::mutex> lock(state().mutex);
  SQUALL_REQUIRE(!l->accepted, Status::kInvalidUsage, Subsys::kTransport,
                 "NET/Squall: accept() called again on a listen comm that already accepted its "
                 "connection; listen again for another one");
  drain();
  while (!l->requests.empty()) {
    ucp_conn_request_h request = l->requests.front();
    l->requests.pop_front();
    auto e = std::make_unique<Endpoint>();
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler = errorHandler(e.get());
    ucp_ep_h ep = nullptr;
    if (ucx().ucp_ep_create(state().worker, &params, &ep) == UCS_OK)
      l->pending.push_back(track(ep, std::move(e)));
  }
  drain();
  for (size_t i = l->pending.size(); i-- > 0;) {
    Endpoint* e = l->pending[i];
    if (!e->gotHello && !e->failed) continue;
    l->pending.erase(l->pending.begin() + static_cast<long>(i));
    if (e->failed) {
      closeEndpoint(e, true);
      continue;
    }
    bool ours = e->in.magic == kHelloMagic && e->in.nonce == l->nonce;
    e->out = Hello{kHelloMagic, ours ? 1u : 0u, e->in.nonce};
    sendHello(e, kAmAnswer, ours ? timeoutMs() : 0);
    if (!ours) {
      SQUALL_INFO(Subsys::kTransport,
                  "NET/Squall: refused a UCX connection that did not present this listener's "
                  "identity (a stray or a stale handle)");
      // Closed now (the refusal goes out first; the peer fails either on it
      // or on the close), so it cannot keep sending into this worker.
      drain();
      closeEndpoint(e, false);
      continue;
    }
    l->accepted = true;
    ++state().users;  // the connection holds the worker like the listener does
    *recvComm = new Conn(false, e, l->connection, l->nonce);
    return Status::kOk;
  }
  return Status::kOk;
}

Status ucxCloseListen(void* listenComm) {
  auto* l = static_cast<Listen*>(listenComm);
  std::lock_guard<std::mutex> lock(state().mutex);
  for (ucp_conn_request_h r : l->requests) ucx().ucp_listener_reject(l->listener, r);
  for (Endpoint* e : l->pending) closeEndpoint(e, true);
  ucx().ucp_listener_destroy(l->listener);
  delete l;
  release();
  return Status::kOk;
}

Status ucxIsend(void* sendComm, void* data, size_t size, int tag, void** request) {
  auto* c = static_cast<Conn*>(sendComm);
  std::lock_guard<std::mutex> lock(state().mutex);
  *request = nullptr;
  if (c->failed == Status::kOk && c->e->failed)
    failConn(c, Status::kRemoteError, "the peer's endpoint failed: " + c->e->why);
  if (c->failed != Status::kOk)
    return SQUALL_FAIL(c->failed, Subsys::kTransport,
                       "NET/Squall: isend() on a failed "
                       "connection: %s",
                       c->failure.c_str());
  if (c->live.size() >= kMaxOutstanding) return Status::kOk;
  auto* r = new Request;
  r->conn = c;
  r->send = true;
  r->data[0] = data;
  r->capacity[0] = size;
  auto* op = new Op{r, 0};
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  param.cb.send = &onSend;
  param.user_data = op;
  param.datatype = ucp_dt_make_contig(1);
  c->live.insert(r);
  ucs_status_ptr_t sent = ucx().ucp_tag_send_nbx(
      c->e->ep, data, size, makeTag(c->connection, c->sequence++, tag), &param);
  if (UCS_PTR_IS_PTR(sent))
    r->inFlight.push_back({sent, op});
  else
    complete(op, nullptr, UCS_PTR_STATUS(sent), 0);
  *request = r;
  return Status::kOk;
}

Status ucxIrecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                void** request) {
  auto* c = static_cast<Conn*>(recvComm);
  std::lock_guard<std::mutex> lock(state().mutex);
  *request = nullptr;
  if (c->failed != Status::kOk)
    return SQUALL_FAIL(c->failed, Subsys::kTransport,
                       "NET/Squall: irecv() on a failed "
                       "connection: %s",
                       c->failure.c_str());
  if (c->live.size() >= kMaxOutstanding) return Status::kOk;
  auto* r = new Request;
  r->conn = c;
  r->n = n;
  r->first = c->sequence;
  c->sequence += static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    r->data[i] = data[i];
    r->capacity[i] = sizes[i];
    r->tags[i] = tags != nullptr ? tags[i] : 0;
    r->received[i] = 0;
    r->assigned[i] = false;
    r->found[i] = false;
  }
  c->live.insert(r);
  c->unmatched.push_back(r);
  progressSome();
  match(c);
  *request = r;
  return Status::kOk;
}

Status ucxTest(void* request, int* done, size_t* sizes, int* count) {
  auto* r = static_cast<Request*>(request);
  Conn* c = r->conn;
  *done = 0;
  // Another thread holding the worker is progressing it for everyone: come
  // back later rather than queue behind it (NCCL polls test() in a loop).
  std::unique_lock<std::mutex> lock(state().mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    std::this_thread::yield();
    return Status::kOk;
  }
  progressSome();
  if (!c->send) match(c);
  if (r->completed < r->n) {
    // A receive whose messages are all in UCX's hands finishes or fails
    // there, unless the peer is gone: then nothing more will arrive, and a
    // transfer UCX still holds is abandoned rather than waited for.
    if (r->error == Status::kOk && c->failed != Status::kOk && (c->send || r->matched < r->n))
      r->error = c->failed;
    if (r->error == Status::kOk && c->e->failed) {
      cancelAll(r);
      r->error = Status::kRemoteError;
    }
    if (r->error != Status::kOk)
      return SQUALL_FAIL(r->error, Subsys::kTransport, "NET/Squall: request failed: %s",
                         c->failure.empty() ? c->e->why.c_str() : c->failure.c_str());
    return Status::kOk;
  }
  *done = 1;
  if (count != nullptr) *count = r->n;
  if (sizes != nullptr)
    for (int i = 0; i < r->n; ++i) sizes[i] = r->send ? r->capacity[0] : r->received[i];
  c->live.erase(r);
  delete r;
  return Status::kOk;
}

Status ucxClose(void* comm) {
  auto* c = static_cast<Conn*>(comm);
  std::lock_guard<std::mutex> lock(state().mutex);
  for (Request* r : c->live) {
    cancelAll(r);
    delete r;
  }
  c->live.clear();
  c->unmatched.clear();
  closeEndpoint(c->e, false);
  delete c;
  release();
  return Status::kOk;
}

}  // namespace squall::nccl_plugin
