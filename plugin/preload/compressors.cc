#include "plugin/preload/compressors.h"

#include <memory>

#include "plugin/preload/report.h"

namespace squall::preload {

size_t phaseOf(int64_t offset, const codec::Spec& spec) {
  if (!codec::usesBlocks(spec.codec) || offset <= 0) return 0;
  return static_cast<size_t>(offset) % spec.block;
}

Status compressorFor(Compressors& residuals, core::Comm& engine, const codec::Spec& spec,
                     const ResidualKey& key, int nranks, ReduceOp op, void* cudaStream,
                     core::Compressor** out) {
  struct Ops {
    core::Comm& engine;
    const codec::Spec& spec;
    const ResidualKey& key;
    ReduceOp op;
    void* stream;
    Status make(std::unique_ptr<core::Compressor>* fresh) const {
      return engine.createCompressor(key.count, spec, fresh, phaseOf(key.offset, spec));
    }
    Status drain(core::Compressor& c, float* owed) const { return c.drain(owed, op, stream); }
    Status seed(core::Compressor& c, const float* owed) const { return c.seed(owed, stream); }
  } ops{engine, spec, key, op, cudaStream};
  Compressors::Outcome outcome;
  SQUALL_TRY(residuals.acquire(key, residualBytes(key.count, nranks), ops, &outcome));
  if (outcome.recut) Report::get().recut();
  Report::get().evicted(outcome.evicted);
  *out = outcome.value;
  return Status::kOk;
}

}  // namespace squall::preload
