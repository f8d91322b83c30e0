#include "plugin/preload/engine.h"

namespace squall::preload {

namespace {
// The C API has already described the failure as its last error; keep it.
Status check(squallResult_t result, const char* what) {
  if (result == squallSuccess) return Status::kOk;
  return SQUALL_FAIL(result == squallUnsupported ? Status::kUnsupported : Status::kInternal,
                     Subsys::kApi, "%s failed: %s", what, squallGetLastError());
}
}  // namespace

Compressor::~Compressor() { squallCompressorDestroy(c_); }

Engine::Engine(squallComm_t comm) : comm_(comm) { squallCommSize(comm_, &size_); }

Engine::~Engine() { squallCommDestroy(comm_); }

Status Engine::fromMpi(const void* mpiComm, std::unique_ptr<Engine>* out) {
  squallComm_t comm = nullptr;
  SQUALL_TRY(check(squallCommInitFromMpi(&comm, mpiComm, nullptr), "squallCommInitFromMpi"));
  out->reset(new Engine(comm));
  return Status::kOk;
}

Status Engine::fromNccl(void* ncclComm, std::unique_ptr<Engine>* out) {
  squallComm_t comm = nullptr;
  SQUALL_TRY(check(squallCommInitFromNccl(&comm, ncclComm), "squallCommInitFromNccl"));
  out->reset(new Engine(comm));
  return Status::kOk;
}

Status Engine::createCompressor(size_t count, const squallCodecSpec_t& spec,
                                std::unique_ptr<Compressor>* out) {
  squallCompressor_t c = nullptr;
  SQUALL_TRY(check(squallCompressorCreate(comm_, count, &spec, &c), "squallCompressorCreate"));
  *out = std::make_unique<Compressor>(c);
  return Status::kOk;
}

static uint64_t lastBytes(Compressor& c) {
  squallCompressorStats_t stats{};
  return squallCompressorGetStats(c.get(), &stats) == squallSuccess ? stats.bytesSent : 0;
}

Status Engine::compressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op,
                                   Compressor& c, uint64_t* bytesSent) {
  SQUALL_TRY(check(squallCompressedAllReduce(in, out, static_cast<squallDataType_t>(dtype),
                                             static_cast<squallRedOp_t>(op), c.get(), comm_),
                   "squallCompressedAllReduce"));
  *bytesSent = lastBytes(c);
  return Status::kOk;
}

Status Engine::compressedAllReduceOnStream(const void* in, void* out, DataType dtype, ReduceOp op,
                                           Compressor& c, void* stream, uint64_t* bytesSent) {
  SQUALL_TRY(check(
      squallCompressedAllReduceOnStream(in, out, static_cast<squallDataType_t>(dtype),
                                        static_cast<squallRedOp_t>(op), c.get(), comm_, stream),
      "squallCompressedAllReduceOnStream"));
  *bytesSent = lastBytes(c);
  return Status::kOk;
}

}  // namespace squall::preload
