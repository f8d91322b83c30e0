// The C API of communicators, collectives and compressors: translation of
// handles, enums and the config into core::Comm (comm.h), which does the
// rest. Also the GPU entry points (squallCommInitFromNccl,
// squallCompressedAllReduceOnStream and ...ReduceScatterOnStream), which core refuses, saying why,
// in a build without CUDA and NCCL.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "src/bootstrap/bootstrap.h"
#include "src/common/params.h"
#include "src/core/api.h"
#include "src/core/api_objects.h"
#include "src/core/comm.h"
#include "src/core/compressor_state.h"
#include "src/core/transports.h"

using squall::DataType;
using squall::ReduceOp;
using squall::Status;
using squall::Subsys;
namespace bootstrap = squall::bootstrap;
namespace coll = squall::coll;
namespace core = squall::core;

struct squallRequest {
  coll::OperationPtr operation;
};

static_assert(sizeof(squallUniqueId) == sizeof(bootstrap::UniqueId));
static_assert(static_cast<int>(squallSum) == static_cast<int>(ReduceOp::kSum));
static_assert(static_cast<int>(squallAvg) == static_cast<int>(ReduceOp::kAvg));
static_assert(static_cast<int>(squallMin) == static_cast<int>(ReduceOp::kMin));
static_assert(static_cast<int>(squallMax) == static_cast<int>(ReduceOp::kMax));
static_assert(static_cast<int>(squallFloat64) == static_cast<int>(DataType::kF64));
static_assert(static_cast<int>(squallInt32) == static_cast<int>(DataType::kI32));
static_assert(static_cast<int>(squallInt64) == static_cast<int>(DataType::kI64));

namespace {

Status toDataType(const squallDataType_t& dtype, DataType* out) {
  const int id = core::rawEnum(dtype);
  SQUALL_REQUIRE(id >= 0 && id < squallNumDataTypes, Status::kInvalidArgument, Subsys::kApi,
                 "unknown data type %d; use a squallDataType_t value", id);
  *out = static_cast<DataType>(id);
  return Status::kOk;
}

Status toReduceOp(const squallRedOp_t& op, ReduceOp* out) {
  const int id = core::rawEnum(op);
  SQUALL_REQUIRE(id >= 0 && id < squallNumRedOps, Status::kInvalidArgument, Subsys::kApi,
                 "unknown reduction %d; use squallSum, squallAvg, squallMin or squallMax", id);
  *out = static_cast<ReduceOp>(id);
  return Status::kOk;
}

Status readConfig(const squallConfig_t* config, core::CommConfig* out) {
  squallConfig_t c = SQUALL_CONFIG_INIT;
  if (config != nullptr) {
    SQUALL_REQUIRE(config->size >= sizeof(size_t) && config->size <= sizeof(squallConfig_t),
                   Status::kInvalidArgument, Subsys::kApi,
                   "config->size is %zu; initialise the config with SQUALL_CONFIG_INIT",
                   config->size);
    std::memcpy(&c, config, config->size);
  }
  const int transport = core::rawEnum(c.transport);
  SQUALL_REQUIRE(transport >= squallTransportDefault && transport <= squallTransportMpi,
                 Status::kInvalidArgument, Subsys::kApi,
                 "unknown transport %d in the config; use a squallTransport_t value", transport);
  SQUALL_REQUIRE(c.timeoutSeconds >= 0, Status::kInvalidArgument, Subsys::kApi,
                 "config timeoutSeconds is %d; use 0 for SQUALL_TIMEOUT_S or a positive value",
                 c.timeoutSeconds);
  SQUALL_TRY(core::chooseTransport(static_cast<squallTransport_t>(transport), &out->transport));
  const int64_t seconds =
      c.timeoutSeconds > 0 ? c.timeoutSeconds : squall::paramInt(squall::Param::kTimeoutS);
  out->timeout = std::chrono::milliseconds(std::max<int64_t>(seconds, 1) * 1000);
  return Status::kOk;
}

Status checkOut(const void* out, const char* what) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the %s output pointer is NULL", what);
  return Status::kOk;
}

