// The MPI entry points and predefined handles Squall uses, as one table
// resolved at run time.
//
// Squall is compiled against Open MPI's mpi.h but links no libmpi: nothing
// that loads libsquall.so needs an MPI installed. The MPI a communicator runs
// over is the one the process already has (an MPI program, mpi4py), reached
// through libmpi's own handle; only when none is loaded is a library opened
// (SQUALL_MPI_LIBRARY, else libmpi.so.40). Resolving through that handle also
// means an LD_PRELOAD interposer that exports MPI_* never catches Squall's own
// calls.
//
// The entries keep mpi.h's signatures (decltype), so they are called as the
// functions themselves. In Open MPI's ABI the predefined handles (MPI_BYTE,
// MPI_COMM_NULL, ...) are addresses of objects inside libmpi, so they are
// resolved too; integer constants (MPI_SUCCESS, MPI_TAG_UB, MPI_THREAD_*,
// MPI_BOTTOM, MPI_STATUS_IGNORE) are used as the header defines them. Code
// that includes this header must not name a handle macro directly: that
// would make the object need libmpi again.
#pragma once

#include <mpi.h>

#include "src/common/status.h"

#if !defined(OPEN_MPI) || !OPEN_MPI
#error "Squall's MPI support speaks Open MPI's ABI: build it against Open MPI's mpi.h"
#endif

namespace squall::transport::mpi {

// Every MPI function Squall calls, by its name without the MPI_ prefix.
#define SQUALL_MPI_FUNCTIONS(X) \
  X(Get_library_version)        \
  X(Initialized)                \
  X(Finalized)                  \
  X(Query_thread)               \
  X(Is_thread_main)             \
  X(Error_string)               \
  X(Comm_dup)                   \
  X(Comm_free)                  \
  X(Comm_rank)                  \
  X(Comm_size)                  \
  X(Comm_get_attr)              \
  X(Comm_set_errhandler)        \
  X(Get_address)                \
  X(Type_create_hindexed)       \
  X(Type_commit)                \
  X(Type_free)                  \
  X(Isend)                      \
  X(Improbe)                    \
  X(Imrecv)                     \
  X(Get_elements_x)             \
  X(Test)                       \
  X(Wait)                       \
  X(Cancel)

struct Table {
// The argument names a member, which parentheses would not declare.
#define SQUALL_MPI_ENTRY(name) decltype(&::MPI_##name) name;  // NOLINT(bugprone-macro-parentheses)
  SQUALL_MPI_FUNCTIONS(SQUALL_MPI_ENTRY)
#undef SQUALL_MPI_ENTRY
  // MPI_BYTE, MPI_COMM_NULL, MPI_ERRORS_RETURN and MPI_REQUEST_NULL as the
  // process (and so its libmpi) sees them.
  MPI_Datatype byte;
  MPI_Comm commNull;
  MPI_Errhandler errorsReturn;
  MPI_Request requestNull;
  // The library's file, and whether the process had loaded it
  // ("/usr/lib/x86_64-linux-gnu/libmpi.so.40 (already loaded)").
  const char* origin;
  // MPI_Get_library_version's text ("Open MPI v4.1.4, ...").
  const char* version;
};

// The table, resolved on first success and logged once at INFO; a failure is
// retried on the next call, since the process may load MPI in between.
// kUnsupported, saying what to install or set, when no Open MPI library can
// be found, or when the process's MPI (or the one named) is not Open MPI's
// ABI.
Status mpiTable(const Table** out);

}  // namespace squall::transport::mpi
