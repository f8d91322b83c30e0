// The UCX entry points Squall calls, as one table resolved at run time.
//
// Squall compiles against UCX's headers but links no UCX library: the UCX
// transport and the NCCL plugin's UCX plane call UCX only through this table,
// filled once per process by dlopen of SQUALL_UCX_LIBRARY (libucp.so.0 by
// default; a soname already loaded, e.g. by an MPI built on UCX, gives that
// copy) and dlsym on its handle. So libsquall.so, the plugin and the
// interposers load on hosts without UCX, where the default transport falls
// back to TCP (src/core/transports.cc) and an explicit UCX request fails
// with what to install.
//
// Each entry has the name and the type of the exported symbol it holds, taken
// from the headers with decltype. ucp_init is an inline wrapper in ucp.h, so
// the table holds the symbol behind it, ucp_init_version (init() below).
// Macros such as ucp_dt_make_contig and UCS_PTR_IS_PTR stay macros.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

#include "src/common/status.h"

#define SQUALL_UCX_ENTRY_POINTS(X)  \
  X(ucs_status_string)              \
  X(ucp_config_read)                \
  X(ucp_config_modify)              \
  X(ucp_config_release)             \
  X(ucp_init_version)               \
  X(ucp_cleanup)                    \
  X(ucp_worker_create)              \
  X(ucp_worker_destroy)             \
  X(ucp_worker_get_efd)             \
  X(ucp_worker_arm)                 \
  X(ucp_worker_progress)            \
  X(ucp_worker_get_address)         \
  X(ucp_worker_release_address)     \
  X(ucp_worker_set_am_recv_handler) \
  X(ucp_listener_create)            \
  X(ucp_listener_query)             \
  X(ucp_listener_reject)            \
  X(ucp_listener_destroy)           \
  X(ucp_ep_create)                  \
  X(ucp_ep_close_nbx)               \
  X(ucp_request_check_status)       \
  X(ucp_request_cancel)             \
  X(ucp_request_free)               \
  X(ucp_tag_send_nbx)               \
  X(ucp_tag_probe_nb)               \
  X(ucp_tag_msg_recv_nbx)           \
  X(ucp_am_send_nbx)

namespace squall::transport {

struct UcxApi {
// The argument names a member, which parentheses would not declare.
#define SQUALL_UCX_ENTRY(name) \
  decltype(&::name) name = nullptr;  // NOLINT(bugprone-macro-parentheses)
  SQUALL_UCX_ENTRY_POINTS(SQUALL_UCX_ENTRY)
#undef SQUALL_UCX_ENTRY

  // ucp_init, with the API version of the headers Squall was built against.
  ucs_status_t init(const ucp_params_t* params, const ucp_config_t* config,
                    ucp_context_h* context) const {
    return ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context);
  }
};

// The table, resolved on the first call (thread-safe; the outcome, success or
// not, is kept for the life of the process). nullptr when UCX cannot be
// loaded; then *why, when given, says what is missing and how to get it.
// Nothing is logged: a caller that can do without UCX decides what to say.
const UcxApi* findUcx(std::string* why = nullptr);

// For callers that need UCX: kOk once the table is there; otherwise
// kUnsupported, described (logged, last error) with findUcx's reason,
// `prefix` in front ("" or e.g. "NET/Squall: ") and `otherwise` after it
// (what else the user can do, e.g. "or set SQUALL_TRANSPORT=tcp").
Status requireUcx(const char* prefix, const char* otherwise);

// The table after findUcx or requireUcx succeeded: whatever holds a UCX
// object was made after that, so every call on one goes through here.
const UcxApi& ucx();

}  // namespace squall::transport
