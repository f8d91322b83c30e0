// The C++ face of Squall: one communicator owning one engine, with the
// collectives, compressors and optimizers on it. The C API (api_*.cc), the
// NCCL plugin and the interposer all build on this; none of them sees an
// engine.
//
// Engines (engine.h, private to core):
//   host: coll::Communicator over a transport (tcp / ucx / mpi) and the
//         bootstrap it rendezvoused through; runs every collective on host
//         buffers, and device buffers on a CUDA stream staged through pinned
//         memory;
//   NCCL: a borrowed ncclComm_t (transport::nccl::DeviceComm), the device
//         compressed state and the device optimizer; runs only the
//         stream-ordered operations (compressedAllReduceOnStream and an
//         optimizer's stepOnStream).
// An operation the engine cannot run fails with kInvalidUsage and a sentence
// saying what to use instead. Device entry points in a build without CUDA
// fail with kUnsupported.
//
// Like coll::Communicator, a Comm is driven by one thread at a time, every
// rank calls the same operations in the same order, and a Compressor or
// Optimizer is used only with the Comm that created it (which must outlive
// it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "src/bootstrap/bootstrap.h"
#include "src/codec/wire.h"
#include "src/coll/communicator.h"
#include "src/common/status.h"
#include "src/common/types.h"
#include "src/core/transports.h"
#include "src/optim/optimizer.h"

namespace squall::core {

class Engine;

// What squallConfig_t carries, already validated.
struct CommConfig {
  // Resolved, never "default" (kUcxOrTcp is settled when the transport is built).
  TransportKind transport = TransportKind::kTcp;
  std::chrono::milliseconds timeout{300000};
  // SQUALL_TRANSPORT (auto: ucx when built in and every rank can load it,
  // else tcp) and SQUALL_TIMEOUT_S.
  static Status fromEnvironment(CommConfig* out);
};

// What a communicator has moved since it was created, counted where its
// collectives post their sends and receives.
struct CommStats {
  uint64_t operations = 0;  // collectives started
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
};

struct CompressorStats {
  uint64_t calls = 0;         // compressed allreduces (or reduce-scatters) run with this compressor
  uint64_t skippedCalls = 0;  // of which left the residuals alone (non-finite input)
  uint64_t bytesSent = 0;     // payload bytes of the last call
  uint64_t bytesReceived = 0;
  // What the last call ran: "twophase", "allgather", "hierarchical",
  // "reducescatter" or "none" (coll::CompressedStats), and its bytes to other hosts
  // (hierarchical only).
  const char* algorithm = "none";
  uint64_t crossBytesSent = 0;
  // The residual layout: hosts 0 for the flat one (the residuals cover the
  // whole buffer); else H hosts of ranksPerHost ranks, and this rank's
  // residuals cover the slice [sliceBegin, sliceBegin + sliceCount).
  int hosts = 0;
  int ranksPerHost = 1;
  size_t sliceBegin = 0;
  size_t sliceCount = 0;
};

class Comm;

// Which collective a compressor was made for; it runs that one only.
enum class CompressorLayout : uint8_t {
  kAllReduce,      // Comm::createCompressor
  kReduceScatter,  // Comm::createReduceScatterCompressor
  kAllGather,      // Comm::createAllGatherCompressor (no residuals)
};

// The residuals of one buffer (count elements, one codec) for the compressed
// allreduce or reduce-scatter, on the host or on the device depending on the
// engine.
class Compressor {
 public:
  virtual ~Compressor() = default;
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  const Comm& comm() const { return *comm_; }
  // The elements of a call's input: n x recvcount for the reduce-scatter.
  size_t count() const { return count_; }
  CompressorLayout layout() const { return layout_; }
  const codec::Spec& spec() const { return spec_; }
  // Where the codec's blocks lie: element 0 is `phase` elements into a block
  // of the sequence the buffer belongs to (Comm::createCompressor).
  size_t phase() const { return phase_; }
  // Zeroes the residuals (a device compressor waits for its last stream).
  virtual Status reset() = 0;
  // A device compressor waits for its last stream.
  virtual Status stats(CompressorStats* out) = 0;
  // The payload bytes this rank sends in one call, without waiting for
  // anything: a device compressor's from its sizes (the same every call), a
  // host compressor's of its last call (0 before one).
  virtual uint64_t bytesSentPerCall() const = 0;
  // How the allreduce picks its algorithm (squallCompressorSetAlgorithm):
  // kAuto (the time model), kAutoBytes, or a fixed one.
  virtual Status setAlgorithm(coll::CompressedAlgo algo) = 0;
  // The code the two-phase allreduce's servers re-encode with
  // (coll::CompressedState::setGatherSpec). A device compressor takes it
  // before its first call only (coll::device::DeviceCompressedState).
  virtual Status setGatherSpec(const codec::Spec& spec) = 0;

