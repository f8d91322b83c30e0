// A CPU stand-in for NCCL, as the table of entry points that
// src/transport/nccl/nccl_table.h defines, for the logic tests under the CUDA
// emulation in this directory: ranks are threads of one process, "device"
// buffers are host memory, and point-to-point messages travel through
// per-(sender, receiver) FIFO mailboxes. Like the emulated streams, calls run
// when they are enqueued, or are recorded while the stream is being captured
// and run on replay. Within a group (or one collective) every send is posted
// before any receive waits, which is the deadlock freedom that
// ncclGroupStart/End promise. Allreduce takes fp32 sum only, outside groups.
#pragma once

#include <cuda_runtime_api.h>

#include "src/transport/nccl/nccl_table.h"

#if !defined(SQUALL_CUDA_EMULATION)
#error "this header emulates NCCL on the CPU; define SQUALL_CUDA_EMULATION"
#endif

struct ncclComm;
typedef struct ncclComm* ncclComm_t;

namespace squall_emu {
// The emulation's table (origin "CPU emulation of NCCL").
const squall::transport::nccl::Table& ncclTable();
// Creates the n communicators of one emulated job (rank i is comms[i]; the
// thread that uses comms[i] plays rank i) and installs the emulation's table.
void ncclCreateWorld(int n, ncclComm_t* comms);
void ncclDestroyWorld(int n, ncclComm_t* comms);
}  // namespace squall_emu
