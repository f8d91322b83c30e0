// A communicator: the collectives of one group of ranks over one transport.
//
// Every collective takes the next sequence number of the communicator, so the
// ranks must call the same collectives in the same order. Every message of an
// operation is tagged with that number, the message's step and the
// operation's descriptor (kind, dtype, op, codec, block, count); the transport
// compares descriptors and sizes, so a rank that called something different
// makes the collective fail with an error that prints both sides. A rank
// whose operation fails (mismatch, timeout, a dead peer) sends an abort
// notice to every peer (see context.h), so the others stop at once with an
// error naming it rather than at their deadline (SQUALL_TIMEOUT_S).
//
// Blocking and asynchronous forms. The asynchronous form (start*) queues the
// operation to a per-communicator worker thread, started on first use, which
// runs queued operations one at a time in call order and returns an
// Operation with test()/wait(). A blocking call first waits for every queued
// operation, then runs on the caller's thread; so the transport is only ever
// used by one thread at a time, and operations run in call order on every
// rank. Buffers of an asynchronous operation must stay valid until it is done.
// Arguments are checked before an operation takes its sequence number; a rank
// that passes invalid arguments gets the error at once, while ranks that
// called correctly wait for it until their deadline (an argument error is a
// bug on that rank, not a disagreement the others can detect).
//
// A communicator is driven by one thread at a time (its own worker aside), and
// a CompressedState must not be used by two operations in flight at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/coll/compressed_state.h"
#include "src/coll/context.h"
#include "src/coll/hierarchy.h"
#include "src/common/status.h"
#include "src/common/types.h"
#include "src/transport/transport.h"

namespace squall::coll {

// The state of one queued or running asynchronous collective.
class Operation {
 public:
  // True once the operation has finished (successfully or not).
  bool test() const;
  // Blocks until the operation has finished; returns its status.
  Status wait();
  // The error message recorded where the operation failed ("" on success).
  std::string error() const;

 private:
  friend class Communicator;
  void finish(Status status, std::string message);
  mutable std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
  Status status_ = Status::kOk;
  std::string message_;
};

using OperationPtr = std::shared_ptr<Operation>;

class Communicator {
 public:
  // `transport` must outlive the communicator.
  explicit Communicator(transport::Transport* transport,
                        Options options = Options::fromEnvironment());
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  // Changing options is allowed between operations; every rank must agree on
  // the algorithm choices.
  Options& options() { return options_; }
  uint64_t operationsStarted() const { return sequence_; }
  // Cumulative bytes of every operation's messages, as posted to the transport.
  uint64_t bytesSent() const { return bytes_.sent.load(std::memory_order_relaxed); }
  uint64_t bytesReceived() const { return bytes_.received.load(std::memory_order_relaxed); }

