// core::Comm: creation (the one place a host communicator is assembled from
// a bootstrap, used by create, fromEnv and split), argument checks that do
// not depend on the engine, and routing to the engine.
#include "src/core/comm.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "src/bootstrap/local_ranks.h"
#include "src/codec/parallel.h"
#include "src/common/params.h"
#include "src/core/engine.h"

namespace squall::core {

Status CommConfig::fromEnvironment(CommConfig* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kInit,
                 "the config output pointer is NULL");
  CommConfig c;
  SQUALL_TRY(chooseTransport(squallTransportDefault, &c.transport));
  c.timeout = std::chrono::milliseconds(std::max<int64_t>(paramInt(Param::kTimeoutS), 1) * 1000);
  *out = c;
  return Status::kOk;
}

Comm::Comm(std::unique_ptr<Engine> engine, const CommConfig& config)
    : engine_(std::move(engine)), config_(config) {}

Comm::~Comm() = default;

Status Comm::fromBootstrap(std::unique_ptr<bootstrap::Bootstrap> bootstrap,
                           const CommConfig& config, std::unique_ptr<Comm>* out) {
  // The codec's default thread count divides this machine's cores among the
  // ranks that share them.
  int localRanks = 1;
  SQUALL_TRY(bootstrap::countLocalRanks(*bootstrap, &localRanks));
  codec::setLocalRanks(localRanks);
  std::unique_ptr<transport::Transport> transport;
  SQUALL_TRY(createTransport(config.transport, *bootstrap, waitOptions(localRanks), &transport));
  std::unique_ptr<Engine> engine;
  SQUALL_TRY(createHostEngine(std::move(bootstrap), std::move(transport), config, &engine));
  SQUALL_INFO(Subsys::kInit, "rank %d of %d ready over %s", engine->rank(), engine->size(),
              engine->transportName());
  out->reset(new Comm(std::move(engine), config));
  return Status::kOk;
}

Status Comm::create(const bootstrap::UniqueId& id, int nranks, int rank, const CommConfig& config,
                    std::unique_ptr<Comm>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the communicator output pointer is NULL");
  SQUALL_REQUIRE(nranks >= 1, Status::kInvalidArgument, Subsys::kApi,
                 "nranks is %d; a communicator needs at least one rank", nranks);
  SQUALL_REQUIRE(rank >= 0 && rank < nranks, Status::kInvalidArgument, Subsys::kApi,
                 "rank %d is outside 0..%d (nranks %d)", rank, nranks - 1, nranks);
  SQUALL_REQUIRE(
      config.transport != TransportKind::kMpi && config.transport != TransportKind::kNccl,
      Status::kInvalidUsage, Subsys::kApi,
      "the %s transport runs over an existing communicator: use Comm::%s",
      config.transport == TransportKind::kMpi ? "MPI" : "NCCL",
      config.transport == TransportKind::kMpi ? "fromMpi" : "fromNccl");
  std::unique_ptr<bootstrap::Bootstrap> b;
  SQUALL_TRY(bootstrap::Bootstrap::create(id, nranks, rank, config.timeout, &b));
  return fromBootstrap(std::move(b), config, out);
}

Status Comm::fromEnv(const CommConfig& config, std::unique_ptr<Comm>* out) {
  bootstrap::UniqueId id;
  int rank = 0, nranks = 0;
  SQUALL_TRY(bootstrap::uniqueIdFromEnv(&id, &rank, &nranks));
  return create(id, nranks, rank, config, out);
}

// Comm::fromMpi: comm_mpi.cc (or comm_mpi_stub.cc without MPI).

