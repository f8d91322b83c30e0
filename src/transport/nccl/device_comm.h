// A borrowed NCCL communicator, the only way the device collectives, the
// device optimizer and core's NCCL engine reach NCCL. It holds the caller's
// ncclComm_t (never destroyed here; it must outlive every DeviceComm made
// from it), its rank and size, and the table it calls through (nccl_table.h),
// so that no room above this one names an NCCL type.
//
// Every operation is enqueued on a CUDA stream (passed as void*, a
// cudaStream_t) and returns once enqueued, like NCCL itself; between
// groupStart and groupEnd, send and recv are deferred and issued together.
// On a non-blocking communicator (ncclConfig_t.blocking = 0) NCCL may return
// ncclInProgress and finish the enqueue in the background; NCCL wants the
// next call on the communicator to wait for that, so an operation that gets
// ncclInProgress polls ncclCommGetAsyncError until NCCL has finished (or
// failed, or been aborted) and returns what it says.
#pragma once

#include <cstddef>

#include "src/common/status.h"
#include "src/common/types.h"
#include "src/transport/nccl/nccl_table.h"

namespace squall::transport::nccl {

class DeviceComm {
 public:
  DeviceComm() = default;
  // Queries rank and size of `ncclComm` through the active table.
  static Status wrap(void* ncclComm, DeviceComm* out);
  // The same through `table` (tests, interposers).
  static Status wrap(const Table& table, void* ncclComm, DeviceComm* out);

  int rank() const { return rank_; }
  int size() const { return size_; }
  void* handle() const { return comm_; }
  const Table& table() const { return *table_; }

  // Bytes to / from `peer` (not this rank).
  Status send(const void* buffer, size_t bytes, int peer, void* stream) const;
  Status recv(void* buffer, size_t bytes, int peer, void* stream) const;
  Status groupStart() const;
  Status groupEnd() const;

  // `bytes` per rank; `out` holds size() * bytes, rank r's at r * bytes.
  Status allGather(const void* in, void* out, size_t bytes, void* stream) const;
  Status allReduceSum(const void* in, void* out, size_t count, DataType type, void* stream) const;
  Status broadcast(const void* in, void* out, size_t count, DataType type, int root,
                   void* stream) const;

  // Aborts the communicator's outstanding work, for an error that leaves the
  // ranks out of step; the caller still owns (and destroys) the ncclComm_t.
  Status abort() const;

 private:
  // NCCL's `result` of `what` as a Status, once an in-progress result has
  // settled.
  Status settle(int result, const char* what) const;

  const Table* table_ = nullptr;
  void* comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace squall::transport::nccl