  // Handing error feedback from one compressor to another, for a caller that
  // cuts the same elements into buffers differently from call to call (the
  // interposer's step, docs/preload.md). Local to this rank; each rank hands
  // over its own part, and no element's owed error is counted twice.
  //
  // drain adds to owed[i] (i < count()) what this rank's residuals hold for
  // element i and has not been delivered yet, and zeroes them: the worker
  // residual, plus the server residual of the elements this rank serves,
  // times the group size when the calls averaged (their server residual is
  // of the mean, and a worker's input reaches the mean divided by n). seed
  // adds owed[i] to this rank's worker residual of element i, so the next
  // call delivers it. A device compressor copies through host memory and
  // waits for `cudaStream` (ignored on the host). kUnsupported for the
  // hierarchical layout, whose worker residual covers one slice of the
  // buffer per rank.
  virtual Status drain(float* owed, ReduceOp averagedOrSummed, void* cudaStream) = 0;
  virtual Status seed(const float* owed, void* cudaStream) = 0;

  // Checkpoints (compressor_state.cc): this rank's residuals as they stand
  // after the last completed call, the worker's then the server's (none
  // without feedback; no server residual for the reduce-scatter), as raw
  // fp32 bytes at any alignment. writeResiduals takes values of exactly
  // residualCounts' sizes. The base refuses both (kUnsupported).
  virtual Status residualCounts(size_t* worker, size_t* server);
  virtual Status readResiduals(void* worker, void* server);
  virtual Status writeResiduals(const void* worker, const void* server);

 protected:
  Compressor(const Comm* comm, size_t count, const codec::Spec& spec, size_t phase,
             CompressorLayout layout = CompressorLayout::kAllReduce)
      : comm_(comm), count_(count), spec_(spec), phase_(phase), layout_(layout) {}

 private:
  const Comm* comm_;
  size_t count_;
  codec::Spec spec_;
  size_t phase_;
  CompressorLayout layout_;
};

// APMSqueeze / sync / local Adam (+ SlowMo) over one flat fp32 buffer of
// count() parameters: the one schedule of src/optim over a backend in host
// memory (host engine) or in device memory (NCCL engine).
class Optimizer {
 public:
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const Comm& comm() const { return *comm_; }
  size_t count() const;
  // The state is in device memory (an optimizer of the NCCL engine).
  bool onDevice() const;
  // One step on host buffers (host engine); lr > 0 overrides the configured
  // rate. Bad buffers are refused on every rank (optim::Optimizer::refuseStep).
  // kInvalidUsage on the device.
  Status step(float* params, const float* grads, float lr);
  // One step on device buffers, enqueued on `cudaStream`: on the device (NCCL
  // engine), or staged through host memory around a host step (host engine,
  // two stream waits).
  Status stepOnStream(float* params, const float* grads, float lr, void* cudaStream);
  Status info(optim::Info* out) const;
  // On the device these wait for the stream of the last step.
  Status stateSize(size_t* bytes) const;
  Status saveState(void* buffer, size_t capacity, size_t* written) const;
  Status loadState(const void* buffer, size_t bytes);