// Communicators handed out and not destroyed, per thread that made them:
// whether a skipped collective (SkippedCalls) can be pinned on a communicator.
std::mutex gLiveMutex;
std::map<std::thread::id, int> gLive;

int liveOnThisThread() {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  auto it = gLive.find(std::this_thread::get_id());
  return it == gLive.end() ? 0 : it->second;
}

// Hands a new Comm to the caller (outputs are written only on success).
Status handOut(std::unique_ptr<core::Comm> comm, squallComm_t* out) {
  auto handle = std::make_unique<squallComm>();
  handle->impl = std::move(comm);
  handle->creator = std::this_thread::get_id();
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    ++gLive[handle->creator];
  }
  *out = handle.release();
  return Status::kOk;
}

Status compressorOf(squallCompressor_t c, core::Compressor** out) {
  SQUALL_REQUIRE(c != nullptr && c->impl != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the compressor is NULL; create one with squallCompressorCreate");
  *out = c->impl.get();
  return Status::kOk;
}

Status wrapOperation(coll::OperationPtr op, squallRequest_t* request) {
  auto r = std::make_unique<squallRequest>();
  r->operation = std::move(op);
  *request = r.release();
  return Status::kOk;
}

// Collectives refused on this thread because their communicator was NULL.
// Such a call cannot reach the peers, which run the operation without this
// rank: left alone, this rank's next call would pair with their previous one
// (silently when the two look alike) and every later call would be off by
// one. So a skipped call is charged to the next collective this thread runs
// on its communicator: that communicator fails one operation first, which
// tells the peers (they fail the skipped operation at once), and the
// sequence numbers line up again. Only where the communicator is certain:
// the thread holds exactly one (made on it and not destroyed), and no
// squallCommSplit on it ever returned NULL. A rank that a split left outside
// every group holds a NULL communicator by design, so its refused calls may
// be calls on that NULL, which no peer expects; and with several
// communicators nobody can tell which one the skipped call was meant for.
// Those calls are refused and not charged.
struct SkippedCalls {
  int count = 0;
  bool nullFromSplit = false;  // a squallCommSplit on this thread returned NULL
};
thread_local SkippedCalls tSkipped;

bool chargeable() { return !tSkipped.nullFromSplit && liveOnThisThread() == 1; }

// The communicator of a collective entry point, after charging the calls this
// thread skipped (see SkippedCalls).
Status collectiveCommOf(squallComm_t comm, core::Comm** out) {
  if (comm == nullptr || comm->impl == nullptr) {
    if (chargeable()) ++tSkipped.count;
    return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kApi,
                       "the communicator is NULL; create one with squallCommInitRank, "
                       "squallCommInitFromEnv or squallCommInitFromMpi");
  }
  core::chargeSkippedCalls(*comm->impl);
  *out = comm->impl.get();
  return Status::kOk;
}

// What every compressed collective checks before it starts: its communicator
// (after the charges above), compressor, data type and op. A refused compressor,
// type or op is announced to the peers (Comm::refuse), so they fail the
// operation at once instead of waiting for this rank.
struct CompressedCall {
  core::Comm* comm = nullptr;
  core::Compressor* compressor = nullptr;
  DataType type = DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
};

Status compressedCallOf(squallComm_t comm, squallCompressor_t compressor, squallDataType_t dtype,
                        squallRedOp_t op, CompressedCall* out) {
  SQUALL_TRY(collectiveCommOf(comm, &out->comm));
  SQUALL_TRY(out->comm->refuse(compressorOf(compressor, &out->compressor)));
  SQUALL_TRY(out->comm->refuse(toDataType(dtype, &out->type)));
  return out->comm->refuse(toReduceOp(op, &out->op));
}

// The same for the OnStream forms, which announce nothing to the peers (a
// communicator from NCCL has none to tell).
Status streamCallOf(squallComm_t comm, squallCompressor_t compressor, squallDataType_t dtype,
                    squallRedOp_t op, CompressedCall* out) {
  SQUALL_TRY(collectiveCommOf(comm, &out->comm));
  SQUALL_TRY(compressorOf(compressor, &out->compressor));
  SQUALL_TRY(toDataType(dtype, &out->type));
  return toReduceOp(op, &out->op);
}

