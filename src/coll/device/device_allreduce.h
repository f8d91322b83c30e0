// The two-phase compressed allreduce on the GPU, over NCCL (through
// transport::nccl::DeviceComm), entirely
// stream-ordered (see docs/cuda.md, "Device compressed allreduce").
//
// It follows src/coll/compressed_twophase.cc step for step, unsegmented, and
// produces the same bits as the host algorithm (and tests/unit/
// compressed_reference.h) for the same inputs:
//   1. worker: cudaEncodeChunk of every chunk c (its elements below N) with the
//      worker residual into slot c of one send buffer (my own chunk into slot
//      r of the receive buffer, next to the pieces the others send me);
//   2. one group of send(slot j -> rank j), recv(rank j -> slot j) for every
//      j != r;
//   3. server: for onebit cudaServeChunk (one kernel: sum of the n pieces in
//      rank order, / n for avg, encoded with the server residual); for the
//      other codecs, and whenever the second round has a code of its own
//      (setGatherSpec), cudaDecode of piece 0, cudaDecodeAccumulate of pieces
//      1..n-1, acc / n for avg, cudaEncodeChunk with the server residual and
//      the second round's code;
//   4. allGather of the server slots (every slot has the size of a whole
//      chunk's encoding in the second round's code; a shorter last chunk
//      leaves the tail unused), then cudaDecode of every chunk into the
//      output (fp16/bf16: decode to fp32 scratch, then a rounding kernel);
//      onebit's decode flags a non-finite scale itself, the other codecs'
//      output is checked by one more pass;
//   5. cudaResidualCommit of both residuals, skipped on every rank alike when
//      the decoded output holds a non-finite value (a non-finite block on any
//      rank reaches every output), as the host algorithm decides.
// Nothing waits for the host; a call can be captured in a CUDA graph and
// replayed (NCCL supports capture of its calls).
//
// One state may be used from several streams (torch reduces on its NCCL
// stream or on the current one): each use (a call, reset, takeDecodeError)
// records an event on its stream, and a use on another stream first waits
// for that event on the device, so the residuals and scratch buffers are
// never shared by two uses at once. A use being captured into a graph neither
// waits nor records (CUDA refuses a wait on work outside the capture): the
// replays of a graph are ordered by the stream they are launched on.
//
// The compressed reduce-scatter (sharded data parallel) is the first half of
// the same algorithm, as src/coll/compressed_reducescatter.cc runs it on the
// host (the same bits): a state of the reduce-scatter layout
// (createReduceScatter) holds the worker residual of n x R elements and no
// server residual;
//   1. cudaEncodeChunk of every piece c (R elements at c R, its blocks
//      beginning at its first element) with the worker residual, which
//      raises the residual's non-finite flag for a non-finite block;
//   2. the same group of sends and receives (piece j to rank j);
//   3. an all-gather of every rank's non-finite flag (one int each);
//   4. cudaDecode of piece r from rank 0, cudaDecodeAccumulate of ranks
//      1..n-1, / n for avg, into the output (fp16/bf16: through the fp32
//      scratch and the rounding kernel);
//   5. the worker residual's commit, skipped on every rank when any rank's
//      flag was raised (a non-finite block reaches only the rank that
//      serves it, so the flags are shared).
//
// And the quantized all-gather (sharded data parallel's parameter gathers;
// createAllGather, compressedAllGather): no residual, since what is gathered
// is a copy of values kept exactly elsewhere; cudaEncodeChunk of this rank's
// input into one slot, ncclAllGather of the slots, and cudaDecode of every
// rank's slot (this rank's own included, so every rank holds the same values)
// into the output. The bits of codec::encode without a residual and
// codec::decode on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "src/codec/cuda/cuda_codec.h"
#include "src/common/status.h"
#include "src/common/types.h"
#include "src/transport/nccl/device_comm.h"

