// The C API of communicators, collectives and compressors.
//
// A squallComm owns its rendezvous channel, its transport and the collective
// engine over it, destroyed in the reverse order. Everything here is argument
// checking and translation; the algorithms live in src/coll.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/bootstrap/bootstrap.h"
#include "src/coll/communicator.h"
#include "src/coll/compressed_state.h"
#include "src/common/params.h"
#include "src/core/api.h"
#include "src/core/api_objects.h"
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

Status checkComm(squallComm_t comm) {
  SQUALL_REQUIRE(comm == nullptr || comm->nccl == nullptr, Status::kInvalidUsage, Subsys::kApi,
                 "this communicator was built from NCCL with squallCommInitFromNccl; it runs "
                 "squallCompressedAllReduceOnStream only (use NCCL itself for the others)");
  SQUALL_REQUIRE(comm != nullptr && comm->coll != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the communicator is NULL; create one with squallCommInitRank, "
                 "squallCommInitFromEnv or squallCommInitFromMpi");
  return Status::kOk;
}

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

struct Settings {
  core::TransportKind kind;
  std::chrono::milliseconds timeout;
};

Status readConfig(const squallConfig_t* config, Settings* out) {
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
  SQUALL_TRY(core::chooseTransport(static_cast<squallTransport_t>(transport), &out->kind));
  const int64_t seconds =
      c.timeoutSeconds > 0 ? c.timeoutSeconds : squall::paramInt(squall::Param::kTimeoutS);
  out->timeout = std::chrono::milliseconds(std::max<int64_t>(seconds, 1) * 1000);
  return Status::kOk;
}

// Builds the transport and the collective engine of a communicator whose
// bootstrap is already connected.
Status finishComm(std::unique_ptr<squallComm> comm, const Settings& settings, squallComm_t* out) {
  comm->kind = settings.kind;
  comm->timeout = settings.timeout;
  SQUALL_TRY(core::createTransport(settings.kind, *comm->bootstrap, &comm->transport));
  coll::Options options = coll::Options::fromEnvironment();
  options.timeout = settings.timeout;
  comm->coll = std::make_unique<coll::Communicator>(comm->transport.get(), options);
  SQUALL_INFO(Subsys::kInit, "rank %d of %d ready over %s", comm->coll->rank(), comm->coll->size(),
              comm->transport->name());
  *out = comm.release();
  return Status::kOk;
}

Status initRank(squallComm_t* out, int nranks, const bootstrap::UniqueId& id, int rank,
                const Settings& settings) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the communicator output pointer is NULL");
  SQUALL_REQUIRE(nranks >= 1, Status::kInvalidArgument, Subsys::kApi,
                 "nranks is %d; a communicator needs at least one rank", nranks);
  SQUALL_REQUIRE(rank >= 0 && rank < nranks, Status::kInvalidArgument, Subsys::kApi,
                 "rank %d is outside 0..%d (nranks %d)", rank, nranks - 1, nranks);
  auto comm = std::make_unique<squallComm>();
  SQUALL_TRY(bootstrap::Bootstrap::create(id, nranks, rank, settings.timeout, &comm->bootstrap));
  return finishComm(std::move(comm), settings, out);
}

Status checkCompressor(squallCompressor_t c, squallComm_t comm) {
  SQUALL_REQUIRE(c != nullptr && c->state != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the compressor is NULL; create one with squallCompressorCreate");
  SQUALL_REQUIRE(c->comm == comm, Status::kInvalidUsage, Subsys::kApi,
                 "the compressor was created for another communicator; create one per "
                 "communicator and buffer");
  return Status::kOk;
}

Status wrapOperation(coll::OperationPtr op, squallRequest_t* request) {
  auto r = std::make_unique<squallRequest>();
  r->operation = std::move(op);
  *request = r.release();
  return Status::kOk;
}

Status checkRequestOut(const squallRequest_t* request) {
  SQUALL_REQUIRE(request != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the request output pointer is NULL");
  return Status::kOk;
}

}  // namespace

namespace squall::core {

Status communicatorOf(squallComm_t comm, coll::Communicator** out) {
  SQUALL_TRY(checkComm(comm));
  *out = comm->coll.get();
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
    Settings settings;
    SQUALL_TRY(readConfig(config, &settings));
    bootstrap::UniqueId u;
    std::memcpy(&u, &id, sizeof(u));
    return initRank(comm, nranks, u, rank, settings);
  });
}

