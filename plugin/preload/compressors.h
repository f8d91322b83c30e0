// What both front ends keep of a communicator's calls of one collective and
// how they run one: the calls placed in steps, the tensor edges they reveal,
// and the compressor of each eligible call, found or made in the
// communicator's StepResiduals (residual_map.h) with the phase that puts its
// codec blocks on the step's, and seeded with what the residuals of the calls
// it replaces still owed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "plugin/preload/policy.h"
#include "plugin/preload/report.h"
#include "plugin/preload/residual_map.h"
#include "src/core/comm.h"

namespace squall::preload {

using Compressors = StepResiduals<core::Compressor>;

// Where the codec blocks of a call at `offset` of the step begin: 0 for
// element-wise codecs, else offset modulo the block.
size_t phaseOf(int64_t offset, const codec::Spec& spec);

// The compressor for `key` with the policy's code on `engine` (nranks ranks,
// reducing with `op`, on `cudaStream` for a device engine), in *out; null
// when its state alone exceeds the cap, and the call passes through. An
// allreduce's takes the policy's all-gather code, and on a host engine the
// algorithm that sends fewer bytes (unless SQUALL_COMPRESSED_ALGO names
// one); a reduce-scatter's (key.count = nranks x recvcount) has neither.
// Counts recut calls and evictions in the report.
Status compressorFor(Compressors& residuals, core::Comm& engine, const Policy& policy,
                     const ResidualKey& key, int nranks, ReduceOp op, void* cudaStream,
                     core::Compressor** out, Coll coll = Coll::kAllReduce);

// A communicator's calls of one collective: where they fall in the step, the
// tensor edges they reveal, and their residuals.
struct StepState {
  explicit StepState(const Policy& p)
      : steps(p.stepElements, p.stepLearnCalls), residuals(p.residualCapBytes) {}
  int64_t eligible = 0;  // calls past the policy's checks so far (warmup counts them)
  StepTracker steps;
  TensorEdges edges;
  Compressors residuals;

  // Places the next call of `count` elements in the step: adopts the step
  // when the learning window closes, drops the residuals and edges when a
  // call proves the step wrong, and learns the call's edges.
  StepTracker::Placement place(size_t count);
};

// An allreduce of `count` elements at `offset` of the step.
struct CutCall {
  DataType dtype;
  int64_t offset;
  size_t count;
  int nranks;
  ReduceOp op;
  void* cudaStream;  // for a device engine's compressors
};

// `call` cut at the tensor edges learnt so far (TensorEdges::runs): runs of
// tensors each under the policy's minBytes, to go at full precision as they
// would alone, and runs to compress, so that no codec block spans two runs.
// A call of small tensors only is one full run.
std::vector<TensorEdges::Run> cutRuns(const StepState& state, const Policy& policy,
                                      const CutCall& call);

// Runs `call` as cut into `runs` (cutRuns), each compressed run through its
// own compressor. `front` sends the pieces, `skip` elements into the call's
// buffers:
//   int full(size_t skip, size_t count)               at full precision
//   int compressed(size_t skip, core::Compressor& c)  through c
//   int failed(Status s)                              no compressor: s
// each returning the front end's result, 0 on success; the first that is
// not 0 ends the call. *sent: the bytes the pieces sent, for the report.
template <class Front>
int runCut(StepState& state, core::Comm& engine, const Policy& policy, const CutCall& call,
           const std::vector<TensorEdges::Run>& runs, Front& front, uint64_t* sent) {
  *sent = 0;
  for (const TensorEdges::Run& run : runs) {
    const auto skip = static_cast<size_t>(run.offset - call.offset);
    core::Compressor* c = nullptr;
    if (!run.full) {
      const Status found = compressorFor(state.residuals, engine, policy,
                                         ResidualKey{call.dtype, run.offset, run.count},
                                         call.nranks, call.op, call.cudaStream, &c);
      if (found != Status::kOk) return front.failed(found);
    }
    if (c == nullptr) {
      // A run of small tensors, or a state over the cap: the same on every
      // rank, so all send it at full precision.
      if (const int rc = front.full(skip, run.count); rc != 0) return rc;
      *sent += fullPrecisionBytes(run.count, call.dtype, call.nranks);
      if (run.full) Report::get().keptFull(run.count);
      continue;
    }
    // Past this point the peers are in the compressed allreduce too: a
    // failure cannot fall back to full precision, it is the collective's.
    if (const int rc = front.compressed(skip, *c); rc != 0) return rc;
    *sent += c->bytesSentPerCall();
  }
  return 0;
}

}  // namespace squall::preload
