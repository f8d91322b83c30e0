#include "plugin/preload/real_nccl.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "plugin/preload/interposer.h"
#include "src/common/log.h"

namespace squall::preload {

namespace {

constexpr const char* kSoname = "libnccl.so.2";

// The NCCL the calls go on to: the one after the interposer in the lookup
// order (a program linked with NCCL), else the copy the process has loaded
// (torch's, loaded privately from its nvidia-nccl wheel), else
// SQUALL_NCCL_LIBRARY (libnccl.so.2 by default) through the loader.
void* openReal(std::string* how) {
  if (dlsym(RTLD_NEXT, "ncclAllReduce") != nullptr) {
    *how = "the library after the interposer";
    return RTLD_NEXT;
  }
  if (void* loaded = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD); loaded != nullptr) {
    *how = "the copy already loaded in this process";
    return loaded;
  }
  *how = "SQUALL_NCCL_LIBRARY";
  return dlopen(policy().ncclLibrary.c_str(), RTLD_NOW | RTLD_LOCAL);
}

RealNccl load() {
  RealNccl t;
  std::string how;
  void* handle = openReal(&how);
  if (handle == nullptr) {
    SQUALL_WARN(Subsys::kApi,
                "the interposer found no NCCL after it and cannot open %s (%s); "
                "set SQUALL_NCCL_LIBRARY to the real libnccl.so.2",
                policy().ncclLibrary.c_str(), dlerror());
    return t;
  }
  std::string missing;
  int entries = 0;
  auto resolve = [&](const char* name, auto* out) {
    ++entries;
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(dlsym(handle, name));
    if (*out == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  resolve("ncclAllReduce", &t.allReduce);
  resolve("ncclReduceScatter", &t.reduceScatter);
  resolve("ncclAllGather", &t.allGather);
  resolve("ncclCommInitRank", &t.commInitRank);
  resolve("ncclCommInitRankConfig", &t.commInitRankConfig);
  resolve("ncclCommInitRankScalable", &t.commInitRankScalable);
  resolve("ncclCommShrink", &t.commShrink);
  resolve("ncclCommInitAll", &t.commInitAll);
  resolve("ncclCommSplit", &t.commSplit);
  resolve("ncclCommDestroy", &t.commDestroy);
  resolve("ncclCommAbort", &t.commAbort);
  resolve("ncclGroupStart", &t.groupStart);
  resolve("ncclGroupEnd", &t.groupEnd);
  resolve("ncclGroupSimulateEnd", &t.groupSimulateEnd);
  resolve("ncclCommCount", &t.commCount);
  resolve("ncclCommUserRank", &t.commUserRank);
  resolve("ncclCommGetAsyncError", &t.commGetAsyncError);
  resolve("ncclCommGrow", &t.commGrow);
  resolve("ncclCommRevoke", &t.commRevoke);
  resolve("ncclCommSuspend", &t.commSuspend);
  resolve("ncclCommResume", &t.commResume);
  resolve("ncclGetVersion", &t.getVersion);
  // Entry points of a newer NCCL than the oldest the interposer forwards to:
  // an older library lacks them by design, and only their own calls fail.
  std::string absent;
  auto resolveOptional = [&](const char* name, const char* since, auto* out) {
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(dlsym(handle, name));
    if (*out != nullptr) {
      ++entries;
    } else {
      absent += std::string(absent.empty() ? "" : ", ") + name + " (NCCL " + since + "+)";
    }
  };
  resolveOptional("ncclAllReduceConfig", "2.31", &t.allReduceConfig);
  resolveOptional("ncclReduceScatterConfig", "2.31", &t.reduceScatterConfig);
  resolveOptional("ncclAllGatherConfig", "2.31", &t.allGatherConfig);
  t.found = t.allReduce != nullptr;

  Dl_info where{};
  const char* file = t.allReduce != nullptr &&
                             dladdr(reinterpret_cast<void*>(t.allReduce), &where) != 0 &&
                             where.dli_fname != nullptr
                         ? where.dli_fname
                         : policy().ncclLibrary.c_str();
  int version = 0;
  if (t.getVersion == nullptr || t.getVersion(&version) != nccl_abi::kSuccess) version = 0;
  t.version = version;
  const std::string said = std::to_string(version / 10000) + "." +
                           std::to_string(version / 100 % 100) + "." +
                           std::to_string(version % 100);
  const std::string older =
      absent.empty() ? "" : "; it lacks the optional " + absent + ", whose calls fail saying so";
  if (missing.empty()) {
    SQUALL_INFO(Subsys::kApi,
                "the interposer forwards to NCCL %s at %s (%s): every one of its %d entry "
                "points resolved%s",
                said.c_str(), file, how.c_str(), entries, older.c_str());
  } else {
    SQUALL_INFO(Subsys::kApi,
                "the interposer forwards to NCCL %s at %s (%s); it lacks %s, whose calls fail "
                "saying so%s",
                said.c_str(), file, how.c_str(), missing.c_str(), older.c_str());
  }
  return t;
}

}  // namespace

const RealNccl& realNccl() {
  static const RealNccl table = load();
  return table;
}

}  // namespace squall::preload
