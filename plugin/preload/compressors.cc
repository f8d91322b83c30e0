#include "plugin/preload/compressors.h"

#include <memory>

#include "plugin/preload/report.h"
#include "src/coll/context.h"

namespace squall::preload {

size_t phaseOf(int64_t offset, const codec::Spec& spec) {
  if (!codec::usesBlocks(spec.codec) || offset <= 0) return 0;
  return static_cast<size_t>(offset) % spec.block;
}

Status compressorFor(Compressors& residuals, core::Comm& engine, const Policy& policy,
                     const ResidualKey& key, int nranks, ReduceOp op, void* cudaStream,
                     core::Compressor** out, Coll coll) {
  struct Ops {
    core::Comm& engine;
    const Policy& policy;
    const ResidualKey& key;
    ReduceOp op;
    void* stream;
    Coll coll;
    int nranks;
    Status make(std::unique_ptr<core::Compressor>* fresh) const {
      const codec::Spec& spec = policy.codec;
      // Each piece is encoded from its own first element: no phase.
      if (coll == Coll::kReduceScatter)
        return engine.createReduceScatterCompressor(key.count / static_cast<size_t>(nranks), spec,
                                                    fresh);
      SQUALL_TRY(engine.createCompressor(key.count, spec, fresh, phaseOf(key.offset, spec)));
      // The device path always runs two-phase: the second round's code keeps
      // its second encoding's error as small as the host's (at 2 ranks that
      // costs 6.1 bits per element against int4's 4.1; still over 5x fewer
      // than fp32).
      if (engine.device() >= 0) return (*fresh)->setGatherSpec(policy.gather);
      // An interposed job cannot overlap its allreduces with anything the
      // interposer controls, and on the slow links it is for, bytes are the
      // time: the algorithm that sends fewer (two-phase from 4 ranks on with
      // int8 gathers behind int4), unless SQUALL_COMPRESSED_ALGO names one.
      SQUALL_TRY((*fresh)->setAlgorithm(coll::CompressedAlgo::kAutoBytes));
      return (*fresh)->setGatherSpec(policy.gather);
    }
    Status drain(core::Compressor& c, float* owed) const { return c.drain(owed, op, stream); }
    Status seed(core::Compressor& c, const float* owed) const { return c.seed(owed, stream); }
  } ops{engine, policy, key, op, cudaStream, coll, nranks};
  Compressors::Outcome outcome;
  SQUALL_TRY(residuals.acquire(key, residualBytes(key.count, nranks), ops, &outcome));
  if (outcome.recut) Report::get().recut();
  Report::get().evicted(outcome.evicted);
  *out = outcome.value;
  return Status::kOk;
}

StepTracker::Placement StepState::place(size_t count) {
  StepTracker::Placement at = steps.place(count);
  if (at.agree) {
    int64_t proposal[2];
    steps.proposal(proposal);
    steps.windowEdges(proposal, &edges);
    steps.adopt(proposal);
    SQUALL_INFO(Subsys::kApi, "preload: a step of %lld elements, next call at %lld%s",
                static_cast<long long>(proposal[0]), static_cast<long long>(proposal[1]),
                proposal[0] > 0 ? "" : " (none found: learning again)");
  }
  if (at.relearn) {
    residuals.clear();
    edges.clear();
    Report::get().relearned();
  }
  if (at.known) edges.add(at.offset, count);
  return at;
}

std::vector<TensorEdges::Run> cutRuns(const StepState& state, const Policy& policy,
                                      const CutCall& call) {
  return state.edges.runs(call.offset, call.count, policy.minBytes / elementBytes(call.dtype));
}

}  // namespace squall::preload
