// Runs a cleanup when the scope ends, so an early return (an ASSERT, a failed
// step) leaks no stream or buffer. Shared by the GPU and emulation tests.
#pragma once

namespace squall::testing {

template <typename F>
struct AtExit {
  F release;
  ~AtExit() { release(); }
};
template <typename F>
AtExit(F) -> AtExit<F>;

}  // namespace squall::testing
