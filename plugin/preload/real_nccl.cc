#include "plugin/preload/real_nccl.h"

#include <dlfcn.h>

#include "plugin/preload/interposer.h"
#include "src/common/log.h"

namespace squall::preload {

namespace {

template <class F>
void resolve(void* handle, const char* name, F* out) {
  void* symbol = dlsym(handle, name);
  *out = reinterpret_cast<F>(symbol);
}

RealNccl load() {
  RealNccl t;
  void* handle = RTLD_NEXT;
  if (dlsym(RTLD_NEXT, "ncclAllReduce") == nullptr) {
    handle = dlopen(policy().ncclLibrary.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      SQUALL_WARN(Subsys::kApi,
                  "the interposer found no NCCL after it and cannot open %s (%s); "
                  "set SQUALL_NCCL_LIBRARY to the real libnccl.so.2",
                  policy().ncclLibrary.c_str(), dlerror());
      return t;
    }
  }
  resolve(handle, "ncclAllReduce", &t.allReduce);
  resolve(handle, "ncclCommInitRank", &t.commInitRank);
  resolve(handle, "ncclCommInitRankConfig", &t.commInitRankConfig);
  resolve(handle, "ncclCommInitRankScalable", &t.commInitRankScalable);
  resolve(handle, "ncclCommShrink", &t.commShrink);
  resolve(handle, "ncclCommInitAll", &t.commInitAll);
  resolve(handle, "ncclCommSplit", &t.commSplit);
  resolve(handle, "ncclCommDestroy", &t.commDestroy);
  resolve(handle, "ncclCommAbort", &t.commAbort);
  resolve(handle, "ncclGroupStart", &t.groupStart);
  resolve(handle, "ncclGroupEnd", &t.groupEnd);
  resolve(handle, "ncclGroupSimulateEnd", &t.groupSimulateEnd);
  resolve(handle, "ncclCommCount", &t.commCount);
  resolve(handle, "ncclCommUserRank", &t.commUserRank);
  resolve(handle, "ncclCommGetAsyncError", &t.commGetAsyncError);
  resolve(handle, "ncclCommGrow", &t.commGrow);
  resolve(handle, "ncclCommRevoke", &t.commRevoke);
  resolve(handle, "ncclCommSuspend", &t.commSuspend);
  resolve(handle, "ncclCommResume", &t.commResume);
  t.found = t.allReduce != nullptr;
  return t;
}

}  // namespace

const RealNccl& realNccl() {
  static const RealNccl table = load();
  return table;
}

}  // namespace squall::preload
