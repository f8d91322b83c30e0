// The MPI backend: squall's messages over a communicator the application
// already has, for jobs launched with mpirun/srun that want MPI's wires.
//
// See mpi_transport.cc for the tag layout, matching and the threading rule.
#pragma once

#include <mpi.h>

#include <memory>

#include "src/common/status.h"
#include "src/transport/transport.h"

namespace squall::transport {

// Collective over `comm` (it duplicates it), calling the MPI the process has
// loaded (mpi_table.h; kUnsupported when that is not Open MPI's ABI or when
// no Open MPI can be found). MPI must be initialised. The transport must be
// used by one thread at a time, and below MPI_THREAD_SERIALIZED only by the
// thread that initialised MPI; it must be destroyed before MPI_Finalize and
// must outlive its requests.
Status createMpiTransport(MPI_Comm comm, std::unique_ptr<Transport>* out);

}  // namespace squall::transport
