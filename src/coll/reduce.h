// Element-wise reduction of typed buffers, shared by the full-precision
// allreduce algorithms.
//
// fp16 and bf16 are widened to fp32, combined, and rounded back (to nearest
// even) once per call, so every step of an algorithm rounds the same way on
// every rank. avg is reduced as sum and divided by n once at the end
// (finishAverage); for int32/int64 that is C++ integer division, truncating
// toward zero, and integer sums wrap around. min/max use operator< and so follow IEEE comparisons
// (a NaN operand loses to a number on the first comparison side).
#pragma once

#include <cstddef>

#include "src/common/types.h"

namespace squall::coll {

// out[i] = a[i] (op) b[i] for i < count; avg combines as sum. out may be a or
// b (element i is read before it is written). The operand order is part of the result for
// min/max with NaNs, so every algorithm puts the same side first.
void combine(DataType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t count);

// acc[i] = acc[i] (op) in[i].
inline void reduceInto(DataType dtype, ReduceOp op, void* acc, const void* in, size_t count) {
  combine(dtype, op, acc, acc, in, count);
}

// buffer[i] = buffer[i] / n (the avg op's final step).
void finishAverage(DataType dtype, void* buffer, size_t count, int n);

bool isValidDataType(DataType dtype);
bool isValidReduceOp(ReduceOp op);

}  // namespace squall::coll
