#include "src/transport/ucx/ucx_api.h"

#include <dlfcn.h>

#include <cstdio>
#include <type_traits>

#include "src/common/params.h"

namespace squall::transport {
namespace {

struct Loaded {
  UcxApi api;
  bool ok = false;
  std::string why;  // when !ok
};

Loaded load() {
  Loaded out;
  const std::string path = paramString(Param::kUcxLibrary);
  // Never closed: UCX contexts and requests may live until the process ends.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  char text[768];
  if (lib == nullptr) {
    const char* error = dlerror();
    std::snprintf(text, sizeof(text),
                  "UCX could not be loaded (%s); install UCX's libraries (Debian and Ubuntu: "
                  "libucx0; RHEL and Fedora: ucx) or set SQUALL_UCX_LIBRARY to the path of "
                  "libucp.so.0",
                  error != nullptr ? error : path.c_str());
    out.why = text;
    return out;
  }
  // dlsym on libucp's handle also searches the libraries it was linked
  // with, so ucs_status_string comes from the libucs this libucp loaded
  // (not from another copy a bare dlopen("libucs.so.0") might find).
  const char* missing = nullptr;
  auto resolve = [&](auto& entry, const char* name) {
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(lib, name));
    if (entry == nullptr && missing == nullptr) missing = name;
  };
#define SQUALL_UCX_RESOLVE(name) resolve(out.api.name, #name);
  SQUALL_UCX_ENTRY_POINTS(SQUALL_UCX_RESOLVE)
#undef SQUALL_UCX_RESOLVE
  if (missing != nullptr) {
    std::snprintf(text, sizeof(text),
                  "the UCX library %s has no %s: it is older than the UCX %d.%d API Squall was "
                  "built against; install a newer UCX or set SQUALL_UCX_LIBRARY to one",
                  path.c_str(), missing, UCP_API_MAJOR, UCP_API_MINOR);
    out.why = text;
    return out;
  }
  out.ok = true;
  return out;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const UcxApi* findUcx(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why != nullptr) *why = l.why;
  return l.ok ? &l.api : nullptr;
}

Status requireUcx(const char* prefix, const char* otherwise) {
  std::string why;
  SQUALL_REQUIRE(findUcx(&why) != nullptr, Status::kUnsupported, Subsys::kTransport, "%s%s, %s",
                 prefix, why.c_str(), otherwise);
  return Status::kOk;
}

const UcxApi& ucx() { return loaded().api; }

}  // namespace squall::transport
