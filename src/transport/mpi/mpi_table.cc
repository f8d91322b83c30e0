#include "src/transport/mpi/mpi_table.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <type_traits>

#include "src/common/params.h"

namespace squall::transport::mpi {
namespace {

// Open MPI's soname since 3.0 (4.x and 5.x keep it).
constexpr const char* kOpenMpiSoname = "libmpi.so.40";
// Sonames of the MPICH ABI (MPICH, Intel MPI, MVAPICH), which this build
// cannot speak.
constexpr const char* kMpichSonames[] = {"libmpi.so.12", "libmpich.so.12"};

std::string loadedFile(void* lib, const char* fallback) {
  link_map* map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0')
    return map->l_name;
  return fallback;
}

std::string dlReason() {
  const char* why = dlerror();
  return why != nullptr ? why : "no reason given";
}

// The library whose entries are used: the process's Open MPI, else the one
// named by SQUALL_MPI_LIBRARY, else Open MPI's soname. `origin` says which.
Status openLibrary(void** out, std::string* origin) {
  if (void* lib = dlopen(kOpenMpiSoname, RTLD_NOW | RTLD_NOLOAD)) {
    *out = lib;
    *origin = loadedFile(lib, kOpenMpiSoname) + " (already loaded)";
    return Status::kOk;
  }
  for (const char* soname : kMpichSonames) {
    if (void* lib = dlopen(soname, RTLD_NOW | RTLD_NOLOAD)) {
      std::string file = loadedFile(lib, soname);
      dlclose(lib);
      return SQUALL_FAIL(Status::kUnsupported, Subsys::kTransport,
                         "this process runs the MPI in %s, which has MPICH's ABI (MPICH, Intel "
                         "MPI, MVAPICH); this Squall speaks Open MPI's ABI (libmpi.so.40) only: "
                         "run the job with Open MPI, or create the communicator with "
                         "squallCommInitFromEnv or squallCommInitRank instead of from MPI",
                         file.c_str());
    }
  }
  const std::string named = paramString(Param::kMpiLibrary);
  const char* path = named.empty() ? kOpenMpiSoname : named.c_str();
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::string why = dlReason();
    if (!named.empty())
      return SQUALL_FAIL(Status::kUnsupported, Subsys::kTransport,
                         "no MPI library is loaded in this process and the one SQUALL_MPI_LIBRARY "
                         "names, %s, could not be loaded (%s); point SQUALL_MPI_LIBRARY at Open "
                         "MPI's libmpi.so.40, or unset it to use the default",
                         path, why.c_str());
    return SQUALL_FAIL(Status::kUnsupported, Subsys::kTransport,
                       "no MPI library is loaded in this process and %s could not be loaded "
                       "(%s); install Open MPI (Debian and Ubuntu: apt-get install openmpi-bin), "
                       "put the folder holding libmpi.so.40 on LD_LIBRARY_PATH, or name the "
                       "library in SQUALL_MPI_LIBRARY",
                       path, why.c_str());
  }
  *out = lib;
  *origin = loadedFile(lib, path);
  return Status::kOk;
}

// Fills `t` from `lib` once it is known to be an Open MPI.
Status resolve(void* lib, const std::string& origin, Table* t) {
  const char* missing = nullptr;
  auto need = [&](const char* name, auto* entry) {
    using Entry = std::remove_pointer_t<decltype(entry)>;
    *entry = reinterpret_cast<Entry>(dlsym(lib, name));
    if (*entry == nullptr && missing == nullptr) missing = name;
  };
#define SQUALL_MPI_NEED(name) need("MPI_" #name, &t->name);
  SQUALL_MPI_FUNCTIONS(SQUALL_MPI_NEED)
#undef SQUALL_MPI_NEED
  // A program that names a predefined handle gets its own copy of the
  // object (a copy relocation), and libmpi then uses that copy: the one the
  // process's global scope finds first. libmpi's own object counts only when
  // nothing global defines it (libmpi loaded local to a module, as mpi4py's
  // or ours).
  auto object = [&](const char* name, auto* handle) {
    using Handle = std::remove_pointer_t<decltype(handle)>;
    void* address = dlsym(RTLD_DEFAULT, name);
    if (address == nullptr) address = dlsym(lib, name);
    *handle = reinterpret_cast<Handle>(address);
    if (address == nullptr && missing == nullptr) missing = name;
  };
  object("ompi_mpi_byte", &t->byte);
  object("ompi_mpi_comm_null", &t->commNull);
  object("ompi_mpi_errors_return", &t->errorsReturn);
  object("ompi_request_null", &t->requestNull);
  SQUALL_REQUIRE(missing == nullptr, Status::kUnsupported, Subsys::kTransport,
                 "the MPI library %s has no %s; Squall needs Open MPI 3.0 or newer (point "
                 "SQUALL_MPI_LIBRARY at its libmpi.so.40)",
                 origin.c_str(), missing);
  return Status::kOk;
}

Status load(Table* out, std::string* origin, std::string* version) {
  void* lib = nullptr;
  SQUALL_TRY(openLibrary(&lib, origin));
  auto getVersion =
      reinterpret_cast<decltype(&::MPI_Get_library_version)>(dlsym(lib, "MPI_Get_library_version"));
  if (getVersion == nullptr) {
    dlclose(lib);
    return SQUALL_FAIL(Status::kUnsupported, Subsys::kTransport,
                       "%s is not an MPI library (it has no MPI_Get_library_version); point "
                       "SQUALL_MPI_LIBRARY at Open MPI's libmpi.so.40",
                       origin->c_str());
  }
  // Callable before MPI_Init, by the standard.
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  getVersion(text, &length);
  version->assign(text, static_cast<size_t>(std::clamp(length, 0, MPI_MAX_LIBRARY_VERSION_STRING)));
  while (!version->empty() &&
         (version->back() == '\n' || version->back() == ' ' || version->back() == '\0'))
    version->pop_back();
  // Open MPI's ABI is its predefined objects: a library without them (MPICH
  // under Open MPI's soname, a wrapper) would take our handles for garbage.
  if (dlsym(lib, "ompi_mpi_byte") == nullptr) {
    dlclose(lib);
    return SQUALL_FAIL(Status::kUnsupported, Subsys::kTransport,
                       "the MPI library %s is \"%s\", not Open MPI; this Squall speaks Open "
                       "MPI's ABI (libmpi.so.40) only: run the job with Open MPI, or create the "
                       "communicator with squallCommInitFromEnv or squallCommInitRank instead "
                       "of from MPI",
                       origin->c_str(), version->c_str());
  }
  Status resolved = resolve(lib, *origin, out);
  // Never closed once resolved: communicators and requests outlive any caller.
  if (resolved != Status::kOk) dlclose(lib);
  return resolved;
}

}  // namespace

Status mpiTable(const Table** out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "the MPI table output pointer is NULL");
  static std::mutex mutex;
  static Table loaded{};
  static std::string origin;
  static std::string version;
  static bool ready = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!ready) {
    Table t{};
    SQUALL_TRY(load(&t, &origin, &version));
    t.origin = origin.c_str();
    t.version = version.c_str();
    loaded = t;
    ready = true;
    SQUALL_INFO(Subsys::kTransport, "MPI: %s from %s", loaded.version, loaded.origin);
  }
  *out = &loaded;
  return Status::kOk;
}

}  // namespace squall::transport::mpi
