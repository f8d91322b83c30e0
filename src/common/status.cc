#include "src/common/status.h"

#include <cstdio>

namespace squall {
namespace {
thread_local std::string tLastError;
}

const char* statusName(Status status) {
  switch (status) {
    case Status::kOk: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kInvalidUsage: return "invalid usage";
    case Status::kUnsupported: return "unsupported";
    case Status::kOutOfMemory: return "out of memory";
    case Status::kCorruptData: return "corrupt data";
    case Status::kSystemError: return "system error";
    case Status::kRemoteError: return "remote error";
    case Status::kTimeout: return "timeout";
    case Status::kInternal: return "internal error";
    case Status::kInProgress: return "in progress";
  }
  return "unknown result code";
}

Status fail(Status status, Subsys subsys, const char* file, int line, const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  tLastError = message;
  if (log_detail::enabled(LogLevel::kWarn, subsys))
    log_detail::write(LogLevel::kWarn, subsys, file, line, "%s: %s", statusName(status), message);
  return status;
}

const std::string& lastError() { return tLastError; }

void clearLastError() { tLastError.clear(); }

void setLastError(const std::string& message) { tLastError = message; }

}  // namespace squall
