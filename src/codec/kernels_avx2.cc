// Placeholder until the AVX2 kernels land: the scalar reference.
#include "src/codec/kernels.h"

namespace squall::codec {
const KernelTable& avx2Kernels() { return scalarKernels(); }
}  // namespace squall::codec
