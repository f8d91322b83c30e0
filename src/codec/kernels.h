// The per-implementation kernel table. Kernels see payloads only: the header
// has been written or validated, sizes checked and pointers non-null by the
// time they run (codec.cc does that once, for every implementation).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/codec/wire.h"

namespace squall::codec {

struct EncodeJob {
  const void* input;  // `count` elements of `dtype`, any alignment
  DType dtype;
  size_t count;
  Spec spec;
  Layout layout;
  const float* residualIn;  // nullptr: no error feedback
  float* residualOut;       // written for every element when residualIn is set
  uint8_t* payload;         // layout.payloadBytes, 8-byte aligned not required
  bool stream = false;      // residualOut may bypass the caches (streamStores)
};

struct DecodeJob {
  const uint8_t* payload;
  size_t count;
  Spec spec;
  Layout layout;
  float* output;        // overwritten, or added to (accumulate)
  bool stream = false;  // a plain decode may write output past the caches (streamStores)
};

// Whether a kernel writes its fp32 output with non-temporal (streaming)
// stores: asked for by the caller, for a buffer far larger than the caches
// whose lines are not read again soon, and only where `p` is 64-byte aligned
// (a whole cache line per 16 floats). A streaming store skips the read of
// the line a cached store makes before overwriting it (read-for-ownership),
// so a write costs its bytes once instead of twice. The values stored are
// the same either way; kernels that stream end with a store fence. Static,
// like numeric.h's helpers: the -mavx2 / -mavx512f files call it, and a
// shared out-of-line copy built there could be linked into scalar callers.
static inline bool streamStores(bool asked, const float* p) {
  return asked && (reinterpret_cast<uintptr_t>(p) & 63u) == 0;
}

// Returns true when every block was finite. When it returns false the caller
// must not commit residualOut (the non-finite rule).
using EncodeFn = bool (*)(const EncodeJob&);
using DecodeFn = void (*)(const DecodeJob&);
// The divided sum of n decodes of the same elements: output[i] = d_0[i] +
// d_1[i] + ... + d_{n-1}[i], added in that order, then divided by `divisor`
// when it is above 1, exactly as divideAll does. jobs[j] decodes encoding j;
// every job has the same count, spec and layout, and jobs[0].output and
// jobs[0].stream say where and how to store. The bits are those of decode,
// then accumulate for j = 1..n-1, then divideAll, in registers.
using SumFn = void (*)(const DecodeJob* jobs, size_t n, int divisor);
// The most encodings a SumFn takes (its per-encoding block values live in
// registers and on its stack); parallel.cc sums more tile by tile.
constexpr size_t kMaxSumEncodings = 64;

struct CodecKernels {
  EncodeFn encode;
  DecodeFn decode;
  DecodeFn accumulate;
  SumFn sum = nullptr;  // nullptr: parallel.cc sums tile by tile with decode and accumulate
};

// A bf16 residual's conversions (parallel.h, Bf16Residual): to[i] = the
// bf16 from[i] widened to fp32 (exact), and from[i] rounded to the nearest
// bf16, ties to even, a NaN quietened (numeric.h's floatToBf16). Integer
// operations only, so every implementation gives the same bits.
using WidenFn = void (*)(const uint16_t* from, float* to, size_t n);
using NarrowFn = void (*)(const float* from, uint16_t* to, size_t n);

// The loops every implementation compiles with its own instructions.
// Static, as streamStores above.
static inline void widenBf16Loop(const uint16_t* from, float* to, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(from[i]) << 16;
    __builtin_memcpy(to + i, &bits, 4);
  }
}
static inline void narrowBf16Loop(const float* from, uint16_t* to, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    __builtin_memcpy(&u, from + i, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x0040u;
    to[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

struct KernelTable {
  const char* name;  // "scalar", "avx2", "avx512"
  CodecKernels codecs[kNumCodecs];
  WidenFn widenBf16;
  NarrowFn narrowToBf16;
};

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const KernelTable& scalarKernels();
// These exist only on x86-64 builds; the dispatcher asks the CPU first.
const KernelTable& avx2Kernels();
const KernelTable& avx512Kernels();

// Whether `isa` can run here (CPU support and built in).
bool isaAvailable(Isa isa);
const KernelTable& kernelsFor(Isa isa);
// The table in use: SQUALL_CODEC_ISA's, else the fastest measured
// (calibrate.h), chosen once per process.
const KernelTable& activeKernels();

}  // namespace squall::codec