 private:
  friend class Comm;
  Optimizer(const Comm* comm, std::unique_ptr<optim::Optimizer> impl);
  const Comm* comm_;
  std::unique_ptr<optim::Optimizer> impl_;
};

class Comm {
 public:
  // Rendezvous of `nranks` ranks through `id` (made by one rank with
  // bootstrap::createUniqueId and shared), then the transport of `config`.
  static Status create(const bootstrap::UniqueId& id, int nranks, int rank,
                       const CommConfig& config, std::unique_ptr<Comm>* out);
  // The same from MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE (torchrun).
  static Status fromEnv(const CommConfig& config, std::unique_ptr<Comm>* out);
  // Over an existing MPI communicator (`mpiComm` points to an MPI_Comm of
  // the Open MPI the process has loaded); config.transport is ignored.
  // kUnsupported in a build without MPI, or when the process's MPI is not
  // Open MPI's ABI or no Open MPI can be loaded.
  static Status fromMpi(const void* mpiComm, const CommConfig& config, std::unique_ptr<Comm>* out);
  // Over a borrowed ncclComm_t (it must outlive the Comm). kUnsupported in a
  // build without CUDA and NCCL, or when NCCL cannot be loaded.
  static Status fromNccl(void* ncclComm, std::unique_ptr<Comm>* out);

  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Collective over this communicator: ranks with the same color >= 0 form a
  // new one, ordered by key (ties by rank); color < 0 gets a null `out`.
  // The new communicator has this one's transport and timeout. Host engines
  // built by rendezvous only.
  Status split(int color, int key, std::unique_ptr<Comm>* out);

  int rank() const;
  int size() const;
  // Host engines; a communicator from NCCL counts nothing (kUnsupported).
  Status stats(CommStats* out);
  const char* transportName() const;  // "tcp", "ucx", "mpi", "nccl"
  // A communicator from NCCL: the CUDA device current when it was wrapped,
  // where its compressors and optimizers keep their state. -1 otherwise.
  int device() const;
  const CommConfig& config() const { return config_; }

  // coll::Communicator::refuse: this rank's next collective is refused for a
  // bad argument, and the peers learn it. kOk passes through; on an engine
  // without host collectives the check is returned as it is.
  Status refuse(Status check);

