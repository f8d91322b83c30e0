// What the plugin benchmarks (nccl_net_bench, nccl_collnet_bench) share on
// top of their control channel: the logger they hand the plugin (warnings
// and errors only, so a timed run prints nothing), the check that ends the
// benchmark when a plugin call fails, and the time of every single call.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

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

// The duration of every plugin call of one kind (isend, test, ...). NCCL's
// proxy progresses every channel between two calls, so one slow call stalls
// all of them: the maximum and the calls over kSlowNs matter, not the mean.
class CallTimes {
 public:
  static constexpr double kSlowNs = 500e3;  // 0.5 ms
  // Also the calling thread's CPU time per call (--cpu-times 1), which tells
  // a call that worked long from one that was preempted on a busy machine.
  // Off by default: it is two system calls per call.
  static inline bool cpuToo = false;

  // Runs `call` (a plugin call returning its result), timing it. Both clocks
  // are read before either sample is stored: growing the sample vectors
  // (hundreds of thousands of `test` calls) copies and faults in megabytes,
  // which would otherwise be counted as the call's CPU time.
  template <typename F>
  auto time(F&& call) {
    timespec cpu0{}, cpu1{};
    if (cpuToo) clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
    const auto start = std::chrono::steady_clock::now();
    auto result = call();
    const auto end = std::chrono::steady_clock::now();
    if (cpuToo) clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
    ns_.push_back(
        static_cast<float>(std::chrono::duration<double, std::nano>(end - start).count()));
    if (cpuToo) {
      cpuNs_.push_back(static_cast<float>((cpu1.tv_sec - cpu0.tv_sec) * 1e9 +
                                          static_cast<double>(cpu1.tv_nsec - cpu0.tv_nsec)));
    }
    return result;
  }

  // Adds another thread's samples to these.
  void absorb(const CallTimes& other) {
    ns_.insert(ns_.end(), other.ns_.begin(), other.ns_.end());
    cpuNs_.insert(cpuNs_.end(), other.cpuNs_.begin(), other.cpuNs_.end());
  }

  // Fixed-size digest, sent between ranks as bytes.
  struct Summary {
    double count = 0, medianUs = 0, p99Us = 0, maxUs = 0, slow = 0;
    double cpuMaxUs = -1, cpuSlow = -1;  // -1: not measured
  };
  Summary summary() const {
    Summary s;
    if (!cpuNs_.empty()) {
      s.cpuMaxUs = *std::max_element(cpuNs_.begin(), cpuNs_.end()) / 1e3;
      s.cpuSlow = static_cast<double>(
          std::count_if(cpuNs_.begin(), cpuNs_.end(), [](float v) { return v > kSlowNs; }));
    }
    if (ns_.empty()) return s;
    std::vector<float> v = ns_;
    std::sort(v.begin(), v.end());
    s.count = static_cast<double>(v.size());
    s.medianUs = v[v.size() / 2] / 1e3;
    s.p99Us = v[std::min(v.size() - 1, v.size() * 99 / 100)] / 1e3;
    s.maxUs = v.back() / 1e3;
    s.slow = static_cast<double>(v.end() - std::upper_bound(v.begin(), v.end(), kSlowNs));
    return s;
  }

 private:
  std::vector<float> ns_;
  std::vector<float> cpuNs_;
};

// Appends one JSON member, "name": {"count": ..., "median_us": ..., ...},
// with a comma before it unless it is the first.
inline void callJson(std::string* json, const char* name, const CallTimes::Summary& s) {
  char text[320];
  int n = std::snprintf(text, sizeof(text),
                        "\"%s\": {\"count\": %.0f, \"median_us\": %.1f, \"p99_us\": %.1f, "
                        "\"max_us\": %.1f, \"over_500us\": %.0f",
                        name, s.count, s.medianUs, s.p99Us, s.maxUs, s.slow);
  if (s.cpuMaxUs >= 0)
    std::snprintf(text + n, sizeof(text) - static_cast<size_t>(n),
                  ", \"cpu_max_us\": %.1f, \"cpu_over_500us\": %.0f", s.cpuMaxUs, s.cpuSlow);
  std::strncat(text, "}", sizeof(text) - std::strlen(text) - 1);
  if (!json->empty()) json->append(", ");
  json->append(text);
}

// The same as a line for people, on stderr.
inline void callLine(const char* name, const CallTimes::Summary& s) {
  std::fprintf(stderr,
               "%-15s %9.0f calls  median %7.1f us  p99 %7.1f us  max %8.1f us  %4.0f over 0.5 ms",
               name, s.count, s.medianUs, s.p99Us, s.maxUs, s.slow);
  if (s.cpuMaxUs >= 0)
    std::fprintf(stderr, "  (cpu: max %8.1f us, %4.0f over)", s.cpuMaxUs, s.cpuSlow);
  std::fputc('\n', stderr);
}

}  // namespace squall::bench

// A plugin call that does not return ncclSuccess ends the benchmark, naming it.
#define SQUALL_BENCH_OK(expr)                                                      \
  do {                                                                             \
    if ((expr) != squall::nccl_abi::kSuccess) squall::bench::die(#expr " failed"); \
  } while (0)
