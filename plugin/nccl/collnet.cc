// CollNet: NCCL hands the network whole collectives over its node heads, and
// Squall runs them with its own collectives, optionally compressed.
//
// Group formation. Every head listens (a rendezvous listener and handle, as
// for the net). In connect(), which NCCL calls once on every head with all
// the handles, rank 0 makes a Squall unique id and delivers it to every other
// rank's listener; then every rank joins a core::Comm over that id
// (rendezvous, transport from SQUALL_TRANSPORT: UCX when built in and every
// head can load it, else TCP, as for Squall's own communicators).
//
// Operations. iallreduce / iallgather / ireducescatter start an asynchronous
// collective on that communicator. NCCL issues them in the same order on every
// head, and the communicator runs them in call order, so they match across
// ranks by their per-collComm position, as NCCL requires. With
// SQUALL_COLLNET_CODEC=bf16, fp16 or int8, floating-point sums are compressed
// (two-phase compressed allreduce); everything else, and `none`, is exact.
//
// NCCL gives CollNet slices of its staging ring, not the user's tensors, so a
// residual kept here would not follow any one gradient: only the codecs that
// are accurate without one are offered, and their compressors keep no error
// feedback (coll::Feedback::kNone: no residual to hold, zero or read). Error
// feedback (1-bit) belongs to the interposer and the optimizer, which see
// whole user buffers.
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "plugin/nccl/abi/net_abi.h"
#include "plugin/nccl/net.h"
#include "src/bootstrap/bootstrap.h"
#include "src/common/params.h"
#include "src/core/comm.h"

