// Typed access to the SQUALL_* environment variables declared in params.def.
//
// A value that does not parse is reported once (WARN, subsystem ENV) and the
// default is used instead, so a typo never silently changes behaviour.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace squall {

enum class ParamType { kString, kInt, kBool, kFloat };

enum class Param : int {
#define SQUALL_PARAM(id, name, type, def, doc) k##id,
#include "src/common/params.def"
#undef SQUALL_PARAM
};

// The pointers first, then the two enums: no padding.
struct ParamInfo {
  const char* name;
  const char* defaultValue;
  const char* doc;
  Param id;
  ParamType type;
};

std::span<const ParamInfo> allParams();
const ParamInfo& paramInfo(Param param);

std::string paramString(Param param);
int64_t paramInt(Param param);
bool paramBool(Param param);
double paramFloat(Param param);

// The table as Markdown (the contents of docs/env.md).
std::string paramsMarkdown();

}  // namespace squall