squallResult_t squallCommInitFromEnv(squallComm_t* comm, const squallConfig_t* config) {
  return SQUALL_API_GUARD({
    Settings settings;
    SQUALL_TRY(readConfig(config, &settings));
    bootstrap::UniqueId u;
    int rank = 0, nranks = 0;
    SQUALL_TRY(bootstrap::uniqueIdFromEnv(&u, &rank, &nranks));
    return initRank(comm, nranks, u, rank, settings);
  });
}

squallResult_t squallCommInitFromMpi(squallComm_t* comm, const void* mpiComm,
                                     const squallConfig_t* config) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(comm != nullptr && mpiComm != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the communicator output and the MPI_Comm pointer must be set");
    Settings settings;
    SQUALL_TRY(readConfig(config, &settings));
    auto c = std::make_unique<squallComm>();
    c->kind = core::TransportKind::kMpi;
    c->timeout = settings.timeout;
    SQUALL_TRY(core::createMpiTransport(mpiComm, &c->transport));
    coll::Options options = coll::Options::fromEnvironment();
    options.timeout = settings.timeout;
    c->coll = std::make_unique<coll::Communicator>(c->transport.get(), options);
    *comm = c.release();
    return Status::kOk;
  });
}

squallResult_t squallCommSplit(squallComm_t comm, int color, int key, squallComm_t* newcomm) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    SQUALL_REQUIRE(newcomm != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the new communicator output pointer is NULL");
    SQUALL_REQUIRE(comm->bootstrap != nullptr, Status::kUnsupported, Subsys::kApi,
                   "squallCommSplit is not available on a communicator built from MPI; split "
                   "the MPI communicator with MPI_Comm_split and call squallCommInitFromMpi");
    coll::Communicator& parent = *comm->coll;
    const int n = parent.size();
    // Everyone learns everyone's (color, key).
    const int64_t mine[2] = {color < 0 ? -1 : color, key};
    std::vector<int64_t> all(2 * static_cast<size_t>(n));
    SQUALL_TRY(parent.allGather(mine, all.data(), 2, DataType::kI64));
    std::vector<int> members;  // parent ranks of my group, in new-rank order
    for (int r = 0; r < n; ++r)
      if (color >= 0 && all[2 * r] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
    // The first member of each group creates its rendezvous id; all ids travel
    // in one all-gather (ranks that create none contribute zeros).
    const bool leader = !members.empty() && members.front() == parent.rank();
    bootstrap::UniqueId id{};
    if (leader) SQUALL_TRY(bootstrap::createUniqueId(&id));
    std::vector<bootstrap::UniqueId> ids(static_cast<size_t>(n));
    static_assert(sizeof(bootstrap::UniqueId) % sizeof(int64_t) == 0);
    SQUALL_TRY(parent.allGather(&id, ids.data(), sizeof(id) / sizeof(int64_t), DataType::kI64));
    if (color < 0) {
      *newcomm = nullptr;
      return Status::kOk;
    }
    const int newRank = static_cast<int>(std::find(members.begin(), members.end(), parent.rank()) -
                                         members.begin());
    Settings settings{comm->kind, comm->timeout};
    return initRank(newcomm, static_cast<int>(members.size()), ids[members.front()], newRank,
                    settings);
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
    if (comm != nullptr && comm->nccl != nullptr && rank != nullptr) {
      *rank = comm->ncclRank;
      return Status::kOk;
    }
    SQUALL_TRY(checkComm(comm));
    SQUALL_REQUIRE(rank != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the rank output pointer is NULL");
    *rank = comm->coll->rank();
    return Status::kOk;
  });
}