namespace squall::nccl_plugin {
namespace {

constexpr uint32_t kKindCollNet = 2;
constexpr size_t kMaxOutstanding = 1024;

struct CollListen {
  Rendezvous rendezvous;
  ~CollListen() {
    if (rendezvous.fd >= 0) close(rendezvous.fd);
  }
};

struct CollComm {
  // Lanes: independent communicators over the same heads (the first one
  // split into the others). Operation k runs on lane k mod lanes, the same on
  // every head since NCCL issues the same order everywhere, so one slice's
  // codec work and round trips overlap the next slice's instead of queueing
  // behind them on one worker.
  std::vector<std::unique_ptr<core::Comm>> lanes;
  size_t nextLane = 0;
  int rank = 0;
  int size = 1;
  // The lane of the next operation (called under `mutex`).
  size_t next() { return nextLane++ % lanes.size(); }
  bool compress = false;
  codec::Spec spec;
  std::mutex mutex;  // one caller at a time drives the communicators
  // Compressors by (lane, element count); one per operation in flight. A
  // compressor belongs to its lane's Comm, and these go before the lanes.
  std::map<std::pair<size_t, size_t>, std::vector<std::unique_ptr<core::Compressor>>> idle;
  size_t outstanding = 0;
  uint64_t started = 0;  // operations NCCL gave us (logged at close)
};

struct CollRequest {
  CollComm* owner;
  size_t lane = 0;
  coll::OperationPtr op;
  std::unique_ptr<core::Compressor> compressor;
  std::vector<uint64_t> scratch;  // allgather / reducescatter staging, 8-byte aligned
  std::function<void()> finish;   // copies out of scratch once done
};

struct MemoryRegion {
  void* data;
  size_t size;
};

bool toSquall(int type, DataType* out) {
  switch (type) {
    case nccl_abi::kFloat32: *out = DataType::kF32; return true;
    case nccl_abi::kFloat16: *out = DataType::kF16; return true;
    case nccl_abi::kBfloat16: *out = DataType::kBf16; return true;
    case nccl_abi::kFloat64: *out = DataType::kF64; return true;
    case nccl_abi::kInt32: *out = DataType::kI32; return true;
    case nccl_abi::kInt64: *out = DataType::kI64; return true;
    default: return false;
  }
}
bool toSquall(int op, ReduceOp* out) {
  switch (op) {
    case nccl_abi::kSum: *out = ReduceOp::kSum; return true;
    case nccl_abi::kMax: *out = ReduceOp::kMax; return true;
    case nccl_abi::kMin: *out = ReduceOp::kMin; return true;
    case nccl_abi::kAvg: *out = ReduceOp::kAvg; return true;
    default: return false;
  }
}

Status readCodec(bool* compress, codec::Spec* spec) {
  std::string name = paramString(Param::kCollnetCodec);
  *compress = true;
  *spec = codec::Spec{};
  if (strcasecmp(name.c_str(), "none") == 0 || name.empty()) {
    *compress = false;
  } else if (strcasecmp(name.c_str(), "bf16") == 0) {
    spec->codec = codec::CodecId::kBf16;
  } else if (strcasecmp(name.c_str(), "fp16") == 0) {
    spec->codec = codec::CodecId::kFp16;
  } else if (strcasecmp(name.c_str(), "int8") == 0) {
    spec->codec = codec::CodecId::kInt8;
  } else {
    return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kColl,
                       "SQUALL_COLLNET_CODEC=\"%s\" is not none, bf16, fp16 or int8 (1-bit needs "
                       "error feedback per user buffer, which CollNet cannot keep: use the "
                       "interposer or the optimizer for it)",
                       name.c_str());
  }
  return Status::kOk;
}

Status checkComm(void* collComm, void** request, const char* what) {
  SQUALL_REQUIRE(collComm != nullptr && request != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: %s() was given a null comm or request", what);
  return Status::kOk;
}

// Hands `r` to NCCL as the request it will test.
void hand(CollComm* c, std::unique_ptr<CollRequest> r, void** request) {
  ++c->outstanding;
  ++c->started;
  *request = r.release();
}

}  // namespace

struct CollContext {};

CollContext* sharedCollContext() {
  static CollContext context;
  return &context;
}
Status collInit(CollContext** ctx) {
  bool compress = false;
  codec::Spec spec;
  // A bad codec name disables CollNet here, at init, where NCCL expects it.
  SQUALL_TRY(readCodec(&compress, &spec));
  *ctx = new CollContext;
  return Status::kOk;
}
Status collFinalize(CollContext* ctx) {
  if (ctx != sharedCollContext()) delete ctx;
  return Status::kOk;
}

Status collListen(CollContext* /*ctx*/, int dev, void* handle, void** listenComm) {
  SQUALL_REQUIRE(handle != nullptr && listenComm != nullptr, Status::kInvalidArgument,
                 Subsys::kColl, "CollNet/Squall: listen() was given a null handle or comm");
  auto l = std::make_unique<CollListen>();
  SQUALL_TRY(openRendezvous(dev, kKindCollNet, handle, &l->rendezvous));
  *listenComm = l.release();
  return Status::kOk;
}

Status collCloseListen(void* listenComm) {
  delete static_cast<CollListen*>(listenComm);
  return Status::kOk;
}

Status collConnect(void* const* handles, int nranks, int rank, void* listenComm, void** collComm) {
  SQUALL_REQUIRE(handles != nullptr && listenComm != nullptr && collComm != nullptr,
                 Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: connect() was given a null handle list, listen comm or output");
  SQUALL_REQUIRE(nranks >= 1 && rank >= 0 && rank < nranks, Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: connect() as rank %d of %d", rank, nranks);
  *collComm = nullptr;
  auto* listen = static_cast<CollListen*>(listenComm);
  core::CommConfig config;
  SQUALL_TRY(core::CommConfig::fromEnvironment(&config));
  int64_t timeoutMs = config.timeout.count();
  auto c = std::make_unique<CollComm>();
  SQUALL_TRY(readCodec(&c->compress, &c->spec));
  bootstrap::UniqueId id{};
  if (rank == 0) {
    SQUALL_TRY(bootstrap::createUniqueId(&id));
    for (int r = 1; r < nranks; ++r)
      SQUALL_TRY(sendToHandle(handles[r], kKindCollNet, &id, sizeof(id), timeoutMs));
  } else {
    SQUALL_TRY(receiveOnRendezvous(listen->rendezvous, &id, sizeof(id), timeoutMs));
  }
  std::unique_ptr<core::Comm> first;
  SQUALL_TRY(core::Comm::create(id, nranks, rank, config, &first));
  // Every head must use as many lanes as the others: take the smallest asked for.
  int64_t mine = std::clamp<int64_t>(paramInt(Param::kCollnetLanes), 1, 8);
  std::vector<int64_t> asked(static_cast<size_t>(nranks));
  SQUALL_TRY(first->allGather(&mine, asked.data(), 1, DataType::kI64));
  int64_t lanes = *std::min_element(asked.begin(), asked.end());
  c->lanes.push_back(std::move(first));
  while (c->lanes.size() < static_cast<size_t>(lanes)) {
    // Same heads, same order, same transport: a split with one color.
    std::unique_ptr<core::Comm> lane;
    SQUALL_TRY(c->lanes.front()->split(0, rank, &lane));
    c->lanes.push_back(std::move(lane));
  }
  c->rank = rank;
  c->size = nranks;
  SQUALL_INFO(Subsys::kColl, "CollNet/Squall: rank %d of %d joined (codec %s, %lld lanes over %s)",
              rank, nranks, c->compress ? codec::codecName(c->spec.codec) : "none",
              static_cast<long long>(lanes), c->lanes.front()->transportName());
  *collComm = c.release();
  return Status::kOk;
}

Status collReduceSupport(int dataType, int redOp, int* supported) {
  SQUALL_REQUIRE(supported != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: reduceSupport() was given a null output");
  DataType type;
  ReduceOp op;
  // Sum, max and min over the types Squall's collectives reduce; never prod.
  *supported = toSquall(dataType, &type) && toSquall(redOp, &op) ? 1 : 0;
  return Status::kOk;
}

Status collRegMr(void* collComm, void* data, size_t size, int type, void** mhandle) {
  SQUALL_REQUIRE(collComm != nullptr && mhandle != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: regMr() was given a null comm or handle");
  SQUALL_REQUIRE(type == nccl_abi::kPtrHost, Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: regMr() of memory type %d; only host memory is supported", type);
  *mhandle = new MemoryRegion{data, size};
  return Status::kOk;
}

Status collDeregMr(void* /*collComm*/, void* mhandle) {
  delete static_cast<MemoryRegion*>(mhandle);
  return Status::kOk;
}

Status collAllReduce(void* collComm, const void* send, void* recv, size_t count, int dataType,
                     int redOp, void** request) {
  SQUALL_TRY(checkComm(collComm, request, "iallreduce"));
  *request = nullptr;
  DataType type;
  ReduceOp op;
  SQUALL_REQUIRE(toSquall(dataType, &type) && toSquall(redOp, &op), Status::kInvalidArgument,
                 Subsys::kColl,
                 "CollNet/Squall: iallreduce() of NCCL type %d op %d, which reduceSupport() "
                 "refuses",
                 dataType, redOp);
  auto* c = static_cast<CollComm*>(collComm);
  std::lock_guard<std::mutex> lock(c->mutex);
  if (c->outstanding >= kMaxOutstanding) return Status::kOk;
  auto r = std::make_unique<CollRequest>();
  r->owner = c;
  r->lane = c->next();
  core::Comm& lane = *c->lanes[r->lane];
  bool compressible = type == DataType::kF32 || type == DataType::kF16 || type == DataType::kBf16;
  if (c->compress && compressible && op == ReduceOp::kSum && count > 0) {
    auto& pool = c->idle[{r->lane, count}];
    if (pool.empty()) {
      SQUALL_TRY(lane.createCompressor(count, c->spec, &r->compressor, 0, coll::Feedback::kNone));
    } else {
      r->compressor = std::move(pool.back());
      pool.pop_back();
    }
    SQUALL_TRY(lane.startCompressedAllReduce(send, recv, type, op, *r->compressor, &r->op));
  } else {
    SQUALL_TRY(lane.startAllReduce(send, recv, count, type, op, &r->op));
  }
  hand(c, std::move(r), request);
  return Status::kOk;
}

// The window [windowOffset, windowOffset + windowBytes) of the global buffer
// of nranks * bytesPerRank bytes; rank r owns [r * bpr, (r + 1) * bpr).
namespace {
struct WindowPart {
  size_t begin = 0;  // global offset
  size_t bytes = 0;
};
WindowPart partOf(int r, size_t bpr, size_t wo, size_t wb) {
  size_t lo = std::max(wo, static_cast<size_t>(r) * bpr);
  size_t hi = std::min(wo + wb, static_cast<size_t>(r + 1) * bpr);
  return hi > lo ? WindowPart{lo, hi - lo} : WindowPart{lo, 0};
}
}  // namespace

Status collAllGather(void* collComm, const void* send, void* recv, size_t recvBytes,
                     size_t bytesPerRank, size_t windowOffset, size_t windowBytes, void** request) {
  SQUALL_TRY(checkComm(collComm, request, "iallgather"));
  *request = nullptr;
  SQUALL_REQUIRE(recv != nullptr && recvBytes >= windowBytes, Status::kInvalidArgument,
                 Subsys::kColl, "CollNet/Squall: iallgather() into %zu bytes of a %zu-byte window",
                 recvBytes, windowBytes);
  auto* c = static_cast<CollComm*>(collComm);
  std::lock_guard<std::mutex> lock(c->mutex);
  if (c->outstanding >= kMaxOutstanding) return Status::kOk;
  int n = c->size;
  size_t most = 0;
  for (int r = 0; r < n; ++r)
    most = std::max(most, partOf(r, bytesPerRank, windowOffset, windowBytes).bytes);
  size_t words = (most + 7) / 8;  // every rank sends the same count: the largest part, padded
  auto req = std::make_unique<CollRequest>();
  req->owner = c;
  req->scratch.assign(words * static_cast<size_t>(n + 1), 0);
  WindowPart mine = partOf(c->rank, bytesPerRank, windowOffset, windowBytes);
  uint64_t* out = req->scratch.data() + words;
  if (mine.bytes > 0) std::memcpy(req->scratch.data(), send, mine.bytes);
  req->lane = c->next();
  SQUALL_TRY(c->lanes[req->lane]->startAllGather(req->scratch.data(), out, words, DataType::kI64,
                                                 &req->op));
  req->finish = [out, n, words, bytesPerRank, windowOffset, windowBytes, recv] {
    for (int r = 0; r < n; ++r) {
      WindowPart p = partOf(r, bytesPerRank, windowOffset, windowBytes);
      if (p.bytes > 0)
        std::memcpy(static_cast<char*>(recv) + (p.begin - windowOffset),
                    out + static_cast<size_t>(r) * words, p.bytes);
    }
  };
  hand(c, std::move(req), request);
  return Status::kOk;
}

Status collReduceScatter(void* collComm, const void* send, size_t sendBytes, void* recv,
                         size_t bytesPerRank, size_t windowOffset, size_t windowBytes, int dataType,
                         int redOp, void** request) {
  SQUALL_TRY(checkComm(collComm, request, "ireducescatter"));
  *request = nullptr;
  DataType type;
  ReduceOp op;
  SQUALL_REQUIRE(toSquall(dataType, &type) && toSquall(redOp, &op), Status::kInvalidArgument,
                 Subsys::kColl,
                 "CollNet/Squall: ireducescatter() of NCCL type %d op %d, which "
                 "reduceSupport() refuses",
                 dataType, redOp);
  size_t element = dataTypeSize(type);
  SQUALL_REQUIRE(send != nullptr && sendBytes >= windowBytes && windowBytes % element == 0 &&
                     windowOffset % element == 0 && bytesPerRank % element == 0,
                 Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: ireducescatter() window (%zu bytes at %zu, %zu per rank) is not "
                 "whole %zu-byte elements inside the %zu-byte send part",
                 windowBytes, windowOffset, bytesPerRank, element, sendBytes);
  auto* c = static_cast<CollComm*>(collComm);
  std::lock_guard<std::mutex> lock(c->mutex);
  if (c->outstanding >= kMaxOutstanding) return Status::kOk;
  auto req = std::make_unique<CollRequest>();
  req->owner = c;
  req->scratch.assign((windowBytes + 7) / 8, 0);
  // Reduce the whole window everywhere, keep this rank's part of it.
  req->lane = c->next();
  SQUALL_TRY(c->lanes[req->lane]->startAllReduce(send, req->scratch.data(), windowBytes / element,
                                                 type, op, &req->op));
  WindowPart mine = partOf(c->rank, bytesPerRank, windowOffset, windowBytes);
  const uint64_t* reduced = req->scratch.data();
  req->finish = [reduced, mine, windowOffset, recv] {
    if (mine.bytes > 0)
      std::memcpy(recv, reinterpret_cast<const char*>(reduced) + (mine.begin - windowOffset),
                  mine.bytes);
  };
  hand(c, std::move(req), request);
  return Status::kOk;
}

Status collTest(void* request, int* done) {
  SQUALL_REQUIRE(request != nullptr && done != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: test() was given a null request or flag");
  auto* r = static_cast<CollRequest*>(request);
  *done = 0;
  if (!r->op->test()) return Status::kOk;
  std::unique_ptr<CollRequest> owned(r);
  CollComm* c = r->owner;
  Status status = r->op->wait();
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    --c->outstanding;
    // The compressor keeps no residual, so the next slice of this count may
    // use it as it is (a failed call's compressor is dropped with its request).
    if (r->compressor != nullptr && status == Status::kOk)
      c->idle[{r->lane, r->compressor->count()}].push_back(std::move(r->compressor));
  }
  if (status != Status::kOk)
    return SQUALL_FAIL(status, Subsys::kColl, "CollNet/Squall: collective failed: %s",
                       r->op->error().c_str());
  if (r->finish) r->finish();
  *done = 1;
  return Status::kOk;
}

Status collClose(void* collComm) {
  auto* c = static_cast<CollComm*>(collComm);
  if (c == nullptr) return Status::kOk;
  SQUALL_INFO(Subsys::kColl, "CollNet/Squall: closed after %llu operations",
              static_cast<unsigned long long>(c->started));
  // The communicators' destructors stop their worker threads.
  delete c;
  return Status::kOk;
}

}  // namespace squall::nccl_plugin
