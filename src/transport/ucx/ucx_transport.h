// The UCX backend: the default host data plane.
//
// One UCP context and worker per transport, with an endpoint to every rank
// (itself included) created from worker addresses exchanged over the
// bootstrap. UCX chooses the wires (shared memory inside a host, TCP, RDMA
// where present; UCX_TLS and UCX_NET_DEVICES still apply). UCX is opened at
// run time (ucx_api.h): where it cannot be loaded, creating the transport
// fails on that rank, and on its peers naming it. See ucx_transport.cc for
// the tag layout, matching and failure handling.
#pragma once

#include <memory>
#include <string>

#include "src/bootstrap/bootstrap.h"
#include "src/common/status.h"
#include "src/transport/transport.h"

namespace squall::transport {

// Collective over `bootstrap`: every rank calls it. The transport must be used
// by one thread at a time and must outlive its requests.
// `wait.spin`: a waiter polls the worker this long before it arms it and
// sleeps on its event descriptor.
Status createUcxTransport(bootstrap::Bootstrap& bootstrap, std::unique_ptr<Transport>* out,
                          const WaitOptions& wait);
// Waiters that sleep at once (no polling).
Status createUcxTransport(bootstrap::Bootstrap& bootstrap, std::unique_ptr<Transport>* out);

// The RNDV_THRESH Squall gives UCX, or "" to leave UCX's own setting.
// `param` is SQUALL_UCX_RNDV_THRESH, `userSetting` whether UCX_RNDV_THRESH is
// in the environment, `rdma` whether the host has an RDMA device. "ucx" leaves
// UCX's setting; any other value but "auto" is passed on. "auto" means
// eager messages only ("inf") on hosts without RDMA: UCX's rendezvous over
// TCP moved about half as many bytes per second on a shaped 1 Gbit/s link
// (docs/transports.md), while RDMA is where rendezvous (zero copy) pays.
std::string ucxRendezvousThreshold(const std::string& param, bool userSetting, bool rdma);

}  // namespace squall::transport
