#include "plugin/preload/interposer.h"

#include "plugin/preload/report.h"

namespace squall::preload {

namespace {
thread_local int tDepth = 0;
}

const Policy& policy() {
  static const Policy* p = new Policy(Policy::fromEnvironment());
  return *p;
}

bool insideSquall() { return tDepth > 0; }
InsideSquall::InsideSquall() { ++tDepth; }
InsideSquall::~InsideSquall() { --tDepth; }

// Processes that never call MPI_Finalize (or use only NCCL) report at exit.
[[gnu::destructor]] static void reportAtExit() { Report::get().finish(policy()); }

}  // namespace squall::preload
