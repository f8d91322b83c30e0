#include "src/transport/nccl/nccl_table.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "src/common/params.h"

namespace squall::transport::nccl {
namespace {

std::atomic<const Table*> gInstalled{nullptr};

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

Status loadTable(const char* path, Table* out) {
  SQUALL_REQUIRE(path != nullptr && out != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "loadTable needs a library path and an output table");
  // Never closed: NCCL's communicators and the table outlive any caller.
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return SQUALL_FAIL(Status::kUnsupported, Subsys::kTransport,
                       "the NCCL library %s could not be loaded (%s); install NCCL, put the "
                       "folder holding libnccl.so.2 on LD_LIBRARY_PATH, or name the library in "
                       "SQUALL_NCCL_LIBRARY",
                       path, why != nullptr ? why : "no reason given");
  }
  Table t{};
  const char* missing = nullptr;
  auto need = [&](const char* name, auto* fn) {
    if (!resolve(lib, name, fn) && missing == nullptr) missing = name;
  };
  need("ncclGetErrorString", &t.getErrorString);
  need("ncclCommCount", &t.commCount);
  need("ncclCommUserRank", &t.commUserRank);
  need("ncclCommAbort", &t.commAbort);
  need("ncclGroupStart", &t.groupStart);
  need("ncclGroupEnd", &t.groupEnd);
  need("ncclSend", &t.send);
  need("ncclRecv", &t.recv);
  need("ncclAllGather", &t.allGather);
  need("ncclAllReduce", &t.allReduce);
  need("ncclBroadcast", &t.broadcast);
  resolve(lib, "ncclCommGetAsyncError", &t.commGetAsyncError);  // optional
  SQUALL_REQUIRE(missing == nullptr, Status::kUnsupported, Subsys::kTransport,
                 "the NCCL library %s has no %s; Squall needs NCCL 2.7 or newer "
                 "(point SQUALL_NCCL_LIBRARY at one)",
                 path, missing);
  t.origin = path;
  *out = t;
  return Status::kOk;
}

Status ncclTable(const Table** out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "the NCCL table output pointer is NULL");
  if (const Table* t = gInstalled.load(std::memory_order_acquire); t != nullptr) {
    *out = t;
    return Status::kOk;
  }
  // Resolved once; a failure is retried on the next call, since the caller
  // may load NCCL in between (e.g. by importing torch).
  static std::mutex mutex;
  static Table loaded{};
  static std::string origin;
  static bool ready = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!ready) {
    origin = paramString(Param::kNcclLibrary);
    Table t{};
    SQUALL_TRY(loadTable(origin.c_str(), &t));
    t.origin = origin.c_str();
    loaded = t;
    ready = true;
  }
  *out = &loaded;
  return Status::kOk;
}

void installTable(const Table* table) { gInstalled.store(table, std::memory_order_release); }

Status ncclStatus(const Table& table, int result, const char* what) {
  if (result == nccl_abi::kSuccess) return Status::kOk;
  Status status = Status::kInternal;
  switch (result) {
    case nccl_abi::kUnhandledCudaError:
    case nccl_abi::kSystemError: status = Status::kSystemError; break;
    case nccl_abi::kInvalidArgument: status = Status::kInvalidArgument; break;
    case nccl_abi::kInvalidUsage: status = Status::kInvalidUsage; break;
    case nccl_abi::kRemoteError: status = Status::kRemoteError; break;
    case nccl_abi::kInProgress: status = Status::kInProgress; break;
    default: break;  // nccl_abi::kInternalError and codes newer than this table
  }
  const char* text = table.getErrorString != nullptr ? table.getErrorString(result) : nullptr;
  return SQUALL_FAIL(status, Subsys::kTransport, "%s failed in NCCL (%s): %s (code %d)", what,
                     table.origin != nullptr ? table.origin : "NCCL",
                     text != nullptr ? text : "no description", result);
}

int ncclResultOf(Status status) {
  switch (status) {
    case Status::kOk: return nccl_abi::kSuccess;
    case Status::kInProgress: return nccl_abi::kInProgress;
    case Status::kInvalidArgument: return nccl_abi::kInvalidArgument;
    case Status::kInvalidUsage:
    case Status::kUnsupported: return nccl_abi::kInvalidUsage;
    case Status::kRemoteError:
    case Status::kTimeout:
    case Status::kCorruptData:
      return nccl_abi::kRemoteError;  // the peer is dead, silent or garbled
    case Status::kOutOfMemory:
    case Status::kSystemError: return nccl_abi::kSystemError;
    case Status::kInternal: break;
  }
  return nccl_abi::kInternalError;
}

}  // namespace squall::transport::nccl
