// The collective algorithms, one per file. Each runs on one rank, inside an
// operation whose context carries the tags and the deadline; the
// Communicator checks arguments before calling them. Costs are given in
// alpha-beta terms per rank: n ranks, N bytes, alpha per message round,
// beta per byte.
#pragma once

#include <cstddef>
#include <functional>

#include "src/coll/compressed_state.h"
#include "src/coll/context.h"
#include "src/common/types.h"

namespace squall::coll {

Status ringAllReduce(const OpContext& ctx, const void* in, void* out, size_t count, DataType dtype,
                     ReduceOp op);
Status halvingDoublingAllReduce(const OpContext& ctx, const void* in, void* out, size_t count,
                                DataType dtype, ReduceOp op);
Status directAllReduce(const OpContext& ctx, const void* in, void* out, size_t count,
                       DataType dtype, ReduceOp op);
Status ringAllGather(const OpContext& ctx, const void* in, void* out, size_t count, DataType dtype);
Status pairwiseAllToAll(const OpContext& ctx, const void* in, void* out, size_t count,
                        DataType dtype);
Status binomialBroadcast(const OpContext& ctx, void* buffer, size_t count, DataType dtype,
                         int root);
Status disseminationBarrier(const OpContext& ctx);
// The same rounds on steps firstStep, firstStep + 1, ...: once it returns,
// every rank has (transitively) checked its descriptor against every other
// rank's, so all ranks called the same operation with the same counts. A
// collective that writes its output as blocks arrive runs it first, so ranks
// that disagree fail before any output is written.
Status agreeOnDescriptor(const OpContext& ctx, uint32_t firstStep);

// All-gather and all-to-all outputs up to this size are received into the
// communicator's scratch and copied out once the operation has succeeded,
// instead of running agreeOnDescriptor first: a copy of 64 KiB takes a few
// microseconds, less than the agreement's ceil(log2 n) message latencies, and
// it also keeps the output untouched when the exchange fails later. Larger
// outputs take the agreement, whose latency is small next to their transfer.
constexpr size_t kStagedGatherBytes = size_t{64} << 10;

// Compressed allreduce (dtype fp32, fp16 or bf16; op sum or avg). With
// `verdict` null the residuals are committed when every block of the call
// was finite (on every rank alike); otherwise nothing is committed and
// *verdict says whether they were, for a caller that decides with more
// ranks (the hierarchical allreduce).
//
// `hooks` (with a verdict only) let the caller overlap its own work with the
// exchange: the hierarchical allreduce forms the input as it is needed and
// spreads the output among its host as it is decoded.
struct ExchangeHooks {
  // Before input elements [0, end) are first read. The last call asks for
  // the whole buffer before the collective waits for any message.
  std::function<Status(size_t end)> inputNeeded;
  // Once output elements [0, end) hold their final values, with the call's
  // verdict; the last call has the whole buffer. An algorithm that writes
  // its output in another order calls it once, at the end.
  std::function<Status(size_t end, bool finite)> outputReady;
};
Status twoPhaseCompressedAllReduce(const OpContext& ctx, const void* in, void* out, DataType dtype,
                                   ReduceOp op, CompressedState* state, bool* verdict = nullptr,
                                   const ExchangeHooks* hooks = nullptr);
Status allGatherCompressedAllReduce(const OpContext& ctx, const void* in, void* out, DataType dtype,
                                    ReduceOp op, CompressedState* state, bool* verdict = nullptr,
                                    const ExchangeHooks* hooks = nullptr);
// The hierarchical compressed allreduce over `hierarchy` (hierarchy.h) with
// a state from CompressedState::createHierarchical.
struct Hierarchy;
Status hierarchicalCompressedAllReduce(const OpContext& ctx, const Hierarchy& hierarchy,
                                       const void* in, void* out, DataType dtype, ReduceOp op,
                                       CompressedState* state);
// The auto choice between the two (see compressed_allgather.cc).
// gatherSpec: the two-phase servers' code when it differs from spec
// (CompressedState::gatherSpec).
CompressedAlgo chooseCompressedAlgo(int nranks, size_t count, const codec::Spec& spec,
                                    double latencyBytes, const codec::Spec* gatherSpec = nullptr);
// The one that sends fewer bytes per rank, headers included (the
// all-gather on a tie: one round instead of two).
CompressedAlgo chooseCompressedAlgoByBytes(int nranks, size_t count, const codec::Spec& spec,
                                           const codec::Spec* gatherSpec = nullptr);
// What a call on `state` runs, given the communicator's option.
CompressedAlgo resolveCompressedAlgo(int nranks, const CompressedState& state,
                                     CompressedAlgo option, double latencyBytes);

// The compressed reduce-scatter (compressed_reducescatter.cc) of
// state->nranks() pieces of state->chunk() elements, on a state from
// CompressedState::createReduceScatter: `out` receives this rank's piece,
// summed (avg: divided by n). The worker residual is committed when every
// rank's encodings were finite.
Status directCompressedReduceScatter(const OpContext& ctx, const void* in, void* out,
                                     DataType dtype, ReduceOp op, CompressedState* state);

}  // namespace squall::coll
