// The engines behind core::Comm (comm.h), private to core. An engine runs
// what its kind of communicator can run; Comm checks the caller's arguments
// and the compressor's owner first, and routes the host collectives to
// host() when the engine has them.
#pragma once

#include <functional>
#include <memory>

#include "src/bootstrap/bootstrap.h"
#include "src/coll/communicator.h"
#include "src/core/comm.h"
#include "src/transport/transport.h"

namespace squall::core {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* transportName() const = 0;
  // The host collectives; null when the engine has none.
  virtual coll::Communicator* host() { return nullptr; }
  // The engine rendezvoused through a bootstrap, so split can make new ones.
  virtual bool canSplit() const { return false; }
  // The CUDA device the engine's state lives on; -1 when it keeps none there.
  virtual int device() const { return -1; }

  virtual Status createCompressor(const Comm* owner, size_t count, const codec::Spec& spec,
                                  size_t phase, coll::Feedback feedback,
                                  std::unique_ptr<Compressor>* out) = 0;
  // Host buffers; `operation` null: blocking. c belongs to this engine.
  virtual Status compressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op,
                                     Compressor& c, coll::OperationPtr* operation) = 0;
  virtual Status compressedAllReduceOnStream(const void* in, void* out, DataType dtype, ReduceOp op,
                                             Compressor& c, void* stream) = 0;
  // The compressed reduce-scatter.
  virtual Status createReduceScatterCompressor(const Comm* owner, size_t recvcount,
                                               const codec::Spec& spec, coll::Feedback feedback,
                                               std::unique_ptr<Compressor>* out) = 0;
  // Host buffers; `operation` null: blocking. c belongs to this engine. By
  // default (the NCCL engine) refused with kUnsupported: device buffers only.
  virtual Status compressedReduceScatter(const void* in, void* out, size_t recvcount,
                                         DataType dtype, ReduceOp op, Compressor& c,
                                         coll::OperationPtr* operation);
  // Device buffers on a CUDA stream.
  virtual Status compressedReduceScatterOnStream(const void* in, void* out, size_t recvcount,
                                                 DataType dtype, ReduceOp op, Compressor& c,
                                                 void* stream) = 0;
  // The quantized all-gather (Comm::createAllGatherCompressor); host buffers
  // by default refused with kUnsupported (the NCCL engine).
  virtual Status createAllGatherCompressor(const Comm* owner, size_t sendcount,
                                           const codec::Spec& spec,
                                           std::unique_ptr<Compressor>* out) = 0;
  virtual Status compressedAllGather(const void* in, void* out, DataType dtype, Compressor& c);
  virtual Status compressedAllGatherOnStream(const void* in, void* out, DataType dtype,
                                             Compressor& c, void* stream) = 0;
  // The schedule over this engine's backend (host or device memory).
  virtual Status createOptimizer(size_t count, const optim::Config& config,
                                 std::unique_ptr<optim::Optimizer>* out) = 0;
};

// host_engine.cc. `bootstrap` may be null (a transport from MPI).
Status createHostEngine(std::unique_ptr<bootstrap::Bootstrap> bootstrap,
                        std::unique_ptr<transport::Transport> transport, const CommConfig& config,
                        std::unique_ptr<Engine>* out);

// nccl_engine.cc with CUDA and NCCL; engine_stub.cc (kUnsupported) without.
Status createNcclEngine(void* ncclComm, std::unique_ptr<Engine>* out);
// Whether this build has the GPU path (nccl_engine.cc: true, engine_stub.cc:
// false); whether a GPU and an NCCL are there is decided at run time.
bool devicePathBuilt();

// Device buffers on a host engine, staged through host memory (host_staging.cc
// with CUDA and NCCL; engine_stub.cc, kUnsupported, without).
class Staging {
 public:
  virtual ~Staging() = default;
};
// The compressed allreduce of state.count() elements: copy in on `stream`,
// wait, the host compressed allreduce, copy out, wait. `staging` keeps the
// pinned buffers from call to call.
Status stagedCompressedAllReduce(coll::Communicator& comm, coll::CompressedState& state,
                                 std::unique_ptr<Staging>* staging, const void* in, void* out,
                                 DataType dtype, ReduceOp op, void* stream);
// The compressed reduce-scatter of state.count() elements into
// state.chunk(), staged the same way.
Status stagedCompressedReduceScatter(coll::Communicator& comm, coll::CompressedState& state,
                                     std::unique_ptr<Staging>* staging, const void* in, void* out,
                                     DataType dtype, ReduceOp op, void* stream);
// Any host collective on device buffers: copies inBytes of `in` to pinned
// memory on `stream`, waits, runs `run(pinnedIn, pinnedOut)`, copies outBytes
// back to `out`, waits.
Status stagedCall(std::unique_ptr<Staging>* staging, const void* in, size_t inBytes, void* out,
                  size_t outBytes, void* stream,
                  const std::function<Status(const void*, void*)>& run);
// One step of a host optimizer on device buffers.
Status stagedOptimizerStep(optim::Optimizer& optimizer, float* params, const float* grads, float lr,
                           void* stream);

}  // namespace squall::core
