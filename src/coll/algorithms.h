// The collective algorithms, one per file. Each runs on one rank, inside an
// operation whose context carries the tags and the deadline; the
// Communicator checks arguments before calling them. Costs are given in
// alpha-beta terms per rank: n ranks, N bytes, alpha per message round,
// beta per byte.
#pragma once

#include <cstddef>

#include "src/coll/compressed_state.h"
#include "src/coll/context.h"
#include "src/common/types.h"

namespace squall::coll {

Status ringAllReduce(const OpContext& ctx, const void* in, void* out, size_t count, DataType dtype,
                     ReduceOp op);
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

// Compressed allreduce (dtype fp32, fp16 or bf16; op sum or avg).
Status twoPhaseCompressedAllReduce(const OpContext& ctx, const void* in, void* out, DataType dtype,
                                   ReduceOp op, CompressedState* state);
Status allGatherCompressedAllReduce(const OpContext& ctx, const void* in, void* out, DataType dtype,
                                    ReduceOp op, CompressedState* state);
// The auto choice between the two (see compressed_allgather.cc).
CompressedAlgo chooseCompressedAlgo(int nranks, size_t count, const codec::Spec& spec,
                                    double latencyBytes);

}  // namespace squall::coll
