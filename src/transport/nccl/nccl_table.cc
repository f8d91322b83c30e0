#include "src/transport/nccl/nccl_table.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <mutex>
#include <string>

#include "src/common/log.h"
#include "src/common/params.h"

namespace squall::transport::nccl {
namespace {

std::atomic<const Table*> gInstalled{nullptr};

constexpr const char* kSoname = "libnccl.so.2";

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

Status openFailed(const char* path) {
  const char* why = dlerror();
  return SQUALL_FAIL(Status::kUnsupported, Subsys::kTransport,
                     "the NCCL library %s could not be loaded (%s); install NCCL (a CUDA build "
                     "of torch brings it: import torch first), put the folder holding "
                     "libnccl.so.2 on LD_LIBRARY_PATH, or name the library in SQUALL_NCCL_LIBRARY",
                     path, why != nullptr ? why : "no reason given");
}

// The file a handle was loaded from, for the log ("" when unknown).
std::string fileOf(void* lib) {
  struct link_map* map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr)
    return "";
  return map->l_name;
}

// The process's NCCL, in the order the header gives. `how` says which rule
// found it, for the log.
Status openProcessNccl(void** lib, std::string* how) {
  // Never closed: NCCL's communicators and the table outlive any caller.
  if (void* loaded = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD); loaded != nullptr) {
    *lib = loaded;
    *how = "the copy already loaded in this process";
    return Status::kOk;
  }
  const std::string named = paramString(Param::kNcclLibrary);
  if (!named.empty() && named != kSoname) {
    if (void* chosen = dlopen(named.c_str(), RTLD_NOW | RTLD_LOCAL); chosen != nullptr) {
      *lib = chosen;
      *how = "SQUALL_NCCL_LIBRARY";
      return Status::kOk;
    }
    return openFailed(named.c_str());
  }
  if (void* found = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL); found != nullptr) {
    *lib = found;
    *how = "the loader's search for libnccl.so.2";
    return Status::kOk;
  }
  return openFailed(kSoname);
}

Status fillTable(void* lib, const char* path, Table* out) {
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
  resolve(lib, "ncclGetVersion", &t.getVersion);
  t.origin = path;
  *out = t;
  return Status::kOk;
}

}  // namespace

Status loadTable(const char* path, Table* out) {
  SQUALL_REQUIRE(path != nullptr && out != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "loadTable needs a library path and an output table");
  // Never closed: NCCL's communicators and the table outlive any caller.
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return openFailed(path);
  return fillTable(lib, path, out);
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
    void* lib = nullptr;
    std::string how;
    SQUALL_TRY(openProcessNccl(&lib, &how));
    origin = fileOf(lib);
    if (origin.empty()) origin = kSoname;
    Table t{};
    SQUALL_TRY(fillTable(lib, origin.c_str(), &t));
    int version = 0;
    if (t.getVersion != nullptr && t.getVersion(&version) == nccl_abi::kSuccess) {
      // 2.9 and newer encode major*10000 + minor*100 + patch.
      SQUALL_INFO(Subsys::kTransport, "NCCL %d.%d.%d from %s (%s)", version / 10000,
                  version / 100 % 100, version % 100, origin.c_str(), how.c_str());
    } else {
      SQUALL_INFO(Subsys::kTransport, "NCCL of unknown version from %s (%s)", origin.c_str(),
                  how.c_str());
    }
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
