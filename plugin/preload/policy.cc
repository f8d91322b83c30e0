#include "plugin/preload/policy.h"

#include <iterator>
#include <sstream>

#include "src/common/log.h"
#include "src/common/params.h"
#include "src/core/api.h"

namespace squall::preload {

const char* verdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kCompress: return "compressed";
    case Verdict::kDisabled: return "disabled";
    case Verdict::kType: return "dtype";
    case Verdict::kOp: return "op";
    case Verdict::kSmall: return "small";
    case Verdict::kCommunicator: return "communicator";
    case Verdict::kGroup: return "group";
    case Verdict::kWarmup: return "warmup";
    case Verdict::kLearning: return "step_learning";
    case Verdict::kResidualCap: return "residual_cap";
    case Verdict::kEngine: return "no_engine";
    case Verdict::kReentry: return "reentry";
    case Verdict::kNonBlocking: return "nonblocking";
    case Verdict::kCapture: return "capture";
    case Verdict::kRevoked: return "revoked";
    case Verdict::kSuspended: return "suspended";
    case Verdict::kCollConfig: return "coll_config";
    case Verdict::kCollective: return "collective";
    case Verdict::kCount: break;
  }
  return "?";
}

namespace {

// Parses a comma-separated list against `names`; returns false (and leaves
// `flags` alone) on an unknown entry.
template <size_t N>
bool parseList(const std::string& text, const char* const (&names)[N], bool (&flags)[N]) {
  bool parsed[N] = {};
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    bool known = false;
    for (size_t i = 0; i < N; ++i) {
      if (item == names[i]) parsed[i] = known = true;
    }
    if (!known) return false;
  }
  for (size_t i = 0; i < N; ++i) flags[i] = parsed[i];
  return true;
}

// A compressing code as squallCodecSpecParse reads it (none is not one).
bool parseCodec(const char* text, codec::Spec* out) {
  squallCodecSpec_t parsed;
  return squallCodecSpecParse(text, &parsed) == squallSuccess && parsed.codec != squallCodecNone &&
         core::toCodecSpec(&parsed, out) == Status::kOk;
}

}  // namespace

const char* defaultCodecText() { return paramInfo(Param::kPreloadCodec).defaultValue; }

const codec::Spec& defaultCodec() {
  // params.def's default always parses (preload_logic_test checks it).
  static const codec::Spec spec = [] {
    codec::Spec s;
    parseCodec(defaultCodecText(), &s);
    return s;
  }();
  return spec;
}

std::string specText(const codec::Spec& spec) {
  std::string text = codec::codecName(spec.codec);
  if (codec::usesBlocks(spec.codec)) text += ":block=" + std::to_string(spec.block);
  return text;
}

codec::Spec gatherCodecFor(const codec::Spec& codec) {
  if (codec.codec != codec::CodecId::kInt2 && codec.codec != codec::CodecId::kInt4) return codec;
  codec::Spec wide;
  wide.codec = codec::CodecId::kInt8;
  return wide;
}