// A new compressor handle on `comm` for `spec`, made by `make(comm, spec,
// &impl)` (the allreduce's or the reduce-scatter's layout).
template <typename Make>
Status handOutCompressor(squallComm_t comm, const squallCodecSpec_t* spec,
                         squallCompressor_t* compressor, Make make) {
  core::Comm* c = nullptr;
  SQUALL_TRY(core::commOf(comm, &c));
  SQUALL_TRY(checkOut(compressor, "compressor"));
  squall::codec::Spec s;
  SQUALL_TRY(core::toCodecSpec(spec, &s));
  auto handle = std::make_unique<squallCompressor>();
  SQUALL_TRY(make(*c, s, &handle->impl));
  *compressor = handle.release();
  return Status::kOk;
}

}  // namespace

squallComm::~squallComm() {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  auto it = gLive.find(creator);
  if (it != gLive.end() && --it->second <= 0) gLive.erase(it);
}

namespace squall::core {

void chargeSkippedCalls(Comm& c) {
  // Every collective passes here: the registry lock only when there is a
  // charge to pin.
  if (tSkipped.count == 0) return;
  if (!chargeable()) tSkipped.count = 0;  // no longer certain where they belong
  for (; tSkipped.count > 0; --tSkipped.count) {
    // Described, sent to the peers by the refusal, then cleared: this call
    // itself has not failed.
    (void)c.refuse(SQUALL_FAIL(Status::kInvalidArgument, Subsys::kApi,
                               "rank %d skipped this collective: it was called with a NULL "
                               "communicator",
                               c.rank()));
    squall::clearLastError();
  }
}

Status commOf(squallComm_t comm, Comm** out) {
  SQUALL_REQUIRE(comm != nullptr && comm->impl != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the communicator is NULL; create one with squallCommInitRank, "
                 "squallCommInitFromEnv or squallCommInitFromMpi");
  *out = comm->impl.get();
  return Status::kOk;
}

}  // namespace squall::core

extern "C" {

squallResult_t squallGetUniqueId(squallUniqueId* id) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(id != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the unique id pointer is NULL");
    bootstrap::UniqueId u;
    SQUALL_TRY(bootstrap::createUniqueId(&u));
    std::memcpy(id, &u, sizeof(u));
    return Status::kOk;
  });
}

squallResult_t squallCommInitRank(squallComm_t* comm, int nranks, squallUniqueId id, int rank,
                                  const squallConfig_t* config) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkOut(comm, "communicator"));
    core::CommConfig c;
    SQUALL_TRY(readConfig(config, &c));
    bootstrap::UniqueId u;
    std::memcpy(&u, &id, sizeof(u));
    std::unique_ptr<core::Comm> made;
    SQUALL_TRY(core::Comm::create(u, nranks, rank, c, &made));
    return handOut(std::move(made), comm);
  });
}

squallResult_t squallCommInitFromEnv(squallComm_t* comm, const squallConfig_t* config) {
  return SQUALL_API_GUARD({
    core::CommConfig c;
    SQUALL_TRY(readConfig(config, &c));
    SQUALL_TRY(checkOut(comm, "communicator"));
    std::unique_ptr<core::Comm> made;
    SQUALL_TRY(core::Comm::fromEnv(c, &made));
    return handOut(std::move(made), comm);
  });
}

squallResult_t squallCommInitFromMpi(squallComm_t* comm, const void* mpiComm,
                                     const squallConfig_t* config) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(comm != nullptr && mpiComm != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the communicator output and the MPI_Comm pointer must be set");
    core::CommConfig c;
    SQUALL_TRY(readConfig(config, &c));
    std::unique_ptr<core::Comm> made;
    SQUALL_TRY(core::Comm::fromMpi(mpiComm, c, &made));
    return handOut(std::move(made), comm);
  });
}

squallResult_t squallCommInitFromNccl(squallComm_t* comm, void* ncclComm) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(comm != nullptr && ncclComm != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the communicator output and the ncclComm_t must be set");
    std::unique_ptr<core::Comm> made;
    SQUALL_TRY(core::Comm::fromNccl(ncclComm, &made));
    return handOut(std::move(made), comm);
  });
}

