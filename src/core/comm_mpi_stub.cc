// Comm::fromMpi in a build without MPI.
#include "src/core/comm.h"

namespace squall::core {

Status Comm::fromMpi(const void* /*mpiComm*/, const CommConfig& /*config*/,
                     std::unique_ptr<Comm>* /*out*/) {
  return SQUALL_FAIL(Status::kUnsupported, Subsys::kInit,
                     "this Squall was built without MPI; install libopenmpi-dev and rebuild "
                     "(meson option mpi), or create the communicator with squallCommInitRank");
}

}  // namespace squall::core
