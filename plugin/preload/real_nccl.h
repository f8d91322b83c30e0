// The real NCCL: one table of its entry points, resolved on first use from,
// in order, the library after this one in the search order
// (dlsym(RTLD_NEXT): a program linked with NCCL), the libnccl.so.2 the process
// has already loaded (torch opens its own privately, from its nvidia-nccl
// wheel), or a dlopen of SQUALL_NCCL_LIBRARY (libnccl.so.2 by default). The
// version, the file and any entry point the library lacks are logged once at
// INFO; an optional entry point (one of an NCCL newer than those the
// interposer supports) that is absent is named apart and does not count as
// missing. Never this library's own symbols.
#pragma once

#include "plugin/preload/nccl_abi.h"

namespace squall::preload {

struct RealNccl {
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  // send, recv, recvcount (elements each rank receives), type, op, comm, stream.
  ncclResult_t (*reduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*commInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*commInitRankScalable)(ncclComm_t*, int, int, int, ncclUniqueId*,
                                       ncclConfig_t*) = nullptr;  // NCCL 2.23+
  ncclResult_t (*commShrink)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*,
                             int) = nullptr;  // NCCL 2.27+
  ncclResult_t (*commInitAll)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*commSplit)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) = nullptr;
  ncclResult_t (*commDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*commAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
  ncclResult_t (*groupSimulateEnd)(ncclSimInfo_t*) = nullptr;  // NCCL 2.22+
  ncclResult_t (*commCount)(ncclComm_t, int*) = nullptr;
  ncclResult_t (*commUserRank)(ncclComm_t, int*) = nullptr;
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  // comm (existing ranks; NULL for joining ones), total ranks, the grow id
  // (NULL on existing ranks but the root), rank (-1 on existing ranks),
  // the grown communicator, its config (NULL: the parent's).
  ncclResult_t (*commGrow)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*,
                           ncclConfig_t*) = nullptr;       // NCCL 2.29+
  ncclResult_t (*commRevoke)(ncclComm_t, int) = nullptr;   // NCCL 2.28+; flags 0
  ncclResult_t (*commSuspend)(ncclComm_t, int) = nullptr;  // NCCL 2.29+; nccl_flags
  ncclResult_t (*commResume)(ncclComm_t) = nullptr;        // NCCL 2.29+
  ncclResult_t (*getVersion)(int*) = nullptr;
  // Optional: NCCL 2.31+. The config is passed on unchanged.
  ncclResult_t (*allReduceConfig)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                  ncclComm_t, cudaStream_t, const ncclCollConfig_t*) = nullptr;
  // send, recv, sendcount (elements each rank sends), type, comm, stream.
  ncclResult_t (*allGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*allGatherConfig)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                                  cudaStream_t, const ncclCollConfig_t*) = nullptr;
  ncclResult_t (*reduceScatterConfig)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                      ncclComm_t, cudaStream_t, const ncclCollConfig_t*) = nullptr;
  bool found = false;  // ncclAllReduce was resolved
  int version = 0;     // ncclGetVersion's answer (major * 10000 + minor * 100 + patch), else 0
};

// Resolved once; a missing entry stays null (its wrapper then fails with
// ncclSystemError and says which library it looked for).
const RealNccl& realNccl();

}  // namespace squall::preload
