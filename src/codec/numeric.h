// Scalar building blocks shared by every codec implementation: the CPU
// reference, the SIMD kernels (for their tails) and the CUDA kernels. Keeping
// one definition is what makes their bytes identical.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SQUALL_HD __host__ __device__ __forceinline__
#else
// Internal linkage on the host: these headers are compiled into the scalar
// code and into the -mavx2 / -mavx512f kernel files. With plain `inline`, the
// linker keeps one out-of-line copy (debug builds do not inline), which could
// be the AVX-512 one, called from scalar code on a CPU without AVX-512.
#define SQUALL_HD static inline
#endif

namespace squall::codec {

// The one rule for an average's division by n, on which its bytes depend
// (codec::divideAll, the SIMD register sums, the hierarchical allreduce's host
// sum): a product with the inverse where that is exact (n a power of two),
// else a division.
SQUALL_HD bool divideByProduct(int n) { return n > 0 && (n & (n - 1)) == 0; }

SQUALL_HD uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

SQUALL_HD float bitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

SQUALL_HD bool isFinite(float f) { return (floatBits(f) & 0x7f800000u) != 0x7f800000u; }

SQUALL_HD float absf(float f) { return bitsFloat(floatBits(f) & 0x7fffffffu); }

SQUALL_HD float bf16ToFloat(uint16_t h) { return bitsFloat(static_cast<uint32_t>(h) << 16); }

// What a scale that is not finite is stored as: one quiet NaN, so the bytes of
// a non-finite block do not depend on which NaN or infinity the lanes summed.
constexpr uint32_t kCanonicalNanBits = 0x7fc00000u;

SQUALL_HD float canonicalScale(float s) { return isFinite(s) ? s : bitsFloat(kCanonicalNanBits); }

// Round to nearest even; a NaN stays a NaN (quietened, sign and top payload kept).
SQUALL_HD uint16_t floatToBf16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

SQUALL_HD float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) {  // infinity, or a NaN, quietened as the F16C instructions do
    return bitsFloat(sign | 0x7f800000u | (mant != 0 ? 0x400000u : 0u) | (mant << 13));
  }
  if (exp == 0) {
    if (mant == 0) return bitsFloat(sign);
    // Subnormal half: renormalise.
    exp = 113;  // 127 - 15 + 1
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3ffu;
    return bitsFloat(sign | (exp << 23) | (mant << 13));
  }
  return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even, overflow to infinity; NaNs are quietened and keep the
// top of their payload, exactly as the x86 F16C instruction does.
SQUALL_HD uint16_t floatToHalf(float f) {
  const uint32_t u = floatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absBits = u & 0x7fffffffu;
  if (absBits > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u | ((absBits >> 13) & 0x3ffu));
  if (absBits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absBits < 0x38800000u) {
    // Result is subnormal or zero: shift the full mantissa into place, RNE.
    if (absBits < 0x33000000u) return sign;  // below half of the smallest subnormal
    const uint32_t exp = absBits >> 23;
    const uint32_t mant = (absBits & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t result = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t v = absBits - 0x38000000u;  // rebias 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

// The canonical summation order for a block's scale. Element i of a block goes
// to lane i % 32; each lane sums its elements in index order; then lanes are
// folded as lane[j] += lane[j + w] for w = 16, 8, 4, 2, 1. The AVX2 kernel
// keeps the 32 lanes in four registers, AVX-512 in two, a CUDA warp in its 32
// threads with shuffle-down; all three reproduce this order exactly.
constexpr int kLanes = 32;

SQUALL_HD float foldLanes(float* lanes) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lanes[j] = lanes[j] + lanes[j + w];
  return lanes[0];
}

// Rounds to the nearest integer, ties to even, for |x| < 2^22 (the int8 range).
SQUALL_HD float roundEven(float x) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const float ax = absf(x);
  if (!(ax < 4194304.0f)) return x;
  float r = (ax + magic) - magic;
  return bitsFloat(floatBits(r) | (floatBits(x) & 0x80000000u));
}

}  // namespace squall::codec
