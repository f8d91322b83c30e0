// Helpers for the C API boundary: every exported function runs its body
// through guard(), which clears the thread's last error, turns a C++
// exception into squallInternalError, and converts Status to squallResult_t.
#pragma once

#include <cstring>
#include <exception>
#include <new>

#include "squall/squall.h"
#include "src/common/status.h"

namespace squall::codec {
struct Spec;
}

namespace squall::core {

// The numeric value of an enum the caller filled in. Read through memcpy: a C
// caller may store any int in it, and loading an out-of-range value as the
// C++ enum type would be undefined behaviour. Helpers therefore take such
// enums by reference and read them only through this function.
template <typename Enum>
int rawEnum(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

// Checks a caller's codec spec and converts it.
Status toCodecSpec(const squallCodecSpec_t* in, codec::Spec* out);

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

#define SQUALL_API_GUARD(...) ::squall::core::guard(__func__, [&]() -> ::squall::Status __VA_ARGS__)