squallResult_t squallCommSplit(squallComm_t comm, int color, int key, squallComm_t* newcomm) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(core::commOf(comm, &c));
    SQUALL_TRY(checkOut(newcomm, "new communicator"));
    std::unique_ptr<core::Comm> made;
    SQUALL_TRY(c->split(color, key, &made));
    if (made == nullptr) tSkipped.nullFromSplit = true;
    if (made == nullptr) {
      *newcomm = nullptr;
      return Status::kOk;
    }
    return handOut(std::move(made), newcomm);
  });
}

squallResult_t squallCommDestroy(squallComm_t comm) {
  return SQUALL_API_GUARD({
    delete comm;
    return Status::kOk;
  });
}

squallResult_t squallCommRank(squallComm_t comm, int* rank) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(core::commOf(comm, &c));
    SQUALL_TRY(checkOut(rank, "rank"));
    *rank = c->rank();
    return Status::kOk;
  });
}

squallResult_t squallCommSize(squallComm_t comm, int* size) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(core::commOf(comm, &c));
    SQUALL_TRY(checkOut(size, "size"));
    *size = c->size();
    return Status::kOk;
  });
}

squallResult_t squallCommTransport(squallComm_t comm, const char** name) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(core::commOf(comm, &c));
    SQUALL_TRY(checkOut(name, "name"));
    *name = c->transportName();
    return Status::kOk;
  });
}

squallResult_t squallAllReduce(const void* sendbuf, void* recvbuf, size_t count,
                               squallDataType_t dtype, squallRedOp_t op, squallComm_t comm) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(collectiveCommOf(comm, &c));
    DataType t = DataType::kF32;
    ReduceOp o = ReduceOp::kSum;
    SQUALL_TRY(c->refuse(toDataType(dtype, &t)));
    SQUALL_TRY(c->refuse(toReduceOp(op, &o)));
    return c->allReduce(sendbuf, recvbuf, count, t, o);
  });
}

squallResult_t squallAllGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                               squallDataType_t dtype, squallComm_t comm) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(collectiveCommOf(comm, &c));
    DataType t = DataType::kF32;
    SQUALL_TRY(c->refuse(toDataType(dtype, &t)));
    return c->allGather(sendbuf, recvbuf, sendcount, t);
  });
}

squallResult_t squallAllToAll(const void* sendbuf, void* recvbuf, size_t count,
                              squallDataType_t dtype, squallComm_t comm) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(collectiveCommOf(comm, &c));
    DataType t = DataType::kF32;
    SQUALL_TRY(c->refuse(toDataType(dtype, &t)));
    return c->allToAll(sendbuf, recvbuf, count, t);
  });
}

squallResult_t squallBroadcast(void* buffer, size_t count, squallDataType_t dtype, int root,
                               squallComm_t comm) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(collectiveCommOf(comm, &c));
    DataType t = DataType::kF32;
    SQUALL_TRY(c->refuse(toDataType(dtype, &t)));
    return c->broadcast(buffer, count, t, root);
  });
}

squallResult_t squallBarrier(squallComm_t comm) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(collectiveCommOf(comm, &c));
    return c->barrier();
  });
}

squallResult_t squallCompressorCreate(squallComm_t comm, size_t count,
                                      const squallCodecSpec_t* spec,
                                      squallCompressor_t* compressor) {
  return squallCompressorCreateAt(comm, count, 0, spec, compressor);
}

squallResult_t squallCompressorCreateAt(squallComm_t comm, size_t count, size_t phase,
                                        const squallCodecSpec_t* spec,
                                        squallCompressor_t* compressor) {
  return SQUALL_API_GUARD({
    return handOutCompressor(comm, spec, compressor,
                             [&](core::Comm& c, const squall::codec::Spec& s, auto* impl) {
                               return c.createCompressor(count, s, impl, phase);
                             });
  });
}

