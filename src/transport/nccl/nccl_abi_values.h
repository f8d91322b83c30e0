// The values of NCCL's C enums (ncclResult_t, ncclDataType_t, ncclRedOp_t),
// stable across NCCL 2.x and declared once here from the documented ABI for
// every part of Squall that speaks NCCL without nccl.h: the run-time table in
// this folder, the net / CollNet plugin and the interposer.
#pragma once

namespace squall::nccl_abi {

// ncclResult_t.
enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// ncclDataType_t and ncclRedOp_t values NCCL passes to CollNet.
enum DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
  kNumDataTypes = 12,
};
enum RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kNumOps = 5 };

}  // namespace squall::nccl_abi
