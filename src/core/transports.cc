#include "src/core/transports.h"

#include <strings.h>

#include <string>

#include "src/common/params.h"
#include "src/transport/tcp/tcp_transport.h"
#if defined(SQUALL_HAVE_UCX)
#include "src/transport/ucx/ucx_transport.h"
#endif

namespace squall::core {
namespace {

constexpr bool kHaveUcx =
#if defined(SQUALL_HAVE_UCX)
    true;
#else
    false;
#endif

}  // namespace

Status chooseTransport(squallTransport_t requested, TransportKind* kind) {
  switch (requested) {
    case squallTransportUcx:
      SQUALL_REQUIRE(kHaveUcx, Status::kUnsupported, Subsys::kInit,
                     "the UCX transport was requested but this Squall was built without UCX "
                     "(install libucx-dev and rebuild), or use squallTransportTcp");
      *kind = TransportKind::kUcx;
      return Status::kOk;
    case squallTransportTcp: *kind = TransportKind::kTcp; return Status::kOk;
    case squallTransportMpi:
      return SQUALL_FAIL(Status::kInvalidUsage, Subsys::kInit,
                         "the MPI transport runs over an MPI communicator: use "
                         "squallCommInitFromMpi");
    case squallTransportDefault: break;
  }
  const std::string wanted = paramString(Param::kTransport);
  if (strcasecmp(wanted.c_str(), "tcp") == 0) {
    *kind = TransportKind::kTcp;
  } else if (strcasecmp(wanted.c_str(), "ucx") == 0) {
    return chooseTransport(squallTransportUcx, kind);
  } else {
    if (strcasecmp(wanted.c_str(), "auto") != 0)
      SQUALL_WARN(Subsys::kEnv, "SQUALL_TRANSPORT=\"%s\" is not auto, ucx or tcp; using auto",
                  wanted.c_str());
    *kind = kHaveUcx ? TransportKind::kUcx : TransportKind::kTcp;
  }
  return Status::kOk;
}

Status createTransport(TransportKind kind, bootstrap::Bootstrap& bootstrap,
                       std::unique_ptr<transport::Transport>* out) {
  switch (kind) {
    case TransportKind::kTcp: return transport::createTcpTransport(bootstrap, out);
#if defined(SQUALL_HAVE_UCX)
    case TransportKind::kUcx: return transport::createUcxTransport(bootstrap, out);
#else
    case TransportKind::kUcx:
#endif
    case TransportKind::kMpi:
    case TransportKind::kNccl: break;
  }
  return SQUALL_FAIL(Status::kInternal, Subsys::kInit,
                     "transport kind %d cannot be built from a bootstrap; please report this",
                     static_cast<int>(kind));
}

}  // namespace squall::core