  // Host collectives (host engine), blocking.
  Status allReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op);
  Status allGather(const void* in, void* out, size_t count, DataType dtype);
  Status allToAll(const void* in, void* out, size_t count, DataType dtype);
  Status broadcast(void* buffer, size_t count, DataType dtype, int root);
  Status barrier();
  // ... and started, finishing on the communicator's worker thread.
  Status startAllReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                        coll::OperationPtr* operation);
  Status startAllGather(const void* in, void* out, size_t count, DataType dtype,
                        coll::OperationPtr* operation);
  Status startAllToAll(const void* in, void* out, size_t count, DataType dtype,
                       coll::OperationPtr* operation);
  Status startBroadcast(void* buffer, size_t count, DataType dtype, int root,
                        coll::OperationPtr* operation);
  Status startBarrier(coll::OperationPtr* operation);

  // A compressor for `count` elements; every rank makes one alike. `phase`
  // (below the codec's block) places the buffer inside a longer sequence:
  // its element 0 is `phase` elements into one of the sequence's blocks, so
  // its blocks are the sequence's wherever the buffer begins. Host engines
  // with the flat layout honour it; the hierarchical layout and the NCCL
  // engine keep the buffer's own blocks (the compressor's phase() says 0).
  // Feedback::kNone (host engines): no residuals, every call encoded on its
  // own (coll::Feedback); the NCCL engine always keeps them.
  Status createCompressor(size_t count, const codec::Spec& spec, std::unique_ptr<Compressor>* out,
                          size_t phase = 0, coll::Feedback feedback = coll::Feedback::kKept);
  // The compressed allreduce of c.count() elements of fp32, fp16 or bf16,
  // sum or avg, on host buffers (host engine).
  Status compressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op, Compressor& c);
  Status startCompressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op,
                                  Compressor& c, coll::OperationPtr* operation);
  // Device buffers on a CUDA stream: on the NCCL engine on the device
  // (stream-ordered, capturable); on a host engine staged through pinned
  // memory (waits for the stream twice). kUnsupported without CUDA.
  Status compressedAllReduceOnStream(const void* in, void* out, DataType dtype, ReduceOp op,
                                     Compressor& c, void* cudaStream);

  // A compressor for the compressed reduce-scatter of n x recvcount elements
  // (n = size()), every rank's piece of recvcount encoded on its own
  // (coll::CompressedState::createReduceScatter); every rank makes one alike.
  // On a communicator from NCCL its state is on the device.
  Status createReduceScatterCompressor(size_t recvcount, const codec::Spec& spec,
                                       std::unique_ptr<Compressor>* out,
                                       coll::Feedback feedback = coll::Feedback::kKept);
  // The compressed reduce-scatter of c.count() elements of fp32, fp16 or
  // bf16 in `in` into recvcount (c's) in `out`, sum or avg, on host buffers
  // (host engine; kUnsupported on one from NCCL, whose buffers are on the
  // device). `out` may be this rank's piece of `in`.
  Status compressedReduceScatter(const void* in, void* out, size_t recvcount, DataType dtype,
                                 ReduceOp op, Compressor& c);
  Status startCompressedReduceScatter(const void* in, void* out, size_t recvcount, DataType dtype,
                                      ReduceOp op, Compressor& c, coll::OperationPtr* operation);
  // Device buffers on a CUDA stream, as compressedAllReduceOnStream: on the
  // NCCL engine on the device; on a host engine staged through pinned memory.
  Status compressedReduceScatterOnStream(const void* in, void* out, size_t recvcount,
                                         DataType dtype, ReduceOp op, Compressor& c,
                                         void* cudaStream);

  // A compressor for the quantized all-gather of sendcount elements per rank
  // (sharded data parallel's parameter gathers): each rank's input encoded
  // once with `spec`, without a residual; every rank makes one alike.
  Status createAllGatherCompressor(size_t sendcount, const codec::Spec& spec,
                                   std::unique_ptr<Compressor>* out);
  // `in` (c.count() elements of fp32, fp16 or bf16) to every rank; `out`
  // gets n x c.count(), rank j's piece the decode of rank j's encoding (this
  // rank's own included: every rank the same values). `in` may be this
  // rank's piece of `out`. Host buffers (host engine; kUnsupported on one
  // from NCCL), or device buffers on a stream.
  Status compressedAllGather(const void* in, void* out, DataType dtype, Compressor& c);
  Status compressedAllGatherOnStream(const void* in, void* out, DataType dtype, Compressor& c,
                                     void* cudaStream);

  // An optimizer of `count` parameters; every rank makes one alike.
  Status createOptimizer(size_t count, const optim::Config& config,
                         std::unique_ptr<Optimizer>* out);

 private:
  Comm(std::unique_ptr<Engine> engine, const CommConfig& config);
  static Status fromBootstrap(std::unique_ptr<bootstrap::Bootstrap> bootstrap,
                              const CommConfig& config, std::unique_ptr<Comm>* out);
  Status hostEngine(coll::Communicator** out);
  Status checkCompressor(const Compressor& c, CompressorLayout layout) const;

  std::unique_ptr<Engine> engine_;
  CommConfig config_;
};

// Whether `cudaStream` is being captured into a CUDA graph, as the CUDA
// runtime Squall is built with says. False in a build without CUDA.
Status streamIsCapturing(void* cudaStream, bool* capturing);

// Destroys `doomed` (what it holds: compressors, optimizers and Comms from
// NCCL whose state is on `device`, see Comm::device) later, on a thread of
// Squall's own with `device` current, and returns at once. Freeing device
// memory waits for all the device's work, which a kernel stuck on a dead
// peer never finishes: a communicator that is being aborted, or any other on
// the device, may have one. With device < 0, or in a build without CUDA,
// nothing of it is on a device and it is destroyed here.
void releaseLater(std::shared_ptr<void> doomed, int device);

}  // namespace squall::core
