// Chooses the kernel table once per process: SQUALL_CODEC_ISA when it names
// one, else the fastest the CPU supports as measured (calibrate.h).
#include "src/codec/calibrate.h"
#include "src/codec/kernels.h"
#include "src/common/cpu.h"
#include "src/common/log.h"

namespace squall::codec {

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
  static const KernelTable& table = []() -> const KernelTable& {
    const Calibration& c = processCalibration();
    SQUALL_INFO(Subsys::kCodec, "codec implementation: %s (%s%s%s)", kernelsFor(c.chosen).name,
                c.source.c_str(), c.reason.empty() ? "" : ": ", c.reason.c_str());
    if (c.costSeconds > 0)
      SQUALL_INFO(Subsys::kCodec, "codec calibration took %.1f ms", c.costSeconds * 1e3);
    return kernelsFor(c.chosen);
  }();
  return table;
}

}  // namespace squall::codec
