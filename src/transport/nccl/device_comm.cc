#include "src/transport/nccl/device_comm.h"

#include <chrono>
#include <thread>

namespace squall::transport::nccl {
namespace {

int ncclTypeOf(DataType type) {
  switch (type) {
    case DataType::kF32: return nccl_abi::kFloat32;
    case DataType::kF16: return nccl_abi::kFloat16;
    case DataType::kBf16: return nccl_abi::kBfloat16;
    case DataType::kF64: return nccl_abi::kFloat64;
    case DataType::kI32: return nccl_abi::kInt32;
    case DataType::kI64: return nccl_abi::kInt64;
  }
  return nccl_abi::kUint8;
}

}  // namespace

Status DeviceComm::wrap(void* ncclComm, DeviceComm* out) {
  const Table* table = nullptr;
  SQUALL_TRY(ncclTable(&table));
  return wrap(*table, ncclComm, out);
}

Status DeviceComm::wrap(const Table& table, void* ncclComm, DeviceComm* out) {
  SQUALL_REQUIRE(ncclComm != nullptr && out != nullptr, Status::kInvalidArgument,
                 Subsys::kTransport, "the ncclComm_t and the output must be set");
  DeviceComm c;
  c.table_ = &table;
  c.comm_ = ncclComm;
  const int sizeResult = table.commCount(ncclComm, &c.size_);
  const int rankResult =
      sizeResult == nccl_abi::kSuccess ? table.commUserRank(ncclComm, &c.rank_) : sizeResult;
  if (rankResult != nccl_abi::kSuccess) {
    return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kTransport,
                       "the NCCL communicator could not be queried (%s); pass an initialised "
                       "ncclComm_t",
                       table.getErrorString(rankResult));
  }
  SQUALL_REQUIRE(c.size_ >= 1 && c.rank_ >= 0 && c.rank_ < c.size_, Status::kInvalidArgument,
                 Subsys::kTransport, "the NCCL communicator reports rank %d of %d", c.rank_,
                 c.size_);
  *out = c;
  return Status::kOk;
}

Status DeviceComm::send(const void* buffer, size_t bytes, int peer, void* stream) const {
  return settle(table_->send(buffer, bytes, nccl_abi::kUint8, peer, comm_, stream), "ncclSend");
}

Status DeviceComm::recv(void* buffer, size_t bytes, int peer, void* stream) const {
  return settle(table_->recv(buffer, bytes, nccl_abi::kUint8, peer, comm_, stream), "ncclRecv");
}

Status DeviceComm::groupStart() const { return settle(table_->groupStart(), "ncclGroupStart"); }

Status DeviceComm::groupEnd() const { return settle(table_->groupEnd(), "ncclGroupEnd"); }

Status DeviceComm::allGather(const void* in, void* out, size_t bytes, void* stream) const {
  return settle(table_->allGather(in, out, bytes, nccl_abi::kUint8, comm_, stream),
                "ncclAllGather");
}

Status DeviceComm::allReduceSum(const void* in, void* out, size_t count, DataType type,
                                void* stream) const {
  return settle(table_->allReduce(in, out, count, ncclTypeOf(type), nccl_abi::kSum, comm_, stream),
                "ncclAllReduce");
}

Status DeviceComm::broadcast(const void* in, void* out, size_t count, DataType type, int root,
                             void* stream) const {
  SQUALL_REQUIRE(root >= 0 && root < size_, Status::kInvalidArgument, Subsys::kTransport,
                 "broadcast root %d is not a rank of this %d-rank communicator", root, size_);
  return settle(table_->broadcast(in, out, count, ncclTypeOf(type), root, comm_, stream),
                "ncclBroadcast");
}

Status DeviceComm::settle(int result, const char* what) const {
  while (result == nccl_abi::kInProgress && table_->commGetAsyncError != nullptr) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    int state = nccl_abi::kInProgress;
    const int query = table_->commGetAsyncError(comm_, &state);
    if (query != nccl_abi::kSuccess) return ncclStatus(*table_, query, "ncclCommGetAsyncError");
    result = state;
  }
  return ncclStatus(*table_, result, what);
}

Status DeviceComm::abort() const {
  return ncclStatus(*table_, table_->commAbort(comm_), "ncclCommAbort");
}

}  // namespace squall::transport::nccl
