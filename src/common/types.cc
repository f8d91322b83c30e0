#include "src/common/types.h"

namespace squall {

size_t dataTypeSize(DataType type) {
  switch (type) {
    case DataType::kF32: return 4;
    case DataType::kF16:
    case DataType::kBf16: return 2;
    case DataType::kF64: return 8;
    case DataType::kI32: return 4;
    case DataType::kI64: return 8;
  }
  return 0;
}

const char* dataTypeName(DataType type) {
  switch (type) {
    case DataType::kF32: return "float32";
    case DataType::kF16: return "float16";
    case DataType::kBf16: return "bfloat16";
    case DataType::kF64: return "float64";
    case DataType::kI32: return "int32";
    case DataType::kI64: return "int64";
  }
  return "unknown-type";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "unknown-op";
}

const char* collKindName(CollKind kind) {
  switch (kind) {
    case CollKind::kNone: return "point-to-point";
    case CollKind::kAllReduce: return "allreduce";
    case CollKind::kCompressedAllReduce: return "compressed allreduce";
    case CollKind::kAllGather: return "allgather";
    case CollKind::kAllToAll: return "alltoall";
    case CollKind::kBroadcast: return "broadcast";
    case CollKind::kBarrier: return "barrier";
    case CollKind::kCompressedReduceScatter: return "compressed reduce-scatter";
  }
  return "unknown-collective";
}

}  // namespace squall