squallResult_t squallCommSize(squallComm_t comm, int* size) {
  return SQUALL_API_GUARD({
    if (comm != nullptr && comm->nccl != nullptr && size != nullptr) {
      *size = comm->ncclSize;
      return Status::kOk;
    }
    SQUALL_TRY(checkComm(comm));
    SQUALL_REQUIRE(size != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the size output pointer is NULL");
    *size = comm->coll->size();
    return Status::kOk;
  });
}

squallResult_t squallCommTransport(squallComm_t comm, const char** name) {
  return SQUALL_API_GUARD({
    if (comm != nullptr && comm->nccl != nullptr && name != nullptr) {
      *name = "nccl";
      return Status::kOk;
    }
    SQUALL_TRY(checkComm(comm));
    SQUALL_REQUIRE(name != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the name output pointer is NULL");
    *name = comm->transport->name();
    return Status::kOk;
  });
}

squallResult_t squallAllReduce(const void* sendbuf, void* recvbuf, size_t count,
                               squallDataType_t dtype, squallRedOp_t op, squallComm_t comm) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    DataType t = DataType::kF32;
    ReduceOp o = ReduceOp::kSum;
    SQUALL_TRY(comm->coll->refuse(toDataType(dtype, &t)));
    SQUALL_TRY(comm->coll->refuse(toReduceOp(op, &o)));
    return comm->coll->allReduce(sendbuf, recvbuf, count, t, o);
  });
}

squallResult_t squallAllGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                               squallDataType_t dtype, squallComm_t comm) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    DataType t = DataType::kF32;
    SQUALL_TRY(comm->coll->refuse(toDataType(dtype, &t)));
    return comm->coll->allGather(sendbuf, recvbuf, sendcount, t);
  });
}

squallResult_t squallAllToAll(const void* sendbuf, void* recvbuf, size_t count,
                              squallDataType_t dtype, squallComm_t comm) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    DataType t = DataType::kF32;
    SQUALL_TRY(comm->coll->refuse(toDataType(dtype, &t)));
    return comm->coll->allToAll(sendbuf, recvbuf, count, t);
  });
}

squallResult_t squallBroadcast(void* buffer, size_t count, squallDataType_t dtype, int root,
                               squallComm_t comm) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    DataType t = DataType::kF32;
    SQUALL_TRY(comm->coll->refuse(toDataType(dtype, &t)));
    return comm->coll->broadcast(buffer, count, t, root);
  });
}

squallResult_t squallBarrier(squallComm_t comm) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    return comm->coll->barrier();
  });
}

squallResult_t squallCompressorCreate(squallComm_t comm, size_t count,
                                      const squallCodecSpec_t* spec,
                                      squallCompressor_t* compressor) {
  return SQUALL_API_GUARD({
    const bool device = comm != nullptr && comm->nccl != nullptr;
    if (!device) SQUALL_TRY(checkComm(comm));
    SQUALL_REQUIRE(compressor != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the compressor output pointer is NULL");
    squall::codec::Spec s;
    SQUALL_TRY(core::toCodecSpec(spec, &s));
    auto c = std::make_unique<squallCompressor>();
    c->comm = comm;
    if (device) {  // a communicator from NCCL: the state lives on the device
      SQUALL_TRY(core::createDeviceCompressor(comm, count, s, c.get()));
      *compressor = c.release();
      return Status::kOk;
    }
    SQUALL_TRY(coll::CompressedState::create(comm->coll->size(), count, s, &c->state));
    *compressor = c.release();
    return Status::kOk;
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
    SQUALL_REQUIRE(comm == nullptr || comm->nccl == nullptr, Status::kUnsupported, Subsys::kApi,
                   "a communicator from NCCL does not count bytes; NCCL moves them on the GPU");
    SQUALL_TRY(checkComm(comm));
    SQUALL_REQUIRE(stats != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the stats output pointer is NULL");
    stats->operations = comm->coll->operationsStarted();
    stats->bytesSent = comm->coll->bytesSent();
    stats->bytesReceived = comm->coll->bytesReceived();
    return Status::kOk;
  });
}

squallResult_t squallCompressorReset(squallCompressor_t compressor) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(compressor != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the compressor is NULL");
    if (compressor->state == nullptr) return core::resetDeviceCompressor(compressor);
    compressor->state->reset();
    return Status::kOk;
  });
}

