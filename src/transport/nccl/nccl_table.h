// The NCCL entry points Squall calls, as one table resolved at run time.
//
// Nothing in Squall includes nccl.h, links libnccl or calls an NCCL symbol
// directly: every call goes through the table returned by ncclTable(). By
// default the table is filled by dlsym on the NCCL library's own handle, so
// that an LD_PRELOAD interposer exporting ncclAllReduce does not catch
// Squall's own calls. The library is, in order: the libnccl.so.2 the process
// has already loaded (torch's, from its nvidia-nccl wheel), the one
// SQUALL_NCCL_LIBRARY names, and the soname through the loader's search.
// Communicators from one NCCL copy must only be used with that copy, which is
// why the loaded one comes first. Such an interposer, or the CPU emulation in
// tests/gpu/emu, may install a table of its own instead.
//
// The signatures follow NCCL's C ABI with its enums as int and its handles
// (ncclComm_t, cudaStream_t) as void*: the same registers and sizes, so the
// resolved functions are called as they are.
#pragma once

#include <cstddef>

#include "src/common/status.h"
#include "src/transport/nccl/nccl_abi_values.h"

namespace squall::transport::nccl {

struct Table {
  const char* (*getErrorString)(int result);
  int (*commCount)(void* comm, int* count);
  int (*commUserRank)(void* comm, int* rank);
  int (*commAbort)(void* comm);
  int (*groupStart)();
  int (*groupEnd)();
  int (*send)(const void* buffer, size_t count, int type, int peer, void* comm, void* stream);
  int (*recv)(void* buffer, size_t count, int type, int peer, void* comm, void* stream);
  int (*allGather)(const void* in, void* out, size_t count, int type, void* comm, void* stream);
  int (*allReduce)(const void* in, void* out, size_t count, int type, int op, void* comm,
                   void* stream);
  int (*broadcast)(const void* in, void* out, size_t count, int type, int root, void* comm,
                   void* stream);
  // Where the entries came from, for messages ("libnccl.so.2", "CPU emulation").
  const char* origin;
  // Optional entries (NULL where the library or a stand-in lacks them).
  int (*getVersion)(int* version);
  // The state of a non-blocking communicator's last call: ncclInProgress
  // while NCCL still finishes it in the background.
  int (*commGetAsyncError)(void* comm, int* asyncError);
};

// The active table: the installed one, else NCCL's library resolved on first
// use (the version found is logged once, at INFO). kUnsupported, saying what
// to install, when no NCCL can be loaded.
Status ncclTable(const Table** out);

// Makes `table` (every entry set; it must outlive its use) the active table;
// nullptr goes back to resolving NCCL's library. Communicators wrapped
// before keep the table they were wrapped with.
void installTable(const Table* table);

// Resolves a table from the NCCL library at `path` (a soname or a file), for
// an interposer that wants NCCL's own functions under its exports.
Status loadTable(const char* path, Table* out);

// The one conversion of an NCCL result: kOk for success; otherwise the
// failure, described once and naming `what` (kSystemError for CUDA and system
// errors, kRemoteError for a peer's, kInvalidArgument / kInvalidUsage for a
// call NCCL refused, kInProgress for a nonblocking communicator still busy).
Status ncclStatus(const Table& table, int result, const char* what);

// The other way: the ncclResult_t that says what `status` says, for Squall
// code that answers NCCL's callers (kInProgress stays in progress; only
// kInternal is ncclInternalError).
int ncclResultOf(Status status);

}  // namespace squall::transport::nccl

// Returns from the calling function when the NCCL call `expr`, made through
// `table`, fails.
#define SQUALL_NCCL_TRY(table, expr) \
  SQUALL_TRY(::squall::transport::nccl::ncclStatus((table), (expr), #expr))
