// State shared by the MPI and NCCL front ends: the policy (read once), the
// re-entry guard and the exit hook that writes the report.
#pragma once

#include "plugin/preload/policy.h"

namespace squall::preload {

const Policy& policy();

// True while this thread runs a compressed call: calls Squall makes then go
// straight to the real library.
bool insideSquall();
class InsideSquall {
 public:
  InsideSquall();
  ~InsideSquall();
  InsideSquall(const InsideSquall&) = delete;
  InsideSquall& operator=(const InsideSquall&) = delete;
};

}  // namespace squall::preload
