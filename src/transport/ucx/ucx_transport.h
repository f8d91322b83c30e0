// The UCX backend: the default host data plane.
//
// One UCP context and worker per transport, with an endpoint to every rank
// (itself included) created from worker addresses exchanged over the
// bootstrap. UCX chooses the wires (shared memory inside a host, TCP, RDMA
// where present; UCX_TLS and UCX_NET_DEVICES still apply). See
// ucx_transport.cc for the tag layout, matching and failure handling.
#pragma once

#include <memory>

#include "src/bootstrap/bootstrap.h"
#include "src/common/status.h"
#include "src/transport/transport.h"

namespace squall::transport {

// Collective over `bootstrap`: every rank calls it. The transport must be used
// by one thread at a time and must outlive its requests.
Status createUcxTransport(bootstrap::Bootstrap& bootstrap, std::unique_ptr<Transport>* out);

}  // namespace squall::transport