squallResult_t squallCompressorCreateReduceScatter(squallComm_t comm, size_t recvcount,
                                                   const squallCodecSpec_t* spec,
                                                   squallCompressor_t* compressor) {
  return SQUALL_API_GUARD({
    return handOutCompressor(comm, spec, compressor,
                             [&](core::Comm& c, const squall::codec::Spec& s, auto* impl) {
                               return c.createReduceScatterCompressor(recvcount, s, impl);
                             });
  });
}

squallResult_t squallCompressorCreateAllGather(squallComm_t comm, size_t sendcount,
                                               const squallCodecSpec_t* spec,
                                               squallCompressor_t* compressor) {
  return SQUALL_API_GUARD({
    return handOutCompressor(comm, spec, compressor,
                             [&](core::Comm& c, const squall::codec::Spec& s, auto* impl) {
                               return c.createAllGatherCompressor(sendcount, s, impl);
                             });
  });
}

squallResult_t squallCompressorDestroy(squallCompressor_t compressor) {
  return SQUALL_API_GUARD({
    delete compressor;
    return Status::kOk;
  });
}

squallResult_t squallCommGetStats(squallComm_t comm, squallCommStats_t* stats) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(core::commOf(comm, &c));
    SQUALL_TRY(checkOut(stats, "stats"));
    core::CommStats s;
    SQUALL_TRY(c->stats(&s));
    stats->operations = s.operations;
    stats->bytesSent = s.bytesSent;
    stats->bytesReceived = s.bytesReceived;
    return Status::kOk;
  });
}

squallResult_t squallCompressorReset(squallCompressor_t compressor) {
  return SQUALL_API_GUARD({
    core::Compressor* c = nullptr;
    SQUALL_TRY(compressorOf(compressor, &c));
    return c->reset();
  });
}

squallResult_t squallCompressorSetAlgorithm(squallCompressor_t compressor,
                                            squallCompressorAlgo_t algorithm) {
  return SQUALL_API_GUARD({
    core::Compressor* c = nullptr;
    SQUALL_TRY(compressorOf(compressor, &c));
    coll::CompressedAlgo algo = coll::CompressedAlgo::kAuto;
    const int id = core::rawEnum(algorithm);  // any int a C caller passed
    switch (id) {
      case squallCompressorAlgoBytes: algo = coll::CompressedAlgo::kAutoBytes; break;
      case squallCompressorAlgoTwoPhase: algo = coll::CompressedAlgo::kTwoPhase; break;
      case squallCompressorAlgoAllGather: algo = coll::CompressedAlgo::kAllGather; break;
      case squallCompressorAlgoTime: algo = coll::CompressedAlgo::kAuto; break;
      default:
        return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kApi,
                           "algorithm is %d; use squallCompressorAlgoTime, Bytes, TwoPhase or "
                           "AllGather",
                           id);
    }
    return c->setAlgorithm(algo);
  });
}

squallResult_t squallCompressorSetGatherCodec(squallCompressor_t compressor,
                                              const squallCodecSpec_t* spec) {
  return SQUALL_API_GUARD({
    core::Compressor* c = nullptr;
    SQUALL_TRY(compressorOf(compressor, &c));
    squall::codec::Spec s;
    SQUALL_TRY(core::toCodecSpec(spec, &s));
    return c->setGatherSpec(s);
  });
}

squallResult_t squallCompressorGetStats(squallCompressor_t compressor,
                                        squallCompressorStats_t* stats) {
  return SQUALL_API_GUARD({
    core::Compressor* c = nullptr;
    SQUALL_TRY(compressorOf(compressor, &c));
    SQUALL_TRY(checkOut(stats, "stats"));
    core::CompressorStats s;
    SQUALL_TRY(c->stats(&s));
    stats->calls = s.calls;
    stats->skippedCalls = s.skippedCalls;
    stats->bytesSent = s.bytesSent;
    stats->bytesReceived = s.bytesReceived;
    return Status::kOk;
  });
}

squallResult_t squallCompressorStateSize(squallCompressor_t compressor, size_t* bytes) {
  return SQUALL_API_GUARD({
    core::Compressor* c = nullptr;
    SQUALL_TRY(compressorOf(compressor, &c));
    SQUALL_TRY(checkOut(bytes, "bytes"));
    return core::compressorStateSize(*c, bytes);
  });
}