Policy Policy::fromEnvironment() {
  Policy p;
  p.enabled = paramBool(Param::kPreloadEnable);
  const std::string codec = paramString(Param::kPreloadCodec);
  codec::Spec spec;
  if (parseCodec(codec.c_str(), &spec)) {
    p.codec = spec;
    p.codecText = codec;
  } else {
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_PRELOAD_CODEC=%s is not int2, int4, int8, onebit, fp16 or bf16 (with "
                "options, e.g. int4:block=256); using the default, %s",
                codec.c_str(), p.codecText.c_str());
  }
  const std::string gather = paramString(Param::kPreloadGatherCodec);
  codec::Spec gatherSpec;
  if (gather == "same") {
    p.gather = p.codec;
  } else if (gather != "auto" && parseCodec(gather.c_str(), &gatherSpec)) {
    p.gather = gatherSpec;
  } else {
    if (gather != "auto") {
      SQUALL_WARN(Subsys::kEnv,
                  "SQUALL_PRELOAD_GATHER_CODEC=%s is not auto, same or a codec such as int8; "
                  "using auto",
                  gather.c_str());
    }
    p.gather = gatherCodecFor(p.codec);
  }
  const int64_t minBytes = paramInt(Param::kPreloadMinBytes);
  p.minBytes = minBytes > 0 ? static_cast<size_t>(minBytes) : 0;
  static const char* const kTypes[] = {"fp32", "fp16", "bf16"};
  if (!parseList(paramString(Param::kPreloadDtypes), kTypes, p.dtypes)) {
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_PRELOAD_DTYPES lists a type other than fp32, fp16, bf16; "
                "using all three");
  }
  static const char* const kOps[] = {"sum", "avg"};
  bool ops[2] = {true, true};
  if (!parseList(paramString(Param::kPreloadOps), kOps, ops)) {
    SQUALL_WARN(Subsys::kEnv, "SQUALL_PRELOAD_OPS lists an op other than sum, avg; using both");
  }
  p.sum = ops[0];
  p.avg = ops[1];
  static const char* const kCollectives[] = {"allreduce", "reduce_scatter", "all_gather"};
  static_assert(std::size(kCollectives) == static_cast<size_t>(Coll::kCount));
  if (!parseList(paramString(Param::kPreloadCollectives), kCollectives, p.collectives)) {
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_PRELOAD_COLLECTIVES lists a collective other than allreduce, "
                "reduce_scatter, all_gather; compressing the default two");
  }
  const std::string gatherCodec = paramString(Param::kPreloadAllGatherCodec);
  codec::Spec gatherCodecSpec;
  if (parseCodec(gatherCodec.c_str(), &gatherCodecSpec)) {
    p.allGather = gatherCodecSpec;
    p.allGatherText = gatherCodec;
  } else {
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_PRELOAD_ALLGATHER_CODEC=%s is not a compressed code (int8, int4, ...); "
                "using %s",
                gatherCodec.c_str(), p.allGatherText.c_str());
  }
  p.warmupCalls = std::max<int64_t>(0, paramInt(Param::kPreloadWarmup));
  p.stepElements = std::max<int64_t>(0, paramInt(Param::kPreloadStepElements));
  p.stepLearnCalls = std::max<int64_t>(2, paramInt(Param::kPreloadStepLearnCalls));
  p.residualCapBytes =
      static_cast<size_t>(std::max<int64_t>(0, paramInt(Param::kPreloadResidualMb))) << 20;
  p.reportPath = paramString(Param::kPreloadReport);
  p.ncclLibrary = paramString(Param::kNcclLibrary);
  return p;
}

const char* collName(Coll coll) {
  return coll == Coll::kReduceScatter ? "reduce_scatter"
         : coll == Coll::kAllGather   ? "all_gather"
                                      : "allreduce";
}

Verdict Policy::judge(const CallFacts& facts, Coll coll) const {
  if (!enabled) return Verdict::kDisabled;
  if (!collectives[static_cast<int>(coll)]) return Verdict::kCollective;
  if (!facts.dtypeKnown) return Verdict::kType;
  const int type = facts.dtype == DataType::kF32    ? 0
                   : facts.dtype == DataType::kF16  ? 1
                   : facts.dtype == DataType::kBf16 ? 2
                                                    : -1;
  if (type < 0 || !dtypes[type]) return Verdict::kType;
  if (!facts.opKnown) return Verdict::kOp;
  if (!(facts.op == ReduceOp::kSum && sum) && !(facts.op == ReduceOp::kAvg && avg))
    return Verdict::kOp;
  if (facts.count == 0 || facts.count * elementBytes(facts.dtype) < minBytes)
    return Verdict::kSmall;
  return Verdict::kCompress;
}

size_t elementBytes(DataType dtype) {
  switch (dtype) {
    case DataType::kF16:
    case DataType::kBf16: return 2;
    case DataType::kF32:
    case DataType::kI32: return 4;
    case DataType::kF64:
    case DataType::kI64: return 8;
  }
  return 1;
}

uint64_t fullPrecisionBytes(size_t count, DataType dtype, int nranks) {
  if (nranks <= 1) return 0;
  const double bytes = static_cast<double>(count) * static_cast<double>(elementBytes(dtype));
  return static_cast<uint64_t>(2.0 * (nranks - 1) / nranks * bytes);
}

}  // namespace squall::preload
