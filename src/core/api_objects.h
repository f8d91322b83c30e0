// The objects behind the C API's opaque handles: each owns the C++ object of
// the facade (comm.h) it stands for.
#pragma once

#include <memory>

#include "squall/squall.h"
#include "src/core/comm.h"

struct squallComm {
  std::unique_ptr<squall::core::Comm> impl;
};

struct squallCompressor {
  std::unique_ptr<squall::core::Compressor> impl;
};

namespace squall::core {
// Checks a caller's communicator handle and returns its Comm.
Status commOf(squallComm_t comm, Comm** out);
}  // namespace squall::core