namespace squall::coll::device {

// The state of one buffer, created once (allocations are synchronous) and
// reused by every call: worker and server residuals and the scratch buffers.
class DeviceCompressedState {
 public:
  // nranks and rank must be those of the communicator the calls use.
  static Status create(int nranks, int rank, size_t count, const codec::Spec& spec,
                       std::unique_ptr<DeviceCompressedState>* out);
  // The reduce-scatter layout: inputs of nranks x recvcount elements, each
  // rank's piece encoded on its own (compressedReduceScatter only).
  static Status createReduceScatter(int nranks, int rank, size_t recvcount, const codec::Spec& spec,
                                    std::unique_ptr<DeviceCompressedState>* out);
  // The all-gather layout: inputs of sendcount elements, outputs of nranks x
  // sendcount (compressedAllGather only); no residuals.
  static Status createAllGather(int nranks, int rank, size_t sendcount, const codec::Spec& spec,
                                std::unique_ptr<DeviceCompressedState>* out);
  ~DeviceCompressedState();
  DeviceCompressedState(const DeviceCompressedState&) = delete;
  DeviceCompressedState& operator=(const DeviceCompressedState&) = delete;

  int nranks() const { return nranks_; }
  int rank() const { return rank_; }
  // The elements of a call's input (n x recvcount for the reduce-scatter).
  size_t count() const { return count_; }
  // The allreduce's chunk; the reduce-scatter's recvcount.
  size_t chunk() const { return chunk_; }
  bool reduceScatter() const { return reduceScatter_; }
  bool allGather() const { return allGather_; }
  size_t slotBytes() const { return slot_; }
  const codec::Spec& spec() const { return spec_; }
  // The code the servers re-encode the reduced chunks with: spec() unless
  // setGatherSpec chose another (a wider one behind a narrow worker code, as
  // coll::CompressedState::setGatherSpec on the host: the same bits).
  const codec::Spec& gatherSpec() const { return gatherSpec_; }
  // Before the first use only (the gather slots are sized for it; later:
  // kInvalidUsage); "none" is refused, and so is any code on a state of the
  // reduce-scatter layout (it has no all-gather: kInvalidUsage).
  Status setGatherSpec(const codec::Spec& spec);
  const codec::DeviceResidual* worker() const { return worker_; }
  // Null for the reduce-scatter layout.
  const codec::DeviceResidual* server() const { return server_; }
  // Payload bytes this rank sends per call (headers included).
  uint64_t bytesSent() const { return bytesSent_; }
  uint64_t bytesReceived() const { return bytesReceived_; }

  // Zeroes both residuals (stream-ordered).
  Status reset(cudaStream_t stream);
  // core::Compressor::drain and seed: through host memory, waiting for
  // `stream`. drain adds the current worker residual of every element and,
  // times serverScale, the server residual of this rank's chunk into
  // owed[0, count()), then zeroes both; seed adds owed into the current
  // worker residual. Refused on a stream being captured.
  Status drain(cudaStream_t stream, float* owed, float serverScale);
  Status seed(cudaStream_t stream, const float* owed);
  // Checkpoints: the current residuals, the worker's (workerCount() values:
  // the padded buffer, or n x R) and the server's (serverCount(): a chunk;
  // none for the reduce-scatter), to or from host memory at any alignment,
  // waiting for `stream`; the host state's layout, so a state saved from
  // one loads into the other. Refused on a stream being captured.
  size_t workerCount() const;
  size_t serverCount() const;
  Status readResiduals(cudaStream_t stream, void* worker, void* server);
  Status writeResiduals(cudaStream_t stream, const void* worker, const void* server);
  // 1 when a decode saw a header that did not match (device flag; waits for
  // `stream`, diagnostics only), and clears it.
  Status takeDecodeError(cudaStream_t stream, bool* error);