Status Comm::fromNccl(void* ncclComm, std::unique_ptr<Comm>* out) {
  SQUALL_REQUIRE(out != nullptr && ncclComm != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the communicator output and the ncclComm_t must be set");
  std::unique_ptr<Engine> engine;
  SQUALL_TRY(createNcclEngine(ncclComm, &engine));
  CommConfig config;
  config.transport = TransportKind::kNccl;
  out->reset(new Comm(std::move(engine), config));
  return Status::kOk;
}

Status Comm::split(int color, int key, std::unique_ptr<Comm>* out) {
  coll::Communicator* parent = nullptr;
  SQUALL_TRY(hostEngine(&parent));
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the new communicator output pointer is NULL");
  SQUALL_REQUIRE(engine_->canSplit(), Status::kUnsupported, Subsys::kApi,
                 "squallCommSplit is not available on a communicator built from MPI; split "
                 "the MPI communicator with MPI_Comm_split and call squallCommInitFromMpi");
  const int n = parent->size();
  // Everyone learns everyone's (color, key).
  const int64_t mine[2] = {color < 0 ? -1 : color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  SQUALL_TRY(parent->allGather(mine, all.data(), 2, DataType::kI64));
  std::vector<int> members;  // parent ranks of my group, in new-rank order
  for (int r = 0; r < n; ++r)
    if (color >= 0 && all[2 * static_cast<size_t>(r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  // The first member of each group creates its rendezvous id; all ids travel
  // in one all-gather (ranks that create none contribute zeros).
  const bool leader = !members.empty() && members.front() == parent->rank();
  bootstrap::UniqueId id{};
  if (leader) SQUALL_TRY(bootstrap::createUniqueId(&id));
  std::vector<bootstrap::UniqueId> ids(static_cast<size_t>(n));
  static_assert(sizeof(bootstrap::UniqueId) % sizeof(int64_t) == 0);
  SQUALL_TRY(parent->allGather(&id, ids.data(), sizeof(id) / sizeof(int64_t), DataType::kI64));
  if (color < 0) {
    out->reset();
    return Status::kOk;
  }
  const int newRank =
      static_cast<int>(std::find(members.begin(), members.end(), parent->rank()) - members.begin());
  return create(ids[static_cast<size_t>(members.front())], static_cast<int>(members.size()),
                newRank, config_, out);
}

int Comm::rank() const { return engine_->rank(); }
int Comm::size() const { return engine_->size(); }
const char* Comm::transportName() const { return engine_->transportName(); }
int Comm::device() const { return engine_->device(); }

Status Comm::hostEngine(coll::Communicator** out) {
  *out = engine_->host();
  SQUALL_REQUIRE(*out != nullptr, Status::kInvalidUsage, Subsys::kApi,
                 "this communicator was built from NCCL (squallCommInitFromNccl); it runs "
                 "squallCompressedAllReduceOnStream, squallCompressedReduceScatterOnStream and "
                 "squallOptimizerStepOnStream only (use "
                 "NCCL itself for the other collectives)");
  return Status::kOk;
}

Status Comm::stats(CommStats* out) {
  SQUALL_REQUIRE(engine_->host() != nullptr, Status::kUnsupported, Subsys::kApi,
                 "a communicator from NCCL does not count bytes; NCCL moves them on the GPU");
  const coll::Communicator& c = *engine_->host();
  out->operations = c.operationsStarted();
  out->bytesSent = c.bytesSent();
  out->bytesReceived = c.bytesReceived();
  return Status::kOk;
}

Status Comm::checkCompressor(const Compressor& c, CompressorLayout layout) const {
  SQUALL_REQUIRE(&c.comm() == this, Status::kInvalidUsage, Subsys::kApi,
                 "the compressor was created for another communicator; create one per "
                 "communicator and buffer");
  auto made = [](CompressorLayout l) {
    return l == CompressorLayout::kAllReduce ? "the compressed allreduce (squallCompressorCreate)"
           : l == CompressorLayout::kReduceScatter
               ? "the compressed reduce-scatter (squallCompressorCreateReduceScatter)"
               : "the quantized all-gather (squallCompressorCreateAllGather)";
  };
  SQUALL_REQUIRE(c.layout() == layout, Status::kInvalidUsage, Subsys::kApi,
                 "the compressor was made for %s; %s needs one of its own", made(c.layout()),
                 made(layout));
  return Status::kOk;
}

Status Engine::compressedAllGather(const void*, void*, DataType, Compressor&) {
  return SQUALL_FAIL(Status::kUnsupported, Subsys::kApi,
                     "a communicator from NCCL (squallCommInitFromNccl) runs the quantized "
                     "all-gather of device buffers only, on a stream: call "
                     "squallCompressedAllGatherOnStream, or use a host communicator");
}

Status Engine::compressedReduceScatter(const void*, void*, size_t, DataType, ReduceOp, Compressor&,
                                       coll::OperationPtr*) {
  return SQUALL_FAIL(Status::kUnsupported, Subsys::kApi,
                     "a communicator from NCCL (squallCommInitFromNccl) runs the compressed "
                     "reduce-scatter of device buffers only, on a stream: call "
                     "squallCompressedReduceScatterOnStream, or use a host communicator");
}

Status Comm::refuse(Status check) {
  coll::Communicator* host = engine_->host();
  return host != nullptr ? host->refuse(check) : check;
}

Status Comm::allReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->allReduce(in, out, count, dtype, op);
}

Status Comm::allGather(const void* in, void* out, size_t count, DataType dtype) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->allGather(in, out, count, dtype);
}

Status Comm::allToAll(const void* in, void* out, size_t count, DataType dtype) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->allToAll(in, out, count, dtype);
}

Status Comm::broadcast(void* buffer, size_t count, DataType dtype, int root) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->broadcast(buffer, count, dtype, root);
}

Status Comm::barrier() {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->barrier();
}

Status Comm::startAllReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                            coll::OperationPtr* operation) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->startAllReduce(in, out, count, dtype, op, operation);
}

