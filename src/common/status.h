// Status codes and the check macros used everywhere below the C API.
//
// The rule: an error is described once, where it is first detected, with a
// sentence that says what went wrong and what to do. SQUALL_FAIL records that
// sentence as the thread's last error and logs it; callers further up only
// propagate the code (SQUALL_TRY), so the first cause is never overwritten.
#pragma once

#include <cstdarg>
#include <string>

#include "src/common/log.h"

namespace squall {

// Numerically identical to the public squallResult_t.
enum class Status : int {
  kOk = 0,
  kInvalidArgument = 1,
  kInvalidUsage = 2,
  kUnsupported = 3,
  kOutOfMemory = 4,
  kCorruptData = 5,
  kSystemError = 6,
  kRemoteError = 7,
  kTimeout = 8,
  kInternal = 9,
  kInProgress = 10,
};

const char* statusName(Status status);

// Records `message` as this thread's last error, logs it at WARN under
// `subsys` with the source location, and returns `status`.
[[gnu::format(printf, 5, 6)]] Status fail(Status status, Subsys subsys, const char* file, int line,
                                          const char* format, ...);

const std::string& lastError();
void clearLastError();
// Carries a failure described on another thread over to this one.
void setLastError(const std::string& message);

}  // namespace squall

// Yields `status` itself rather than fail()'s return value, so that static
// analysis (which cannot see into the out-of-line fail()) knows the result is
// the failure passed in. `status` must be free of side effects: it is
// evaluated twice.
#define SQUALL_FAIL(status, subsys, ...) \
  (static_cast<void>(::squall::fail((status), (subsys), __FILE__, __LINE__, __VA_ARGS__)), (status))

// Returns a failure from the enclosing function when `cond` is false.
#define SQUALL_REQUIRE(cond, status, subsys, ...)          \
  do {                                                     \
    if (__builtin_expect(!(cond), 0)) {                    \
      return SQUALL_FAIL((status), (subsys), __VA_ARGS__); \
    }                                                      \
  } while (0)

// Propagates a failure from a call that has already described it.
#define SQUALL_TRY(expr)                                                    \
  do {                                                                      \
    ::squall::Status squall_try_status_ = (expr);                           \
    if (__builtin_expect(squall_try_status_ != ::squall::Status::kOk, 0)) { \
      SQUALL_TRACE(::squall::Subsys::kAll, "propagating %s from %s",        \
                   ::squall::statusName(squall_try_status_), #expr);        \
      return squall_try_status_;                                            \
    }                                                                       \
  } while (0)
