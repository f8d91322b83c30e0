#include "src/common/params.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "src/common/log.h"

namespace squall {
namespace {

constexpr ParamInfo kParams[] = {
#define SQUALL_PARAM(id, name, type, def, doc) {name, def, doc, Param::k##id, ParamType::type},
#include "src/common/params.def"
#undef SQUALL_PARAM
};

const char* typeName(ParamType type) {
  switch (type) {
    case ParamType::kString: return "string";
    case ParamType::kInt: return "integer";
    case ParamType::kBool: return "boolean";
    case ParamType::kFloat: return "number";
  }
  return "?";
}

// Each malformed variable is reported once per process, not on every read.
void warnMalformed(const ParamInfo& info, const char* value) {
  static std::mutex mutex;
  static std::set<std::string> reported;
  std::lock_guard<std::mutex> lock(mutex);
  if (!reported.insert(info.name).second) return;
  SQUALL_WARN(Subsys::kEnv, "%s=\"%s\" is not a valid %s; using the default \"%s\"", info.name,
              value, typeName(info.type), info.defaultValue);
}

// The value from the environment, or nullptr when unset or empty.
const char* rawValue(const ParamInfo& info) {
  const char* value = std::getenv(info.name);
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

bool parseInt(const char* text, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = v;
  return true;
}

bool parseBool(const char* text, bool* out) {
  static const char* const kTrue[] = {"1", "true", "yes", "on"};
  static const char* const kFalse[] = {"0", "false", "no", "off"};
  for (const char* t : kTrue)
    if (strcasecmp(text, t) == 0) return *out = true, true;
  for (const char* f : kFalse)
    if (strcasecmp(text, f) == 0) return *out = false, true;
  return false;
}

bool parseFloat(const char* text, double* out) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

std::span<const ParamInfo> allParams() { return kParams; }

const ParamInfo& paramInfo(Param param) { return kParams[static_cast<int>(param)]; }

std::string paramString(Param param) {
  const ParamInfo& info = paramInfo(param);
  const char* value = rawValue(info);
  return value != nullptr ? value : info.defaultValue;
}

int64_t paramInt(Param param) {
  const ParamInfo& info = paramInfo(param);
  int64_t v = 0;
  if (const char* value = rawValue(info)) {
    if (parseInt(value, &v)) return v;
    warnMalformed(info, value);
  }
  parseInt(info.defaultValue, &v);
  return v;
}

bool paramBool(Param param) {
  const ParamInfo& info = paramInfo(param);
  bool v = false;
  if (const char* value = rawValue(info)) {
    if (parseBool(value, &v)) return v;
    warnMalformed(info, value);
  }
  parseBool(info.defaultValue, &v);
  return v;
}

double paramFloat(Param param) {
  const ParamInfo& info = paramInfo(param);
  double v = 0;
  if (const char* value = rawValue(info)) {
    if (parseFloat(value, &v)) return v;
    warnMalformed(info, value);
  }
  parseFloat(info.defaultValue, &v);
  return v;
}

std::string paramsMarkdown() {
  std::string out =
      "# Environment variables\n\n"
      "Every variable Squall reads. This page is generated from `src/common/params.def` by\n"
      "`squall_info --params-md`; a test fails when the two disagree. An unset or empty\n"
      "variable takes the default; a value that does not parse is reported once (WARN)\n"
      "and the default is used.\n\n"
      "| variable | type | default | meaning |\n"
      "|---|---|---|---|\n";
  for (const ParamInfo& info : kParams) {
    out += "| `";
    out += info.name;
    out += "` | ";
    out += typeName(info.type);
    out += " | ";
    out += info.defaultValue[0] != '\0' ? std::string("`") + info.defaultValue + "`" : "(unset)";
    out += " | ";
    out += info.doc;
    out += " |\n";
  }
  return out;
}

}  // namespace squall