Status Comm::startAllGather(const void* in, void* out, size_t count, DataType dtype,
                            coll::OperationPtr* operation) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->startAllGather(in, out, count, dtype, operation);
}

Status Comm::startAllToAll(const void* in, void* out, size_t count, DataType dtype,
                           coll::OperationPtr* operation) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->startAllToAll(in, out, count, dtype, operation);
}

Status Comm::startBroadcast(void* buffer, size_t count, DataType dtype, int root,
                            coll::OperationPtr* operation) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->startBroadcast(buffer, count, dtype, root, operation);
}

Status Comm::startBarrier(coll::OperationPtr* operation) {
  coll::Communicator* c = nullptr;
  SQUALL_TRY(hostEngine(&c));
  return c->startBarrier(operation);
}

// A device compressor keeps its residuals on the GPU (compressor_state.h).
Status Compressor::residualCounts(size_t*, size_t*) {
  return SQUALL_FAIL(Status::kUnsupported, Subsys::kApi,
                     "this compressor keeps no residuals (a quantized all-gather's): there is "
                     "nothing to save or load");
}
Status Compressor::readResiduals(void*, void*) {
  size_t w = 0, s = 0;
  return residualCounts(&w, &s);
}
Status Compressor::writeResiduals(const void*, const void*) {
  size_t w = 0, s = 0;
  return residualCounts(&w, &s);
}

Status Comm::createCompressor(size_t count, const codec::Spec& spec,
                              std::unique_ptr<Compressor>* out, size_t phase,
                              coll::Feedback feedback) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the compressor output pointer is NULL");
  return engine_->createCompressor(this, count, spec, phase, feedback, out);
}

Status Comm::compressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op,
                                 Compressor& c) {
  coll::Communicator* host = nullptr;
  SQUALL_TRY(hostEngine(&host));
  SQUALL_TRY(host->refuse(checkCompressor(c, CompressorLayout::kAllReduce)));
  return engine_->compressedAllReduce(in, out, dtype, op, c, nullptr);
}

Status Comm::startCompressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op,
                                      Compressor& c, coll::OperationPtr* operation) {
  coll::Communicator* host = nullptr;
  SQUALL_TRY(hostEngine(&host));
  SQUALL_TRY(host->refuse(checkCompressor(c, CompressorLayout::kAllReduce)));
  SQUALL_REQUIRE(operation != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the request output pointer is NULL");
  return engine_->compressedAllReduce(in, out, dtype, op, c, operation);
}

Status Comm::compressedAllReduceOnStream(const void* in, void* out, DataType dtype, ReduceOp op,
                                         Compressor& c, void* cudaStream) {
  SQUALL_TRY(checkCompressor(c, CompressorLayout::kAllReduce));
  SQUALL_REQUIRE(dtype == DataType::kF32 || dtype == DataType::kF16 || dtype == DataType::kBf16,
                 Status::kInvalidArgument, Subsys::kApi,
                 "the compressed allreduce takes fp32, fp16 or bf16, not %s", dataTypeName(dtype));
  SQUALL_REQUIRE(op == ReduceOp::kSum || op == ReduceOp::kAvg, Status::kInvalidArgument,
                 Subsys::kApi, "the compressed allreduce supports sum and avg, not %s",
                 reduceOpName(op));
  return engine_->compressedAllReduceOnStream(in, out, dtype, op, c, cudaStream);
}

Status Comm::createReduceScatterCompressor(size_t recvcount, const codec::Spec& spec,
                                           std::unique_ptr<Compressor>* out,
                                           coll::Feedback feedback) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the compressor output pointer is NULL");
  return engine_->createReduceScatterCompressor(this, recvcount, spec, feedback, out);
}

Status Comm::compressedReduceScatter(const void* in, void* out, size_t recvcount, DataType dtype,
                                     ReduceOp op, Compressor& c) {
  coll::Communicator* host = engine_->host();
  if (host == nullptr)
    return engine_->compressedReduceScatter(in, out, recvcount, dtype, op, c,
                                            nullptr);  // kUnsupported
  SQUALL_TRY(host->refuse(checkCompressor(c, CompressorLayout::kReduceScatter)));
  return engine_->compressedReduceScatter(in, out, recvcount, dtype, op, c, nullptr);
}