squallResult_t squallCompressorGetStats(squallCompressor_t compressor,
                                        squallCompressorStats_t* stats) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(compressor != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the compressor is NULL");
    SQUALL_REQUIRE(stats != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the stats output pointer is NULL");
    if (compressor->state == nullptr) return core::deviceCompressorStats(compressor, stats);
    const coll::CompressedStats& last = compressor->state->lastStats();
    stats->calls = compressor->calls;
    stats->skippedCalls = compressor->state->worker().skipped();
    stats->bytesSent = last.bytesSent;
    stats->bytesReceived = last.bytesReceived;
    return Status::kOk;
  });
}

squallResult_t squallCompressedAllReduce(const void* sendbuf, void* recvbuf, squallDataType_t dtype,
                                         squallRedOp_t op, squallCompressor_t compressor,
                                         squallComm_t comm) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    SQUALL_TRY(comm->coll->refuse(checkCompressor(compressor, comm)));
    DataType t = DataType::kF32;
    ReduceOp o = ReduceOp::kSum;
    SQUALL_TRY(comm->coll->refuse(toDataType(dtype, &t)));
    SQUALL_TRY(comm->coll->refuse(toReduceOp(op, &o)));
    SQUALL_TRY(comm->coll->compressedAllReduce(sendbuf, recvbuf, t, o, compressor->state.get()));
    ++compressor->calls;
    return Status::kOk;
  });
}

squallResult_t squallAllReduceAsync(const void* sendbuf, void* recvbuf, size_t count,
                                    squallDataType_t dtype, squallRedOp_t op, squallComm_t comm,
                                    squallRequest_t* request) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    SQUALL_TRY(comm->coll->refuse(checkRequestOut(request)));
    DataType t = DataType::kF32;
    ReduceOp o = ReduceOp::kSum;
    SQUALL_TRY(comm->coll->refuse(toDataType(dtype, &t)));
    SQUALL_TRY(comm->coll->refuse(toReduceOp(op, &o)));
    coll::OperationPtr operation;
    SQUALL_TRY(comm->coll->startAllReduce(sendbuf, recvbuf, count, t, o, &operation));
    return wrapOperation(std::move(operation), request);
  });
}

squallResult_t squallCompressedAllReduceAsync(const void* sendbuf, void* recvbuf,
                                              squallDataType_t dtype, squallRedOp_t op,
                                              squallCompressor_t compressor, squallComm_t comm,
                                              squallRequest_t* request) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkComm(comm));
    SQUALL_TRY(comm->coll->refuse(checkCompressor(compressor, comm)));
    SQUALL_TRY(comm->coll->refuse(checkRequestOut(request)));
    DataType t = DataType::kF32;
    ReduceOp o = ReduceOp::kSum;
    SQUALL_TRY(comm->coll->refuse(toDataType(dtype, &t)));
    SQUALL_TRY(comm->coll->refuse(toReduceOp(op, &o)));
    coll::OperationPtr operation;
    SQUALL_TRY(comm->coll->startCompressedAllReduce(sendbuf, recvbuf, t, o, compressor->state.get(),
                                                    &operation));
    ++compressor->calls;
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
      // The failure was described on the thread that ran it; repeat it here.
      return SQUALL_FAIL(status, Subsys::kApi, "%s", owned->operation->error().c_str());
    }
    return Status::kOk;
  });
}

}  // extern "C"
