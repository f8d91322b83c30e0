// What the plugin benchmarks (nccl_net_bench, nccl_collnet_bench) share on
// top of their control channel: the logger they hand the plugin (warnings
// and errors only, so a timed run prints nothing) and the check that ends the
// benchmark when a plugin call fails.
#pragma once

#include <cstdarg>
#include <cstdio>

#include "perf/bench_control.h"
#include "plugin/nccl/abi/net_abi.h"

namespace squall::bench {

inline void pluginLogger(nccl_abi::LogLevel level, unsigned long, const char*, int,
                         const char* format, ...) {
  if (level > nccl_abi::kLogWarn) return;
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
}

}  // namespace squall::bench

// A plugin call that does not return ncclSuccess ends the benchmark, naming it.
#define SQUALL_BENCH_OK(expr)                                                      \
  do {                                                                             \
    if ((expr) != squall::nccl_abi::kSuccess) squall::bench::die(#expr " failed"); \
  } while (0)