  // `out` may equal `in` (in place) for every operation except allGather and
  // allToAll, whose output is n times / as large as a rank's input.
  Status allReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op);
  // Each rank contributes `count` elements; out holds n * count, rank order.
  Status allGather(const void* in, void* out, size_t count, DataType dtype);
  // Block j (count elements) of `in` goes to rank j; block j of `out` came from rank j.
  Status allToAll(const void* in, void* out, size_t count, DataType dtype);
  Status broadcast(void* buffer, size_t count, DataType dtype, int root);
  Status barrier();
  // The compressed allreduce of state->count() elements with state's codec;
  // dtype is fp32, fp16 or bf16 for both in and out; op sum or avg. The state
  // carries the residuals across calls and records the bytes of the last call.
  Status compressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op,
                             CompressedState* state);

  // The compressed reduce-scatter with a state from
  // CompressedState::createReduceScatter (compressed_reducescatter.cc): `in`
  // holds nranks x recvcount elements, rank r's piece at r x recvcount; `out`
  // receives this rank's piece summed (avg: divided by nranks). recvcount is
  // the state's. `out` may be this rank's piece of `in` (in place). One rank
  // copies its input; the residual stays.
  Status compressedReduceScatter(const void* in, void* out, size_t recvcount, DataType dtype,
                                 ReduceOp op, CompressedState* state);

  Status startAllReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                        OperationPtr* operation);
  Status startAllGather(const void* in, void* out, size_t count, DataType dtype,
                        OperationPtr* operation);
  Status startAllToAll(const void* in, void* out, size_t count, DataType dtype,
                       OperationPtr* operation);
  Status startBroadcast(void* buffer, size_t count, DataType dtype, int root,
                        OperationPtr* operation);
  Status startBarrier(OperationPtr* operation);
  Status startCompressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op,
                                  CompressedState* state, OperationPtr* operation);
  Status startCompressedReduceScatter(const void* in, void* out, size_t recvcount, DataType dtype,
                                      ReduceOp op, CompressedState* state, OperationPtr* operation);

  // This rank's next collective is refused for a bad argument (`check`, not
  // kOk, with lastError() saying why). The refusal still takes the
  // collective's sequence number and runs as a failed operation, queued
  // behind those already started, so the peers, who are waiting in that
  // collective, get the abort notice and fail at once with this rank's reason
  // instead of after SQUALL_TIMEOUT_S, and the next collective lines up on
  // every rank again. Returns `check` at once, with its message kept; kOk
  // passes through, so callers write SQUALL_TRY(refuse(check(...))). The
  // collectives above call it for the arguments they check; callers that
  // check arguments before calling a collective (the C API) call it too.
  Status refuse(Status check);

  // The host structure for the hierarchical compressed allreduce, set once
  // by whoever built the communicator (core/host_engine.cc) before its first
  // operation; null (the default): flat.
  void setHierarchy(std::unique_ptr<Hierarchy> hierarchy) { hierarchy_ = std::move(hierarchy); }
  const Hierarchy* hierarchy() const { return hierarchy_.get(); }
  // A state for compressed allreduces of `count` elements on this
  // communicator: hierarchical when it has a hierarchy, else flat, of phase
  // `phase` (the hierarchical layout has none), keeping error feedback or
  // not, its residuals in `store`. (A flat state made with
  // CompressedState::create runs the flat algorithm on any communicator of
  // its size.)
  Status createCompressedState(size_t count, const codec::Spec& spec, size_t phase,
                               std::unique_ptr<CompressedState>* out,
                               Feedback feedback = Feedback::kKept,
                               codec::ResidualStore store = codec::ResidualStore::kF32) const;

 private:
  using Body = std::function<Status(const OpContext&)>;
  struct Queued {
    uint64_t sequence;
    transport::Descriptor descriptor;
    Options options;  // as they were when the operation was started
    Body body;
    OperationPtr operation;
  };

  Status execute(uint64_t sequence, const transport::Descriptor& descriptor, const Options& options,
                 const Body& body);
  Status runBlocking(const transport::Descriptor& descriptor, const Body& body);
  Status enqueue(const transport::Descriptor& descriptor, Body body, OperationPtr* operation);
  void drain();
  void workerLoop();

  // Argument checks shared by the blocking and asynchronous forms.
  Status checkAllReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op);
  Status checkCompressed(const void* in, void* out, DataType dtype, ReduceOp op,
                         const CompressedState* state, transport::Descriptor* descriptor);
  Status checkReduceScatter(const void* in, const void* out, size_t recvcount, DataType dtype,
                            ReduceOp op, const CompressedState* state,
                            transport::Descriptor* descriptor);
  Body allReduceBody(const void* in, void* out, size_t count, DataType dtype, ReduceOp op);
  Body compressedBody(const void* in, void* out, DataType dtype, ReduceOp op,
                      CompressedState* state);
  static Body reduceScatterBody(const void* in, void* out, DataType dtype, ReduceOp op,
                                CompressedState* state);

  transport::Transport* transport_;
  Options options_;
  uint64_t sequence_ = 0;         // operations started, on the caller's thread
  std::vector<uint8_t> scratch_;  // OpContext::scratch of the running operation
  // The notice receives of the operation before the running one stay posted
  // through it: a peer still in that operation when it gave up (this rank
  // had already finished it) is then reported by its notice, the first
  // cause, instead of by the end of its connection that follows.
  std::unique_ptr<AbortWatch> previousWatch_;
  ByteCounters bytes_;
  std::unique_ptr<Hierarchy> hierarchy_;
  bool abortLogged_ = false;  // OpContext::abortLogged

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Queued> queue_;
  size_t running_ = 0;  // queued or running on the worker
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace squall::coll
