// How many ranks of a job run on this machine, for dividing its cores among
// them (the codec's default thread count).
#pragma once

#include "src/bootstrap/bootstrap.h"

namespace squall::bootstrap {

// The ranks whose kernel is this rank's (same boot id, else same host name):
// processes in separate network namespaces or containers of one machine
// share its cores, so they count as local. Collective over `bootstrap`.
Status countLocalRanks(Bootstrap& bootstrap, int* localRanks);

}  // namespace squall::bootstrap
