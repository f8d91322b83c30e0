// A CPU stand-in for the part of NCCL that the device compressed allreduce
// uses (src/coll/device), for the logic test under the CUDA emulation in this
// directory: ranks are threads of one process, "device" buffers are host
// memory, and point-to-point messages travel through per-(sender, receiver)
// FIFO mailboxes. Like the emulated streams, calls run when they are enqueued,
// or are recorded while the stream is being captured and run on replay.
// Within a group (or one collective) every send is posted before any receive
// waits, which is the deadlock freedom that ncclGroupStart/End promise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#if !defined(SQUALL_CUDA_EMULATION)
#error "this header emulates NCCL on the CPU; define SQUALL_CUDA_EMULATION"
#endif

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

struct ncclComm;
typedef struct ncclComm* ncclComm_t;

const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

// Sum only (fp32), summed in rank order on every rank; not inside a group.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);

namespace squall_emu {
// Creates the n communicators of one emulated job (rank i is comms[i]); the
// thread that uses comms[i] plays rank i.
void ncclCreateWorld(int n, ncclComm_t* comms);
void ncclDestroyWorld(int n, ncclComm_t* comms);
}  // namespace squall_emu
