// The vocabulary shared by the transport, collective and API layers: data
// types, reduction operators and collective kinds, with their printable names.
#pragma once

#include <cstddef>
#include <cstdint>

namespace squall {

// Numerically identical to squallDataType_t.
enum class DataType : uint8_t { kF32 = 0, kF16 = 1, kBf16 = 2, kF64 = 3, kI32 = 4, kI64 = 5 };
constexpr int kNumDataTypes = 6;

// Numerically identical to squallRedOp_t.
enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3 };
constexpr int kNumReduceOps = 4;

enum class CollKind : uint8_t {
  kNone = 0,  // raw point-to-point traffic (bootstrap, tests)
  kAllReduce,
  kCompressedAllReduce,
  kAllGather,
  kAllToAll,
  kBroadcast,
  kBarrier,
  kCompressedReduceScatter,
};

size_t dataTypeSize(DataType type);
const char* dataTypeName(DataType type);
const char* reduceOpName(ReduceOp op);
const char* collKindName(CollKind kind);

}  // namespace squall
