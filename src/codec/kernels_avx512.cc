// Placeholder until the AVX-512 kernels land: the scalar reference.
#include "src/codec/kernels.h"

namespace squall::codec {
const KernelTable& avx512Kernels() { return scalarKernels(); }
}  // namespace squall::codec
