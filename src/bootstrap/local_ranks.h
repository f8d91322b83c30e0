// How many ranks of a job run on this machine, for dividing its cores among
// them (the codec's default thread count).
#pragma once

#include <string>

#include "src/bootstrap/bootstrap.h"

namespace squall::bootstrap {

// What names this machine's kernel: its boot id, else "host <name>". Ranks
// in separate network namespaces or containers of one machine share it.
std::string machineId();

// The ranks that share this rank's cores: the same kernel (same boot id,
// else same host name; processes in separate network namespaces or
// containers of one machine share its cores) and a CPU affinity that
// overlaps this rank's (ranks a launcher bound to disjoint cores do not
// share them). This rank included. Collective over `bootstrap`.
Status countLocalRanks(Bootstrap& bootstrap, int* localRanks);

}  // namespace squall::bootstrap
