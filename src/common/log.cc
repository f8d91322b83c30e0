#include "src/common/log.h"

#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

#include "src/common/params.h"

namespace squall {
namespace log_detail {

std::atomic<int> gLevel{-1};
std::atomic<uint32_t> gMask{static_cast<uint32_t>(Subsys::kAll)};

namespace {

struct SubsysName {
  Subsys subsys;
  const char* name;
};
constexpr SubsysName kSubsysNames[] = {
    {Subsys::kInit, "INIT"},
    {Subsys::kCodec, "CODEC"},
    {Subsys::kTransport, "TRANSPORT"},
    {Subsys::kBootstrap, "BOOTSTRAP"},
    {Subsys::kColl, "COLL"},
    {Subsys::kOptim, "OPTIM"},
    {Subsys::kApi, "API"},
    {Subsys::kCuda, "CUDA"},
    {Subsys::kEnv, "ENV"},
    {Subsys::kAll, "ALL"},
};

std::mutex gMutex;
std::atomic<LogSink> gSink{nullptr};
FILE* gFile = nullptr;  // guarded by gMutex; nullptr means stderr
char gHost[64] = "?";

LogLevel parseLevel(const std::string& text, bool* ok) {
  *ok = true;
  if (strcasecmp(text.c_str(), "NONE") == 0) return LogLevel::kNone;
  if (strcasecmp(text.c_str(), "WARN") == 0) return LogLevel::kWarn;
  if (strcasecmp(text.c_str(), "INFO") == 0) return LogLevel::kInfo;
  if (strcasecmp(text.c_str(), "TRACE") == 0) return LogLevel::kTrace;
  *ok = false;
  return LogLevel::kWarn;
}

uint32_t parseMask(std::string text, std::string* unknown) {
  bool exclude = !text.empty() && text[0] == '^';
  if (exclude) text.erase(0, 1);
  uint32_t mask = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(start, end - start);
    if (!word.empty()) {
      bool found = false;
      for (const SubsysName& s : kSubsysNames) {
        if (strcasecmp(word.c_str(), s.name) == 0) {
          mask |= static_cast<uint32_t>(s.subsys);
          found = true;
        }
      }
      if (!found) *unknown += (unknown->empty() ? "" : ",") + word;
    }
    start = end + 1;
  }
  return exclude ? ~mask : mask;
}

std::string expandPath(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[++i];
      if (c == 'h')
        out += gHost;
      else if (c == 'p')
        out += std::to_string(getpid());
      else
        out += c;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// Must not log through SQUALL_WARN (it would recurse into init); problems are
// written directly once the configuration is in place.
void configure() {
  gethostname(gHost, sizeof(gHost) - 1);
  bool levelOk = true;
  std::string levelText = paramString(Param::kDebug);
  LogLevel level = parseLevel(levelText, &levelOk);
  std::string unknown;
  uint32_t mask = parseMask(paramString(Param::kDebugSubsys), &unknown);
  std::string path = paramString(Param::kDebugFile);
  std::string fileError;
  if (gFile != nullptr) {
    fclose(gFile);
    gFile = nullptr;
  }
  if (!path.empty()) {
    std::string expanded = expandPath(path);
    gFile = fopen(expanded.c_str(), "a");
    if (gFile == nullptr) fileError = expanded + ": " + strerror(errno);
  }
  gMask.store(mask, std::memory_order_relaxed);
  gLevel.store(static_cast<int>(level), std::memory_order_release);
  FILE* out = gFile != nullptr ? gFile : stderr;
  if (!levelOk)
    fprintf(out,
            "%s:%d [squall] WARN ENV SQUALL_DEBUG=\"%s\" is not NONE, WARN, INFO or TRACE; using "
            "WARN\n",
            gHost, getpid(), levelText.c_str());
  if (!unknown.empty())
    fprintf(out, "%s:%d [squall] WARN ENV SQUALL_DEBUG_SUBSYS names unknown subsystems: %s\n",
            gHost, getpid(), unknown.c_str());
  if (!fileError.empty())
    fprintf(stderr, "%s:%d [squall] WARN ENV cannot open SQUALL_DEBUG_FILE %s; logging to stderr\n",
            gHost, getpid(), fileError.c_str());
}

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kNone: break;
  }
  return "";
}

}  // namespace

void init() {
  std::lock_guard<std::mutex> lock(gMutex);
  if (gLevel.load(std::memory_order_acquire) < 0) configure();
}

void write(LogLevel level, Subsys subsys, const char* file, int line, const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  const char* base = strrchr(file, '/');
  base = base != nullptr ? base + 1 : file;
  if (LogSink sink = gSink.load(std::memory_order_acquire)) {
    sink(level, subsys, base, line, message);
    return;
  }
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  std::lock_guard<std::mutex> lock(gMutex);
  FILE* out = gFile != nullptr ? gFile : stderr;
  fprintf(out, "%s:%d:%ld [squall] %s %s %s:%d %s\n", gHost, getpid(),
          static_cast<long>(syscall(SYS_gettid)), levelName(level), subsysName(subsys), base, line,
          message);
  fflush(out);
}

}  // namespace log_detail

const char* subsysName(Subsys subsys) {
  for (const auto& s : log_detail::kSubsysNames)
    if (s.subsys == subsys) return s.name;
  return "?";
}

void setLogSink(LogSink sink) { log_detail::gSink.store(sink, std::memory_order_release); }

void reloadLogConfig() {
  std::lock_guard<std::mutex> lock(log_detail::gMutex);
  log_detail::configure();
}

}  // namespace squall
