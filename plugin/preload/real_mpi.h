// The MPI functions the interposer itself calls. They are the profiling
// (PMPI_) entry points, which the interposer never defines, so nothing it
// calls can come back into it; Squall's MPI transport resolves its entry points
// from libmpi's own handle (src/transport/mpi/mpi_table.h), never through the
// interposer's exports.
#pragma once

#include <mpi.h>

namespace squall::preload::real_mpi {

inline int allReduce(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op,
                     MPI_Comm comm) {
  return PMPI_Allreduce(in, out, count, type, op, comm);
}

}  // namespace squall::preload::real_mpi
