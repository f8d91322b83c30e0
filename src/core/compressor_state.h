// A compressor's saved state: its rank's residuals and what they belong to,
// so a training job resumed from a checkpoint owes the same error it owed
// when it stopped (squallCompressorSaveState / squallCompressorLoadState).
//
// Layout, in the frame of src/common/saved_state.h (magic "SQCMPST1",
// version 1), host byte order:
//          24  u32      layout (0 allreduce, 1 reduce-scatter)
//              u32      codec, u32 scale kind, u32 block (the codec spec)
//              i32      group size, i32 rank
//              u64      count (elements of a call's input), u64 phase
//              i32      hosts (0: flat layout), i32 ranks per host
//              u64      worker residual values W, u64 server residual values S
//              W fp32, then S fp32
//     end - 8  u64      FNV-1a 64 of every byte before it
// A state loads only into a compressor of the same layout, spec, group size,
// rank, count, phase and residual sizes: the residuals are this rank's, laid
// over this rank's chunks.
#pragma once

#include <cstddef>

#include "src/common/status.h"
#include "src/core/comm.h"

namespace squall::core {

Status compressorStateSize(Compressor& compressor, size_t* bytes);
Status saveCompressorState(Compressor& compressor, void* buffer, size_t capacity, size_t* written);
// Checks the whole state before it writes a residual: on failure the
// compressor is as it was.
Status loadCompressorState(Compressor& compressor, const void* buffer, size_t bytes);

}  // namespace squall::core
