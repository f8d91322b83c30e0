#include "src/core/transports.h"

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/codec/parallel.h"
#include "src/common/log.h"
#include "src/common/params.h"
#include "src/transport/tcp/tcp_transport.h"
#if defined(SQUALL_HAVE_UCX)
#include "src/transport/ucx/ucx_api.h"
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
    *kind = kHaveUcx ? TransportKind::kUcxOrTcp : TransportKind::kTcp;
  }
  return Status::kOk;
}

#if defined(SQUALL_HAVE_UCX)
namespace {

// kUcxOrTcp: UCX only when every rank can load it, so that one host without
// UCX turns the job to TCP instead of failing it. Said once per process.
Status agreeOnUcx(bootstrap::Bootstrap& bootstrap, TransportKind* kind) {
  std::string why;
  const uint8_t mine = transport::findUcx(&why) != nullptr ? 1 : 0;
  std::vector<uint8_t> all(static_cast<size_t>(bootstrap.size()));
  SQUALL_TRY(bootstrap.allGather(&mine, sizeof(mine), all.data()));
  const auto without = std::find(all.begin(), all.end(), uint8_t{0});
  if (without == all.end()) {
    *kind = TransportKind::kUcx;
    return Status::kOk;
  }
  *kind = TransportKind::kTcp;
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return Status::kOk;
  if (mine == 0) {
    SQUALL_INFO(Subsys::kInit,
                "UCX was not found, so TCP serves as the default transport: %s (or set "
                "SQUALL_TRANSPORT=tcp to choose TCP without looking for UCX)",
                why.c_str());
  } else {
    SQUALL_INFO(Subsys::kInit,
                "rank %d cannot load UCX (its log says why), so TCP serves as the default "
                "transport of communicators with it",
                static_cast<int>(without - all.begin()));
  }
  return Status::kOk;
}

}  // namespace
#endif

transport::WaitOptions waitOptions(int localRanks) {
  static const int64_t asked = [] {
    const std::string v = paramString(Param::kSpinUs);
    if (v.empty() || strcasecmp(v.c_str(), "auto") == 0) return int64_t{-1};
    char* end = nullptr;
    const long long us = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || us < 0 || us > 1000000) {
      SQUALL_WARN(Subsys::kEnv,
                  "SQUALL_SPIN_US=\"%s\" is not auto or a number of microseconds (0..1000000); "
                  "using auto",
                  v.c_str());
      return int64_t{-1};
    }
    return static_cast<int64_t>(us);
  }();
  transport::WaitOptions wait;
  if (asked >= 0) {
    wait.spin = std::chrono::microseconds(asked);
  } else if (codec::affinityCores() >= localRanks) {
    wait.spin = kAutoSpin;
  }
  return wait;
}

Status createTransport(TransportKind kind, bootstrap::Bootstrap& bootstrap,
                       const transport::WaitOptions& wait,
                       std::unique_ptr<transport::Transport>* out) {
#if defined(SQUALL_HAVE_UCX)
  if (kind == TransportKind::kUcxOrTcp) SQUALL_TRY(agreeOnUcx(bootstrap, &kind));
#else
  if (kind == TransportKind::kUcxOrTcp) kind = TransportKind::kTcp;
#endif
  switch (kind) {
    case TransportKind::kTcp: return transport::createTcpTransport(bootstrap, out, wait);
#if defined(SQUALL_HAVE_UCX)
    case TransportKind::kUcx: return transport::createUcxTransport(bootstrap, out, wait);
#else
    case TransportKind::kUcx:
#endif
    case TransportKind::kUcxOrTcp:
    case TransportKind::kMpi:
    case TransportKind::kNccl: break;
  }
  return SQUALL_FAIL(Status::kInternal, Subsys::kInit,
                     "transport kind %d cannot be built from a bootstrap; please report this",
                     static_cast<int>(kind));
}

}  // namespace squall::core
