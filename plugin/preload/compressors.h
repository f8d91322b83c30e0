// The compressor of an eligible call, found or made in its communicator's
// StepResiduals (residual_map.h), for both front ends: made with the phase
// that puts its codec blocks on the step's, and seeded with what the
// residuals of the calls it replaces still owed.
#pragma once

#include <cstddef>

#include "plugin/preload/policy.h"
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

}  // namespace squall::preload