squallResult_t squallCompressorSaveState(squallCompressor_t compressor, void* buffer,
                                         size_t capacity, size_t* written) {
  return SQUALL_API_GUARD({
    core::Compressor* c = nullptr;
    SQUALL_TRY(compressorOf(compressor, &c));
    SQUALL_TRY(checkOut(written, "written"));
    return core::saveCompressorState(*c, buffer, capacity, written);
  });
}

squallResult_t squallCompressorLoadState(squallCompressor_t compressor, const void* buffer,
                                         size_t bytes) {
  return SQUALL_API_GUARD({
    core::Compressor* c = nullptr;
    SQUALL_TRY(compressorOf(compressor, &c));
    return core::loadCompressorState(*c, buffer, bytes);
  });
}

squallResult_t squallCompressedAllReduce(const void* sendbuf, void* recvbuf, squallDataType_t dtype,
                                         squallRedOp_t op, squallCompressor_t compressor,
                                         squallComm_t comm) {
  return SQUALL_API_GUARD({
    CompressedCall k;
    SQUALL_TRY(compressedCallOf(comm, compressor, dtype, op, &k));
    return k.comm->compressedAllReduce(sendbuf, recvbuf, k.type, k.op, *k.compressor);
  });
}

squallResult_t squallCompressedReduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                             squallDataType_t dtype, squallRedOp_t op,
                                             squallCompressor_t compressor, squallComm_t comm) {
  return SQUALL_API_GUARD({
    CompressedCall k;
    SQUALL_TRY(compressedCallOf(comm, compressor, dtype, op, &k));
    return k.comm->compressedReduceScatter(sendbuf, recvbuf, recvcount, k.type, k.op,
                                           *k.compressor);
  });
}

squallResult_t squallCompressedAllReduceOnStream(const void* sendbuf, void* recvbuf,
                                                 squallDataType_t dtype, squallRedOp_t op,
                                                 squallCompressor_t compressor, squallComm_t comm,
                                                 void* cudaStream) {
  return SQUALL_API_GUARD({
    CompressedCall k;
    SQUALL_TRY(streamCallOf(comm, compressor, dtype, op, &k));
    return k.comm->compressedAllReduceOnStream(sendbuf, recvbuf, k.type, k.op, *k.compressor,
                                               cudaStream);
  });
}

squallResult_t squallCompressedReduceScatterOnStream(const void* sendbuf, void* recvbuf,
                                                     size_t recvcount, squallDataType_t dtype,
                                                     squallRedOp_t op,
                                                     squallCompressor_t compressor,
                                                     squallComm_t comm, void* cudaStream) {
  return SQUALL_API_GUARD({
    CompressedCall k;
    SQUALL_TRY(streamCallOf(comm, compressor, dtype, op, &k));
    return k.comm->compressedReduceScatterOnStream(sendbuf, recvbuf, recvcount, k.type, k.op,
                                                   *k.compressor, cudaStream);
  });
}

namespace {

// The all-gather's checks common to both forms: the compressor's sendcount.
Status gatherCallOf(squallComm_t comm, squallCompressor_t compressor, size_t sendcount,
                    squallDataType_t dtype, core::Comm** c, core::Compressor** k, DataType* t) {
  SQUALL_TRY(collectiveCommOf(comm, c));
  SQUALL_TRY((*c)->refuse(compressorOf(compressor, k)));
  SQUALL_REQUIRE(*k != nullptr, Status::kInvalidArgument, Subsys::kApi, "the compressor is NULL");
  SQUALL_TRY((*c)->refuse(toDataType(dtype, t)));
  const Status fits =
      sendcount == (*k)->count()
          ? Status::kOk
          : SQUALL_FAIL(Status::kInvalidArgument, Subsys::kApi,
                        "quantized all-gather: sendcount is %zu but the compressor was made for "
                        "%zu; make one compressor per buffer",
                        sendcount, (*k)->count());
  SQUALL_TRY((*c)->refuse(fits));
  return Status::kOk;
}

}  // namespace

