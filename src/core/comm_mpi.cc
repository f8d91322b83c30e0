// Comm::fromMpi, built where Open MPI's headers are found (else
// comm_mpi_stub.cc). It links no libmpi: the MPI transport calls the MPI the
// process has loaded, found at run time (src/transport/mpi/mpi_table.h).
#include "src/core/comm.h"
#include "src/core/engine.h"
#include "src/transport/mpi/mpi_transport.h"

namespace squall::core {

Status Comm::fromMpi(const void* mpiComm, const CommConfig& config, std::unique_ptr<Comm>* out) {
  SQUALL_REQUIRE(out != nullptr && mpiComm != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the communicator output and the MPI_Comm pointer must be set");
  std::unique_ptr<transport::Transport> transport;
  SQUALL_TRY(transport::createMpiTransport(*static_cast<const MPI_Comm*>(mpiComm), &transport));
  CommConfig c = config;
  c.transport = TransportKind::kMpi;
  std::unique_ptr<Engine> engine;
  SQUALL_TRY(createHostEngine(nullptr, std::move(transport), c, &engine));
  out->reset(new Comm(std::move(engine), c));
  return Status::kOk;
}

}  // namespace squall::core
