// The objects behind the C API's opaque handles: each owns the C++ object of
// the facade (comm.h) it stands for.
#pragma once

#include <memory>
#include <thread>

#include "squall/squall.h"
#include "src/core/comm.h"

struct squallComm {
  std::unique_ptr<squall::core::Comm> impl;
  std::thread::id creator;  // the thread it was handed out on (api_comm.cc)
  ~squallComm();
};

struct squallCompressor {
  std::unique_ptr<squall::core::Compressor> impl;
};

namespace squall::core {
// Checks a caller's communicator handle and returns its Comm.
Status commOf(squallComm_t comm, Comm** out);
// Charges `c` with the collectives this thread skipped on a NULL
// communicator (api_comm.cc); for entry points that run collectives on a
// communicator they do not take as an argument (an optimizer's step).
void chargeSkippedCalls(Comm& c);
}  // namespace squall::core
