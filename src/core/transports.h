// Which data plane a communicator uses, and building it. The one place that
// knows every transport backend, so the rest of core stays backend-agnostic.
#pragma once

#include <memory>

#include "squall/squall.h"
#include "src/bootstrap/bootstrap.h"
#include "src/transport/transport.h"

namespace squall::core {

// kNccl: a communicator from NCCL (Comm::fromNccl); never chosen and never
// built from a bootstrap. kUcxOrTcp: UCX chosen by default, not asked for:
// the ranks agree, when the transport is built, on UCX if every one of them
// can load it (SQUALL_UCX_LIBRARY) and on TCP otherwise.
enum class TransportKind { kUcx, kTcp, kMpi, kNccl, kUcxOrTcp };

// Resolves squallTransportDefault through SQUALL_TRANSPORT and what was built
// in; an explicit choice that was not built in is an error that says so. An
// explicit UCX that cannot be loaded fails when the transport is built.
Status chooseTransport(squallTransport_t requested, TransportKind* kind);

// How long a waiting thread polls before it sleeps (SQUALL_SPIN_US): by
// default kAutoSpin when this rank owns a core, that is when the cores its
// affinity allows are at least `localRanks`, the ranks that share them
// (bootstrap::countLocalRanks), else not at all.
transport::WaitOptions waitOptions(int localRanks);
constexpr std::chrono::microseconds kAutoSpin{100};

Status createTransport(TransportKind kind, bootstrap::Bootstrap& bootstrap,
                       const transport::WaitOptions& wait,
                       std::unique_ptr<transport::Transport>* out);

}  // namespace squall::core
