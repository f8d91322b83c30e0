// Where a job started without a unique id finds its rank, its size and the
// rendezvous: the variables torchrun, Slurm's srun and Open MPI's mpirun set.
#pragma once

#include <string>
#include <string_view>

#include "src/common/status.h"

namespace squall::bootstrap {

struct LaunchEnv {
  const char* launcher = "";  // "torchrun", "slurm" or "openmpi": whose variables were read
  int rank = -1;
  int nranks = 0;
  int localRank = -1;      // -1 when the launcher does not say
  std::string host;        // rank 0's host name or address
  std::string hostSource;  // the variable the host came from, for messages
  int port = 0;
  std::string secret;  // what the job secret is derived from
  // Where `secret` came from: "SQUALL_JOB_SECRET", the launcher's run id
  // ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID.SLURM_STEP_ID", "the Open MPI job
  // id"), or "" for the fixed public value (no secret at all).
  std::string secretSource;
};

// Reads, in this order of precedence:
//  * torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
//  * Open MPI: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; rank 0's host is
//    MASTER_ADDR, or 127.0.0.1 when every rank is on this host;
//  * Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; rank 0's host is
//    MASTER_ADDR or the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST.
// The port is SQUALL_PORT, else MASTER_PORT + SQUALL_PORT_OFFSET, else (Slurm
// and Open MPI) derived from the job id so that two jobs on one host differ.
// The secret text is SQUALL_JOB_SECRET, else the launcher's run id where
// there is one (TORCHELASTIC_RUN_ID unless "none", with MASTER_ADDR and
// MASTER_PORT; Slurm's job and step; Open MPI's job id), else a fixed public
// value (secretSource empty).
Status readLaunchEnv(LaunchEnv* out);

// The first host of a Slurm host list: "node[07-09,12],gpu1" gives "node07".
std::string firstSlurmHost(std::string_view nodelist);

}  // namespace squall::bootstrap
