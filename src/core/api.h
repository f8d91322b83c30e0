// Helpers for the C API boundary: every exported function runs its body
// through guard(), which clears the thread's last error, turns a C++
// exception into squallInternalError, and converts Status to squallResult_t.
#pragma once

#include <exception>
#include <new>

#include "squall/squall.h"
#include "src/common/status.h"

namespace squall::core {

template <typename Body>
squallResult_t guard(const char* function, Body&& body) noexcept {
  clearLastError();
  try {
    return static_cast<squallResult_t>(body());
  } catch (const std::bad_alloc&) {
    return static_cast<squallResult_t>(
        SQUALL_FAIL(Status::kOutOfMemory, Subsys::kApi, "%s ran out of memory", function));
  } catch (const std::exception& e) {
    return static_cast<squallResult_t>(SQUALL_FAIL(Status::kInternal, Subsys::kApi,
                                                   "%s failed unexpectedly: %s; please report this",
                                                   function, e.what()));
  } catch (...) {
    return static_cast<squallResult_t>(SQUALL_FAIL(
        Status::kInternal, Subsys::kApi, "%s failed unexpectedly; please report this", function));
  }
}

}  // namespace squall::core

#define SQUALL_API_GUARD(body) ::squall::core::guard(__func__, [&]() -> ::squall::Status body)
