// Which data plane a communicator uses, and building it. The one place that
// knows every transport backend, so the rest of core stays backend-agnostic.
#pragma once

#include <memory>

#include "squall/squall.h"
#include "src/bootstrap/bootstrap.h"
#include "src/transport/transport.h"

namespace squall::core {

// kNccl: a communicator from NCCL (Comm::fromNccl); never chosen and never
// built from a bootstrap.
enum class TransportKind { kUcx, kTcp, kMpi, kNccl };

// Resolves squallTransportDefault through SQUALL_TRANSPORT and what was built
// in; an explicit choice that was not built in is an error that says so.
Status chooseTransport(squallTransport_t requested, TransportKind* kind);

Status createTransport(TransportKind kind, bootstrap::Bootstrap& bootstrap,
                       std::unique_ptr<transport::Transport>* out);

}  // namespace squall::core
