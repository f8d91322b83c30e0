// Chooses the kernel table once per process: the best the CPU supports,
// capped by SQUALL_CODEC_ISA (useful to compare implementations or to work
// around a suspected SIMD problem without rebuilding).
#include <strings.h>

#include <string>

#include "src/codec/kernels.h"
#include "src/common/cpu.h"
#include "src/common/params.h"

namespace squall::codec {
namespace {

Isa bestIsa() {
  if (isaAvailable(Isa::kAvx512)) return Isa::kAvx512;
  if (isaAvailable(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa chooseIsa() {
  const std::string wanted = paramString(Param::kCodecIsa);
  Isa cap = Isa::kAvx512;
  if (strcasecmp(wanted.c_str(), "scalar") == 0) {
    cap = Isa::kScalar;
  } else if (strcasecmp(wanted.c_str(), "avx2") == 0) {
    cap = Isa::kAvx2;
  } else if (strcasecmp(wanted.c_str(), "avx512") != 0 && strcasecmp(wanted.c_str(), "auto") != 0) {
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_CODEC_ISA=\"%s\" is not auto, scalar, avx2 or avx512; using auto",
                wanted.c_str());
  }
  const Isa best = bestIsa();
  const Isa chosen = cap < best ? cap : best;
  SQUALL_INFO(Subsys::kCodec, "codec implementation: %s (SQUALL_CODEC_ISA=%s)",
              kernelsFor(chosen).name, wanted.c_str());
  return chosen;
}

}  // namespace

bool isaAvailable(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
#if defined(__x86_64__)
    case Isa::kAvx2: return cpuFeatures().avx2;
    case Isa::kAvx512: return cpuFeatures().avx512;
#else
    default: return false;
#endif
  }
  return false;
}

const KernelTable& kernelsFor(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx512 && isaAvailable(Isa::kAvx512)) return avx512Kernels();
  if (isa >= Isa::kAvx2 && isaAvailable(Isa::kAvx2)) return avx2Kernels();
#endif
  (void)isa;
  return scalarKernels();
}

const KernelTable& activeKernels() {
  static const KernelTable& table = kernelsFor(chooseIsa());
  return table;
}

}  // namespace squall::codec