 private:
  friend Status compressedAllReduce(const transport::nccl::DeviceComm&, cudaStream_t, const void*,
                                    void*, DataType, ReduceOp, DeviceCompressedState*);
  friend Status compressedReduceScatter(const transport::nccl::DeviceComm&, cudaStream_t,
                                        const void*, void*, DataType, ReduceOp,
                                        DeviceCompressedState*);
  friend Status compressedAllGather(const transport::nccl::DeviceComm&, cudaStream_t, const void*,
                                    void*, DataType, DeviceCompressedState*);
  DeviceCompressedState() = default;
  // What every layout's create checks and sets (the output pointer, the
  // rank, the spec, that n pieces of `piece` elements fit) into *made.
  static Status begin(int nranks, int rank, const codec::Spec& spec, size_t piece, const char* what,
                      const std::unique_ptr<DeviceCompressedState>* out,
                      std::unique_ptr<DeviceCompressedState>* made);
  Status allocateCommon();  // the buffers both layouts have
  size_t realCount(size_t c) const;
  Status tally();  // bytesSent_ and bytesReceived_ from the specs and slots
  // The copies of read/writeResiduals (toHost: read).
  Status copyResiduals(cudaStream_t stream, void* worker, void* server, bool toHost);
  // The stream-order of uses (see above): `enter` before a use on `stream`,
  // `leave` after it, with what `enter` said of capture.
  Status enter(cudaStream_t stream, bool* captured);
  Status leave(cudaStream_t stream, bool captured);
  int nranks_ = 1;
  int rank_ = 0;
  size_t count_ = 0;
  size_t chunk_ = 0;
  size_t slot_ = 0;   // a chunk's encoding in spec_: the send and receive slots
  size_t gslot_ = 0;  // in gatherSpec_: the gather slots
  codec::Spec spec_, gatherSpec_;
  codec::DeviceResidual* worker_ = nullptr;
  codec::DeviceResidual* server_ = nullptr;
  uint8_t* send_ = nullptr;    // n slots: the worker's encoded chunks (slot r unused)
  uint8_t* recv_ = nullptr;    // n slots: the pieces of my chunk, mine included
  uint8_t* gather_ = nullptr;  // n gather slots: every server's encoded chunk
  float* acc_ = nullptr;       // chunk floats: server accumulator (not onebit), decode scratch
  int* error_ = nullptr;       // device decode-error flag
  int* nonFinite_ = nullptr;   // device flag: this call's output has a non-finite value
  int* verdicts_ = nullptr;    // reduce-scatter: n ints, every rank's non-finite flag
  bool reduceScatter_ = false;
  bool allGather_ = false;
  cudaEvent_t lastUse_ = nullptr;      // recorded at the end of every use outside capture
  cudaStream_t lastStream_ = nullptr;  // the stream of that use (valid when used_)
  bool used_ = false;
  bool touched_ = false;  // any use yet, captured or not (setGatherSpec's guard)
  uint64_t bytesSent_ = 0;
  uint64_t bytesReceived_ = 0;
};

// One compressed allreduce of state->count() elements of `dtype` (fp32, fp16
// or bf16; device pointers) with op kSum or kAvg, enqueued on `stream` over
// `comm`. `in` may equal `out`. Every rank of `comm` must call it with a state
// of the same count and spec, made for comm's rank and size. n = 1 is the
// identity (a copy when out != in).
Status compressedAllReduce(const transport::nccl::DeviceComm& comm, cudaStream_t stream,
                           const void* in, void* out, DataType dtype, ReduceOp op,
                           DeviceCompressedState* state);

// One compressed reduce-scatter with a state of the reduce-scatter layout:
// `in` holds n x R elements (R = state->chunk()), rank j's piece at j R;
// `out` gets R elements, the sum of every rank's piece `rank` (kAvg: divided
// by n). `out` may be this rank's piece of `in`. The same requirements as
// compressedAllReduce; n = 1 copies piece 0.
Status compressedReduceScatter(const transport::nccl::DeviceComm& comm, cudaStream_t stream,
                               const void* in, void* out, DataType dtype, ReduceOp op,
                               DeviceCompressedState* state);

// One quantized all-gather with a state of the all-gather layout: `in` holds
// R elements (R = state->count()), `out` gets n x R, rank j's at j R, the
// decode of rank j's encoding. `in` may be this rank's piece of `out`.
// dtype fp32, fp16 or bf16 (both buffers); n = 1 copies.
Status compressedAllGather(const transport::nccl::DeviceComm& comm, cudaStream_t stream,
                           const void* in, void* out, DataType dtype, DeviceCompressedState* state);

}  // namespace squall::coll::device