squallResult_t squallCompressedAllGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                         squallDataType_t dtype, squallCompressor_t compressor,
                                         squallComm_t comm) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    core::Compressor* k = nullptr;
    DataType t = DataType::kF32;
    SQUALL_TRY(gatherCallOf(comm, compressor, sendcount, dtype, &c, &k, &t));
    return c->compressedAllGather(sendbuf, recvbuf, t, *k);
  });
}

squallResult_t squallCompressedAllGatherOnStream(const void* sendbuf, void* recvbuf,
                                                 size_t sendcount, squallDataType_t dtype,
                                                 squallCompressor_t compressor, squallComm_t comm,
                                                 void* cudaStream) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    core::Compressor* k = nullptr;
    DataType t = DataType::kF32;
    SQUALL_TRY(gatherCallOf(comm, compressor, sendcount, dtype, &c, &k, &t));
    return c->compressedAllGatherOnStream(sendbuf, recvbuf, t, *k, cudaStream);
  });
}

squallResult_t squallAllReduceAsync(const void* sendbuf, void* recvbuf, size_t count,
                                    squallDataType_t dtype, squallRedOp_t op, squallComm_t comm,
                                    squallRequest_t* request) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(collectiveCommOf(comm, &c));
    SQUALL_TRY(c->refuse(checkOut(request, "request")));
    DataType t = DataType::kF32;
    ReduceOp o = ReduceOp::kSum;
    SQUALL_TRY(c->refuse(toDataType(dtype, &t)));
    SQUALL_TRY(c->refuse(toReduceOp(op, &o)));
    coll::OperationPtr operation;
    SQUALL_TRY(c->startAllReduce(sendbuf, recvbuf, count, t, o, &operation));
    return wrapOperation(std::move(operation), request);
  });
}

squallResult_t squallCompressedAllReduceAsync(const void* sendbuf, void* recvbuf,
                                              squallDataType_t dtype, squallRedOp_t op,
                                              squallCompressor_t compressor, squallComm_t comm,
                                              squallRequest_t* request) {
  return SQUALL_API_GUARD({
    CompressedCall k;
    SQUALL_TRY(compressedCallOf(comm, compressor, dtype, op, &k));
    SQUALL_TRY(k.comm->refuse(checkOut(request, "request")));
    coll::OperationPtr operation;
    SQUALL_TRY(k.comm->startCompressedAllReduce(sendbuf, recvbuf, k.type, k.op, *k.compressor,
                                                &operation));
    return wrapOperation(std::move(operation), request);
  });
}

squallResult_t squallCompressedReduceScatterAsync(const void* sendbuf, void* recvbuf,
                                                  size_t recvcount, squallDataType_t dtype,
                                                  squallRedOp_t op, squallCompressor_t compressor,
                                                  squallComm_t comm, squallRequest_t* request) {
  return SQUALL_API_GUARD({
    CompressedCall k;
    SQUALL_TRY(compressedCallOf(comm, compressor, dtype, op, &k));
    SQUALL_TRY(k.comm->refuse(checkOut(request, "request")));
    coll::OperationPtr operation;
    SQUALL_TRY(k.comm->startCompressedReduceScatter(sendbuf, recvbuf, recvcount, k.type, k.op,
                                                    *k.compressor, &operation));
    return wrapOperation(std::move(operation), request);
  });
}

squallResult_t squallTest(squallRequest_t request, int* done) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(request != nullptr && request->operation != nullptr, Status::kInvalidArgument,
                   Subsys::kApi, "the request is NULL");
    SQUALL_REQUIRE(done != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the done output pointer is NULL");
    *done = request->operation->test() ? 1 : 0;
    return Status::kOk;
  });
}

squallResult_t squallWait(squallRequest_t request) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(request != nullptr && request->operation != nullptr, Status::kInvalidArgument,
                   Subsys::kApi, "the request is NULL");
    std::unique_ptr<squallRequest> owned(request);
    const Status status = owned->operation->wait();
    if (status != Status::kOk) {
      // The failure was described (and logged) on the thread that ran it;
      // the waiter reads it here.
      squall::setLastError(owned->operation->error());
      return status;
    }
    return Status::kOk;
  });
}

}  // extern "C"
