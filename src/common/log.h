// Logging with levels (SQUALL_DEBUG) and subsystems (SQUALL_DEBUG_SUBSYS).
//
//   SQUALL_DEBUG=NONE|WARN|INFO|TRACE          (default WARN)
//   SQUALL_DEBUG_SUBSYS=INIT,CODEC,COLL,...    (default ALL; ^CODEC excludes)
//   SQUALL_DEBUG_FILE=/tmp/squall.%h.%p.log    (%h host, %p pid; default stderr)
//
// A disabled message costs one relaxed load and a branch.
#pragma once

#include <atomic>
#include <cstdint>

namespace squall {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

enum class Subsys : uint32_t {
  kInit = 1u << 0,
  kCodec = 1u << 1,
  kTransport = 1u << 2,
  kBootstrap = 1u << 3,
  kColl = 1u << 4,
  kOptim = 1u << 5,
  kApi = 1u << 6,
  kCuda = 1u << 7,
  kEnv = 1u << 8,
  kAll = ~0u,
};

namespace log_detail {
extern std::atomic<int> gLevel;  // -1 until the environment has been read
extern std::atomic<uint32_t> gMask;
void init();
inline bool enabled(LogLevel level, Subsys subsys) {
  int current = gLevel.load(std::memory_order_relaxed);
  if (current < 0) {
    init();
    current = gLevel.load(std::memory_order_relaxed);
  }
  return static_cast<int>(level) <= current &&
         (gMask.load(std::memory_order_relaxed) & static_cast<uint32_t>(subsys)) != 0;
}
[[gnu::format(printf, 5, 6)]] void write(LogLevel level, Subsys subsys, const char* file, int line,
                                         const char* format, ...);
}  // namespace log_detail

const char* subsysName(Subsys subsys);

// Re-reads SQUALL_DEBUG* (tests change them at run time).
void reloadLogConfig();

// Where enabled messages go instead of stderr / SQUALL_DEBUG_FILE: a host
// library's own logger (the NCCL plugin hands them to NCCL's). SQUALL_DEBUG
// and SQUALL_DEBUG_SUBSYS still decide which messages are produced. nullptr
// restores the default. `message` is formatted, without a trailing newline.
using LogSink = void (*)(LogLevel level, Subsys subsys, const char* file, int line,
                         const char* message);
void setLogSink(LogSink sink);

}  // namespace squall

#define SQUALL_LOG_AT(level, subsys, ...)                                              \
  do {                                                                                 \
    if (::squall::log_detail::enabled((level), (subsys)))                              \
      ::squall::log_detail::write((level), (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define SQUALL_WARN(subsys, ...) SQUALL_LOG_AT(::squall::LogLevel::kWarn, subsys, __VA_ARGS__)
#define SQUALL_INFO(subsys, ...) SQUALL_LOG_AT(::squall::LogLevel::kInfo, subsys, __VA_ARGS__)
#define SQUALL_TRACE(subsys, ...) SQUALL_LOG_AT(::squall::LogLevel::kTrace, subsys, __VA_ARGS__)