Status Comm::startCompressedReduceScatter(const void* in, void* out, size_t recvcount,
                                          DataType dtype, ReduceOp op, Compressor& c,
                                          coll::OperationPtr* operation) {
  coll::Communicator* host = engine_->host();
  if (host == nullptr)
    return engine_->compressedReduceScatter(in, out, recvcount, dtype, op, c,
                                            operation);  // kUnsupported
  SQUALL_TRY(host->refuse(checkCompressor(c, CompressorLayout::kReduceScatter)));
  SQUALL_REQUIRE(operation != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the request output pointer is NULL");
  return engine_->compressedReduceScatter(in, out, recvcount, dtype, op, c, operation);
}

Status Comm::compressedReduceScatterOnStream(const void* in, void* out, size_t recvcount,
                                             DataType dtype, ReduceOp op, Compressor& c,
                                             void* cudaStream) {
  SQUALL_TRY(checkCompressor(c, CompressorLayout::kReduceScatter));
  const auto n = static_cast<size_t>(size());
  SQUALL_REQUIRE(recvcount * n == c.count(), Status::kInvalidArgument, Subsys::kApi,
                 "compressed reduce-scatter: recvcount is %zu but the compressor was made for "
                 "%zu elements per rank (an input of %zu x %zu); make one compressor per buffer",
                 recvcount, c.count() / n, n, c.count() / n);
  SQUALL_REQUIRE(dtype == DataType::kF32 || dtype == DataType::kF16 || dtype == DataType::kBf16,
                 Status::kInvalidArgument, Subsys::kApi,
                 "the compressed reduce-scatter takes fp32, fp16 or bf16, not %s",
                 dataTypeName(dtype));
  SQUALL_REQUIRE(op == ReduceOp::kSum || op == ReduceOp::kAvg, Status::kInvalidArgument,
                 Subsys::kApi, "the compressed reduce-scatter supports sum and avg, not %s",
                 reduceOpName(op));
  const size_t esize = dataTypeSize(dtype);
  const auto from = reinterpret_cast<uintptr_t>(in);
  const auto to = reinterpret_cast<uintptr_t>(out);
  const bool inPlace = to == from + static_cast<size_t>(rank()) * recvcount * esize;
  const bool apart = to + recvcount * esize <= from || from + c.count() * esize <= to;
  SQUALL_REQUIRE(c.count() == 0 || (in != nullptr && out != nullptr), Status::kInvalidArgument,
                 Subsys::kApi,
                 "compressed reduce-scatter: the send and receive buffers must be set");
  SQUALL_REQUIRE(c.count() == 0 || inPlace || apart, Status::kInvalidArgument, Subsys::kApi,
                 "compressed reduce-scatter: the receive buffer overlaps the send buffer but is "
                 "not this rank's piece of it (rank %d at element %zu); use separate buffers or "
                 "exactly that piece",
                 rank(), static_cast<size_t>(rank()) * recvcount);
  return engine_->compressedReduceScatterOnStream(in, out, recvcount, dtype, op, c, cudaStream);
}

Status Comm::createAllGatherCompressor(size_t sendcount, const codec::Spec& spec,
                                       std::unique_ptr<Compressor>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the compressor output pointer is NULL");
  return engine_->createAllGatherCompressor(this, sendcount, spec, out);
}

namespace {

Status checkGatherType(DataType dtype) {
  SQUALL_REQUIRE(dtype == DataType::kF32 || dtype == DataType::kF16 || dtype == DataType::kBf16,
                 Status::kInvalidArgument, Subsys::kApi,
                 "the quantized all-gather takes fp32, fp16 or bf16, not %s", dataTypeName(dtype));
  return Status::kOk;
}

// The input is this rank's piece of the output, or apart from all of it.
Status checkGatherBuffers(const Comm& comm, const void* in, const void* out, size_t count,
                          DataType dtype) {
  const size_t esize = dataTypeSize(dtype);
  const auto from = reinterpret_cast<uintptr_t>(in);
  const auto to = reinterpret_cast<uintptr_t>(out);
  const size_t total = count * static_cast<size_t>(comm.size()) * esize;
  const bool inPlace = from == to + static_cast<size_t>(comm.rank()) * count * esize;
  const bool apart = from + count * esize <= to || to + total <= from;
  SQUALL_REQUIRE(count == 0 || (in != nullptr && out != nullptr), Status::kInvalidArgument,
                 Subsys::kApi, "quantized all-gather: the send and receive buffers must be set");
  SQUALL_REQUIRE(count == 0 || inPlace || apart, Status::kInvalidArgument, Subsys::kApi,
                 "quantized all-gather: the send buffer overlaps the receive buffer but is not "
                 "this rank's piece of it (rank %d at element %zu); use separate buffers or "
                 "exactly that piece",
                 comm.rank(), static_cast<size_t>(comm.rank()) * count);
  return Status::kOk;
}

}  // namespace

Status Comm::compressedAllGather(const void* in, void* out, DataType dtype, Compressor& c) {
  coll::Communicator* host = engine_->host();
  if (host == nullptr) return engine_->compressedAllGather(in, out, dtype, c);  // kUnsupported
  SQUALL_TRY(host->refuse(checkCompressor(c, CompressorLayout::kAllGather)));
  SQUALL_TRY(host->refuse(checkGatherType(dtype)));
  SQUALL_TRY(host->refuse(checkGatherBuffers(*this, in, out, c.count(), dtype)));
  return engine_->compressedAllGather(in, out, dtype, c);
}

Status Comm::compressedAllGatherOnStream(const void* in, void* out, DataType dtype, Compressor& c,
                                         void* cudaStream) {
  SQUALL_TRY(checkCompressor(c, CompressorLayout::kAllGather));
  SQUALL_TRY(checkGatherType(dtype));
  SQUALL_TRY(checkGatherBuffers(*this, in, out, c.count(), dtype));
  return engine_->compressedAllGatherOnStream(in, out, dtype, c, cudaStream);
}

Status Comm::createOptimizer(size_t count, const optim::Config& config,
                             std::unique_ptr<Optimizer>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the optimizer output pointer is NULL");
  std::unique_ptr<optim::Optimizer> impl;
  SQUALL_TRY(engine_->createOptimizer(count, config, &impl));
  out->reset(new Optimizer(this, std::move(impl)));
  return Status::kOk;
}

namespace {

Status checkStepBuffers(size_t count, const float* params, const float* grads) {
  SQUALL_REQUIRE(count == 0 || (params != nullptr && grads != nullptr), Status::kInvalidArgument,
                 Subsys::kApi,
                 "squallOptimizerStep: params and grads must point to %zu floats each", count);
  if (count != 0) {
    const auto* p = reinterpret_cast<const char*>(params);
    const auto* g = reinterpret_cast<const char*>(grads);
    const size_t bytes = count * sizeof(float);
    SQUALL_REQUIRE(p + bytes <= g || g + bytes <= p, Status::kInvalidArgument, Subsys::kApi,
                   "squallOptimizerStep: params and grads overlap; pass separate buffers");
  }
  return Status::kOk;
}

}  // namespace

Optimizer::Optimizer(const Comm* comm, std::unique_ptr<optim::Optimizer> impl)
    : comm_(comm), impl_(std::move(impl)) {}

Optimizer::~Optimizer() = default;

size_t Optimizer::count() const { return impl_->count(); }
bool Optimizer::onDevice() const { return impl_->onDevice(); }

Status Optimizer::step(float* params, const float* grads, float lr) {
  if (!impl_->onDevice()) {
    SQUALL_TRY(impl_->refuseStep(checkStepBuffers(impl_->count(), params, grads)));
  }
  return impl_->step(params, grads, lr);
}

Status Optimizer::stepOnStream(float* params, const float* grads, float lr, void* cudaStream) {
  if (impl_->onDevice()) return impl_->stepOnStream(params, grads, lr, cudaStream);
  SQUALL_REQUIRE(impl_->count() == 0 || (params != nullptr && grads != nullptr),
                 Status::kInvalidArgument, Subsys::kApi,
                 "squallOptimizerStepOnStream: params and grads must point to %zu floats each",
                 impl_->count());
  return stagedOptimizerStep(*impl_, params, grads, lr, cudaStream);
}

Status Optimizer::info(optim::Info* out) const {
  *out = impl_->info();
  return Status::kOk;
}

Status Optimizer::stateSize(size_t* bytes) const {
  *bytes = impl_->stateSize();
  return Status::kOk;
}

Status Optimizer::saveState(void* buffer, size_t capacity, size_t* written) const {
  return impl_->saveState(buffer, capacity, written);
}

Status Optimizer::loadState(const void* buffer, size_t bytes) {
  return impl_->loadState(buffer, bytes);
}

}  // namespace squall::core
