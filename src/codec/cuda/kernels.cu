// CUDA kernels for every codec, and the host wrappers declared in
// cuda_codec.h. The scalar reference (kernels_scalar.cc) is the oracle: these
// kernels produce the same bytes, residuals and decoded floats.
//
// Algorithms:
//   onebit encode  one warp per block of the codec. Thread t adds |z| (or z*z,
//                  rounded, for rms) of elements t, t+32, t+64, ... in index
//                  order: coalesced loads and exactly the per-lane sums of
//                  numeric.h's canonical order. __shfl_down_sync with offsets
//                  16, 8, 4, 2, 1 then performs foldLanes' lane[j] += lane[j+w].
//                  s = sum / n (IEEE division), sqrt for rms. A second walk of
//                  the block (an L1/L2 hit, not DRAM) sets bit = z >= 0 with
//                  two ballots per 64-bit word (low ballot = elements 0..31 of
//                  the word) and writes residual z - (bit ? s : -s).
//   int2/int4/int8 one warp per block: max |z| and finiteness by shuffles
//   encode         (max is exact, so order does not matter), s = max / L
//                  (L = 1, 7, 127) or NaN, then q = clamp(roundEven(z / s),
//                  -L, L), residual z - q*s. A thread takes whole bytes (the
//                  2 int4 or 4 int2 consecutive elements of one byte, 1 for
//                  int8), so it packs its codes in a register and writes each
//                  byte once. Blocks of at most 2048 elements use the onebit
//                  segment layout in bytes, one read of the data; int2 in
//                  blocks of 64 (16 bytes) reduces each half-warp as a block.
//   none/fp16/bf16 one thread per element (grid-stride), residual z - decoded.
//   decode         one thread per element (grid-stride), every block first
//                  checking the header against the caller's expectation;
//                  onebit can also flag a non-finite output from its scales,
//                  once per codec block.
//   onebit serve   the server step of the two-phase allreduce in one kernel:
//                  one warp per block as in the onebit encode, with z = (sum
//                  of the n pieces' decoded values, in rank order, / n for
//                  avg) + server residual, recomputed from the pieces on the
//                  second walk; the same bits as decode, decode-accumulate,
//                  divide and encode, with no accumulator.
//   commit         one thread flips the current residual buffer unless the
//                  encode raised the non-finite flag.
// The thread block (CTA) 0 of every encode also writes the header and the zero
// padding, so an encode is one kernel launch (plus the commit).
//
// Rounding: this file is compiled with --fmad=false, and the arithmetic that
// matters is spelled with __fadd_rn / __fmul_rn / __fdiv_rn / __fsqrt_rn so
// that no compiler flag can contract or approximate it.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <new>

#include "src/codec/codec.h"
#include "src/codec/cuda/cuda_codec.h"
#include "src/codec/numeric.h"
#include "src/common/cuda_status.h"

namespace squall::codec {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kWarpsPerCta = kThreads / 32;
constexpr uint32_t kNanBits = 0x7fc00000u;
constexpr int kUnroll = 4;  // elements per thread per step of the element-wise kernels
#if defined(SQUALL_CUDA_EMULATION)
constexpr size_t kMaxGrid = 2;  // the CPU emulation exercises the grid-stride loops
#else
constexpr size_t kMaxGrid = size_t{1} << 20;
#endif                                       // element kernels grid-stride beyond this
constexpr size_t kMaxWarpGrid = 0x7fffffff;  // warp kernels do not (checked on the host)

enum class Fmt { kF32, kF16, kBf16 };

// ---- device helpers -------------------------------------------------------

// Raises a flag that many threads may raise at once. Concurrent stores of one
// value are harmless on the GPU, but they are a data race in C++ terms, and
// the CPU emulation runs this code as C++ on OS threads (under
// ThreadSanitizer too); the exchange costs nothing in the common case, which
// never raises the flag.
__device__ __forceinline__ void raiseFlag(int* flag) { atomicExch(flag, 1); }

template <DType D>
__device__ __forceinline__ float loadX(const void* input, size_t i) {
  if constexpr (D == DType::kF32) {
    return static_cast<const float*>(input)[i];
  } else if constexpr (D == DType::kF16) {
    return halfToFloat(static_cast<const uint16_t*>(input)[i]);
  } else {
    return bf16ToFloat(static_cast<const uint16_t*>(input)[i]);
  }
}

// z = x + e; without error feedback z = x (0 is not added: -0 stays -0).
template <DType D, bool kRes>
__device__ __forceinline__ float loadZ(const void* input, const float* resIn, size_t i) {
  const float x = loadX<D>(input, i);
  if constexpr (kRes) {
    return __fadd_rn(x, resIn[i]);
  } else {
    return x;
  }
}

struct EncodeArgs {
  const void* input;
  size_t count;
  uint32_t block;
  size_t blocks;
  uint8_t* out;       // the header; the payload follows at kHeaderBytes
  size_t dataOffset;  // payload-relative, as in Layout
  size_t dataEnd;     // dataOffset + dataBytes
  size_t payloadBytes;
  uint64_t header[3];  // the 24 header bytes, prepared on the host
  float* buf0;         // residual buffers (already offset to the chunk)
  float* buf1;
  int* control;  // [0] current, [1] non-finite flag
};

// The header and the zero padding bytes (at most 4 after the scales and 7
// after the data); the kernels never write those bytes otherwise.
__device__ void writePrologue(const EncodeArgs& a) {
  auto* h = reinterpret_cast<uint64_t*>(a.out);
  h[0] = a.header[0];
  h[1] = a.header[1];
  h[2] = a.header[2];
  uint8_t* payload = a.out + kHeaderBytes;
  for (size_t i = a.blocks * 4; i < a.dataOffset; ++i) payload[i] = 0;
  for (size_t i = a.dataEnd; i < a.payloadBytes; ++i) payload[i] = 0;
}

template <bool kRes>
__device__ __forceinline__ void residualBuffers(const EncodeArgs& a, const float** in,
                                                float** out) {
  if constexpr (kRes) {
    const int current = a.control[0];
    *in = current != 0 ? a.buf1 : a.buf0;
    *out = current != 0 ? a.buf0 : a.buf1;
  } else {
    *in = nullptr;
    *out = nullptr;
  }
}

// ---- onebit ------------------------------------------------------------------

// One warp encodes codec block b, whose element i has the value z(i) (x + e,
// or the server's sum in onebitServeKernel); z is evaluated twice per element,
// once for the scale and once for the bits, so it must be pure.
template <bool kRes, bool kRms, typename Z>
__device__ __forceinline__ void onebitEncodeBlock(const EncodeArgs& a, size_t b, unsigned lane,
                                                  float* resOut, Z z) {
  const size_t start = b * a.block;
  const size_t n = a.count - start < a.block ? a.count - start : a.block;
  const size_t end = start + n;

  // Lane sums in index order, then the canonical fold.
  float acc = 0.0f;
#pragma unroll 8
  for (size_t i = start + lane; i < end; i += 32) {
    const float zi = z(i);
    acc = __fadd_rn(acc, kRms ? __fmul_rn(zi, zi) : absf(zi));
  }
  for (int w = 16; w >= 1; w /= 2) acc = __fadd_rn(acc, __shfl_down_sync(kFull, acc, w));
  const float sum = __shfl_sync(kFull, acc, 0);
  float s = __fdiv_rn(sum, __ull2float_rn(n));
  if constexpr (kRms) s = __fsqrt_rn(s);
  s = canonicalScale(s);
  uint8_t* payload = a.out + kHeaderBytes;
  if (lane == 0) {
    reinterpret_cast<float*>(payload)[b] = s;
    if constexpr (kRes) {
      if (!isFinite(s)) raiseFlag(&a.control[1]);
    }
  }

  // Bits and residuals: lane k collects word wb + k of each group of 32 words.
  auto* words = reinterpret_cast<uint64_t*>(payload + a.dataOffset);
  const size_t wEnd = (end + 63) / 64;
  for (size_t wb = start / 64; wb < wEnd; wb += 32) {
    const unsigned kn = wEnd - wb < 32 ? static_cast<unsigned>(wEnd - wb) : 32u;
    uint64_t mine = 0;
#pragma unroll 4
    for (unsigned k = 0; k < kn; ++k) {
      const size_t i0 = (wb + k) * 64 + lane;
      const size_t i1 = i0 + 32;
      bool b0 = false;
      bool b1 = false;
      if (i0 < end) {
        const float z0 = z(i0);
        b0 = z0 >= 0.0f;
        if constexpr (kRes) resOut[i0] = __fsub_rn(z0, b0 ? s : -s);
      }
      if (i1 < end) {
        const float z1 = z(i1);
        b1 = z1 >= 0.0f;
        if constexpr (kRes) resOut[i1] = __fsub_rn(z1, b1 ? s : -s);
      }
      const unsigned lo = __ballot_sync(kFull, b0);
      const unsigned hi = __ballot_sync(kFull, b1);
      if (lane == k) mine = static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
    }
    if (lane < kn) words[wb + lane] = mine;
  }
}

template <DType D, bool kRes, bool kRms>
__global__ void __launch_bounds__(kThreads) onebitEncodeKernel(EncodeArgs a) {
  if (blockIdx.x == 0 && threadIdx.x == 0) writePrologue(a);
  const unsigned lane = threadIdx.x & 31u;
  const size_t b = static_cast<size_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (b >= a.blocks) return;  // warp-uniform
  const float* resIn;
  float* resOut;
  residualBuffers<kRes>(a, &resIn, &resOut);
  onebitEncodeBlock<kRes, kRms>(a, b, lane, resOut,
                                [&](size_t i) { return loadZ<D, kRes>(a.input, resIn, i); });
}

// The common case, blocks of at most 2048 elements: one warp per 2048-element
// segment (1..32 whole codec blocks), kept in registers between the scale and
// the bits, so the data is read exactly once. Thread t holds elements
// base + t + 32 j, j = 0..63; block c of the segment is j in [c per, (c+1) per)
// with per = block / 32, so every lane still sums its elements of a block in
// index order, and each block is folded with the canonical shuffles.
constexpr int kSegment = 2048;
constexpr int kPerThread = kSegment / 32;

template <DType D, bool kRes, bool kRms>
__global__ void __launch_bounds__(kThreads)
    onebitEncodeSegmentKernel(EncodeArgs a, unsigned perShift) {
  if (blockIdx.x == 0 && threadIdx.x == 0) writePrologue(a);
  const unsigned lane = threadIdx.x & 31u;
  const size_t g = static_cast<size_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  const size_t base = g * kSegment;
  if (base >= a.count) return;  // warp-uniform
  const float* resIn;
  float* resOut;
  residualBuffers<kRes>(a, &resIn, &resOut);
  const unsigned per = 1u << perShift;  // elements per thread per codec block
  const size_t firstBlock = base / a.block;
  float z[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const size_t i = base + 32 * static_cast<size_t>(j) + lane;
    z[j] = i < a.count ? loadZ<D, kRes>(a.input, resIn, i) : 0.0f;
  }
  uint8_t* payload = a.out + kHeaderBytes;
  auto* scales = reinterpret_cast<float*>(payload);
  float acc = 0.0f;
  float myScale = 0.0f;  // lane c keeps the scale of block c of the segment
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (base + 32 * static_cast<size_t>(j) + lane < a.count)
      acc = __fadd_rn(acc, kRms ? __fmul_rn(z[j], z[j]) : absf(z[j]));
    if (((j + 1) & (per - 1)) == 0) {  // the end of block c: warp-uniform
      const unsigned c = static_cast<unsigned>(j) >> perShift;
      for (int w = 16; w >= 1; w /= 2) acc = __fadd_rn(acc, __shfl_down_sync(kFull, acc, w));
      const float sum = __shfl_sync(kFull, acc, 0);
      acc = 0.0f;
      const size_t blockStart = base + static_cast<size_t>(c) * a.block;
      if (blockStart < a.count) {
        const size_t left = a.count - blockStart;
        const size_t n = left < a.block ? left : a.block;
        float s = __fdiv_rn(sum, __ull2float_rn(n));
        if constexpr (kRms) s = __fsqrt_rn(s);
        s = canonicalScale(s);
        if (lane == c) myScale = s;
        if (lane == 0) {
          scales[firstBlock + c] = s;
          if constexpr (kRes) {
            if (!isFinite(s)) raiseFlag(&a.control[1]);
          }
        }
      }
    }
  }
  auto* words = reinterpret_cast<uint64_t*>(payload + a.dataOffset);
  uint64_t mine = 0;
#pragma unroll
  for (int k = 0; k < kPerThread / 2; ++k) {
    const int e0 = 2 * k;  // z[e0] and z[e0 + 1] hold elements i0 and i1
    const float s = __shfl_sync(kFull, myScale, static_cast<unsigned>(e0) >> perShift);
    const size_t i0 = base + 64 * static_cast<size_t>(k) + lane;
    const size_t i1 = i0 + 32;
    const bool v0 = i0 < a.count;
    const bool v1 = i1 < a.count;
    const bool b0 = v0 && z[e0] >= 0.0f;
    const bool b1 = v1 && z[e0 + 1] >= 0.0f;
    if constexpr (kRes) {
      if (v0) resOut[i0] = __fsub_rn(z[e0], b0 ? s : -s);
      if (v1) resOut[i1] = __fsub_rn(z[e0 + 1], b1 ? s : -s);
    }
    const unsigned lo = __ballot_sync(kFull, b0);
    const unsigned hi = __ballot_sync(kFull, b1);
    if (lane == static_cast<unsigned>(k)) {
      mine = static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
    }
  }
  const size_t wordIndex = base / 64 + lane;
  if (wordIndex * 64 < a.count) words[wordIndex] = mine;
}

// ---- int2, int4, int8: block-scaled integers ---------------------------------

// A codec's codes: kPer elements share a byte (a "unit"), element i in bits
// kBits * (i % kPer) of byte i / kPer, as a kBits-bit two's complement q in
// [-kLevels, kLevels]. A codec block starts at a multiple of 64 elements, so
// at a unit, and a unit never straddles two blocks. One thread encodes whole
// units (its kPer consecutive elements), so a byte is packed in a register
// and written once, with no other lane's codes needed.
template <CodecId C>
struct IntCode {
  static constexpr int kBits = intBits(C);
  static constexpr int kPer = 8 / kBits;
  static constexpr unsigned kMask = (1u << kBits) - 1u;
  static constexpr float kLevels = static_cast<float>(intLevels(C));
  static_assert(kBits == 2 || kBits == 4 || kBits == 8, "an integer codec");
};

// q for z in a block of scale s (quantise: the block is finite, s != 0):
// clamp(roundEven(z / s), -L, L), with an IEEE division.
template <typename Code>
__device__ __forceinline__ float intLevel(float z, float s, bool quantise) {
  if (!quantise) return 0.0f;
  const float r = roundEven(__fdiv_rn(z, s));
  return r < -Code::kLevels ? -Code::kLevels : (Code::kLevels < r ? Code::kLevels : r);  // clamp
}

// q's field in its unit's byte: element k of the unit at bit kBits * k.
template <typename Code>
__device__ __forceinline__ unsigned intField(float r, int k) {
  return (static_cast<unsigned>(static_cast<int>(r)) & Code::kMask) << (Code::kBits * k);
}

// One warp per codec block (blocks above 2048 elements): lane t takes units
// start / kPer + t, + 32, ...; max |z| and finiteness by shuffles (max is
// exact, so order does not matter), s = max / L or NaN, then a second walk
// (an L1/L2 hit) for the codes and the residuals z - q*s.
template <CodecId C, DType D, bool kRes>
__global__ void __launch_bounds__(kThreads) intEncodeKernel(EncodeArgs a) {
  using Code = IntCode<C>;
  constexpr int kPer = Code::kPer;
  if (blockIdx.x == 0 && threadIdx.x == 0) writePrologue(a);
  const unsigned lane = threadIdx.x & 31u;
  const size_t b = static_cast<size_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (b >= a.blocks) return;  // warp-uniform
  const float* resIn;
  float* resOut;
  residualBuffers<kRes>(a, &resIn, &resOut);
  const size_t start = b * a.block;
  const size_t n = a.count - start < a.block ? a.count - start : a.block;
  const size_t end = start + n;
  const size_t uEnd = (end + kPer - 1) / kPer;

  float maxAbs = 0.0f;
  bool finite = true;
#pragma unroll 8
  for (size_t u = start / kPer + lane; u < uEnd; u += 32) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const size_t i = u * kPer + k;
      if (i < end) {
        const float z = loadZ<D, kRes>(a.input, resIn, i);
        finite = finite && isFinite(z);
        maxAbs = fmaxf(maxAbs, absf(z));  // NaN ignored; the block is non-finite then
      }
    }
  }
  for (int w = 16; w >= 1; w /= 2) maxAbs = fmaxf(maxAbs, __shfl_xor_sync(kFull, maxAbs, w));
  finite = __all_sync(kFull, finite) != 0;
  const float s = finite ? __fdiv_rn(maxAbs, Code::kLevels) : bitsFloat(kNanBits);
  uint8_t* payload = a.out + kHeaderBytes;
  if (lane == 0) {
    reinterpret_cast<float*>(payload)[b] = s;
    if constexpr (kRes) {
      if (!finite) raiseFlag(&a.control[1]);
    }
  }
  uint8_t* data = payload + a.dataOffset;
  const bool quantise = finite && s != 0.0f;
#pragma unroll 4
  for (size_t u = start / kPer + lane; u < uEnd; u += 32) {
    unsigned byte = 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const size_t i = u * kPer + k;
      if (i < end) {
        const float z = loadZ<D, kRes>(a.input, resIn, i);
        const float r = intLevel<Code>(z, s, quantise);
        byte |= intField<Code>(r, k);
        if constexpr (kRes) resOut[i] = __fsub_rn(z, __fmul_rn(r, s));
      }
    }
    data[u] = static_cast<uint8_t>(byte);
  }
}

// Blocks of at most 2048 elements: the onebit segment layout (see
// onebitEncodeSegmentKernel) in units, one read of the data. A warp takes a
// 2048-element segment, kUnits = 2048 / kPer / 32 units per thread: thread t
// holds units ub + t + 32 j, j = 0..kUnits-1 (ub = base / kPer), element k of
// unit j in z[kPer j + k]. With U = block / kPer units per codec block
// (2^unitShift, at least 16), a block is U / 32 consecutive steps j of the
// whole warp when U >= 32; int2 in blocks of 64 (U = 16) has two blocks per
// step, one per half-warp. Either way a block's lanes are an aligned group of
// lpb = min(U, 32) lanes, reduced with xor shuffles of offsets below lpb and
// a ballot masked to the group.
template <CodecId C, DType D, bool kRes>
__global__ void __launch_bounds__(kThreads)
    intEncodeSegmentKernel(EncodeArgs a, unsigned unitShift) {
  using Code = IntCode<C>;
  constexpr int kPer = Code::kPer;
  constexpr int kUnits = kPerThread / kPer;
  if (blockIdx.x == 0 && threadIdx.x == 0) writePrologue(a);
  const unsigned lane = threadIdx.x & 31u;
  const size_t g = static_cast<size_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  const size_t base = g * kSegment;
  if (base >= a.count) return;  // warp-uniform
  const float* resIn;
  float* resOut;
  residualBuffers<kRes>(a, &resIn, &resOut);
  // Steps per block (U >= 32), or lanes per block and blocks per step (U < 32).
  const unsigned stepShift = unitShift >= 5 ? unitShift - 5 : 0u;
  const unsigned lpbShift = unitShift >= 5 ? 5u : unitShift;
  const unsigned bpsShift = 5u - lpbShift;
  const unsigned steps = 1u << stepShift;
  const unsigned lpb = 1u << lpbShift;
  const unsigned bps = 1u << bpsShift;
  const unsigned group = lane & ~(lpb - 1);  // the first lane of my block's group
  const unsigned groupMask = lpb == 32 ? kFull : ((1u << lpb) - 1u) << group;
  const size_t ub = base / kPer;
  const size_t firstBlock = base / a.block;
  float z[kPerThread];
#pragma unroll
  for (int j = 0; j < kUnits; ++j) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const size_t i = (ub + 32 * static_cast<size_t>(j) + lane) * kPer + k;
      z[kPer * j + k] = i < a.count ? loadZ<D, kRes>(a.input, resIn, i) : 0.0f;
    }
  }
  uint8_t* payload = a.out + kHeaderBytes;
  auto* scales = reinterpret_cast<float*>(payload);
  float maxAbs = 0.0f;
  bool finite = true;
  float myScale = 0.0f;  // lane c keeps the scale of block c of the segment
#pragma unroll
  for (int j = 0; j < kUnits; ++j) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      finite = finite && isFinite(z[kPer * j + k]);  // padding holds 0: finite
      maxAbs = fmaxf(maxAbs, absf(z[kPer * j + k]));
    }
    if (((j + 1) & (steps - 1)) == 0) {  // the end of a block (of bps blocks): warp-uniform
      for (unsigned w = lpb >> 1; w != 0; w >>= 1)
        maxAbs = fmaxf(maxAbs, __shfl_xor_sync(kFull, maxAbs, static_cast<int>(w)));
      const bool blockFinite = (__ballot_sync(kFull, !finite) & groupMask) == 0;
      const unsigned c0 = (static_cast<unsigned>(j) >> stepShift) << bpsShift;
      const unsigned c = c0 + (lane >> lpbShift);  // my block
      const float s = blockFinite ? __fdiv_rn(maxAbs, Code::kLevels) : bitsFloat(kNanBits);
      // Lane c0 + h takes the scale of block c0 + h from the group's first lane.
      const float sOf = __shfl_sync(kFull, s, ((lane - c0) & (bps - 1)) << lpbShift);
      if (lane - c0 < bps) myScale = sOf;  // unsigned: lanes below c0 fail too
      const size_t blockStart = base + static_cast<size_t>(c) * a.block;
      if (lane == group && blockStart < a.count) {
        scales[firstBlock + c] = s;
        if constexpr (kRes) {
          if (!blockFinite) raiseFlag(&a.control[1]);
        }
      }
      maxAbs = 0.0f;
      finite = true;
    }
  }
  uint8_t* data = payload + a.dataOffset;
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kUnits; ++j) {
    if ((j & (steps - 1)) == 0) {  // the start of a block (or of bps blocks): warp-uniform
      const unsigned c = ((static_cast<unsigned>(j) >> stepShift) << bpsShift) + (lane >> lpbShift);
      s = __shfl_sync(kFull, myScale, c);
    }
    const size_t u = ub + 32 * static_cast<size_t>(j) + lane;
    if (u * kPer < a.count) {
      const bool quantise = isFinite(s) && s != 0.0f;  // a NaN scale marks a non-finite block
      unsigned byte = 0;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const size_t i = u * kPer + k;
        if (i < a.count) {
          const float r = intLevel<Code>(z[kPer * j + k], s, quantise);
          byte |= intField<Code>(r, k);
          if constexpr (kRes) resOut[i] = __fsub_rn(z[kPer * j + k], __fmul_rn(r, s));
        }
      }
      data[u] = static_cast<uint8_t>(byte);
    }
  }
}

// ---- none / fp16 / bf16 -------------------------------------------------

template <Fmt F>
struct Format;
template <>
struct Format<Fmt::kF32> {
  using Word = float;
  __device__ static Word encode(float z) { return z; }
  __device__ static float decode(Word w) { return w; }
};
template <>
struct Format<Fmt::kF16> {
  using Word = uint16_t;
  __device__ static Word encode(float z) { return floatToHalf(z); }
  __device__ static float decode(Word w) { return halfToFloat(w); }
};
template <>
struct Format<Fmt::kBf16> {
  using Word = uint16_t;
  __device__ static Word encode(float z) { return floatToBf16(z); }
  __device__ static float decode(Word w) { return bf16ToFloat(w); }
};

template <DType D, bool kRes, Fmt F>
__global__ void __launch_bounds__(kThreads) elementwiseEncodeKernel(EncodeArgs a) {
  if (blockIdx.x == 0 && threadIdx.x == 0) writePrologue(a);
  const float* resIn;
  float* resOut;
  residualBuffers<kRes>(a, &resIn, &resOut);
  using Word = typename Format<F>::Word;
  auto* out = reinterpret_cast<Word*>(a.out + kHeaderBytes);
  bool bad = false;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i0 = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i0 < a.count;
       i0 += kUnroll * stride) {
    float z[kUnroll];  // all loads first: kUnroll independent loads in flight
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const size_t i = i0 + k * stride;
      z[k] = i < a.count ? loadZ<D, kRes>(a.input, resIn, i) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const size_t i = i0 + k * stride;
      if (i < a.count) {
        const Word w = Format<F>::encode(z[k]);
        out[i] = w;
        const float d = Format<F>::decode(w);
        bad = bad || !isFinite(d);
        if constexpr (kRes) resOut[i] = __fsub_rn(z[k], d);
      }
    }
  }
  if constexpr (kRes) {
    if (bad) raiseFlag(&a.control[1]);
  }
}

// ---- decode ------------------------------------------------------------------

struct DecodeArgs {
  const uint8_t* in;  // the header; the payload follows
  size_t count;
  unsigned blockShift;  // log2(block) for onebit and the integer codecs
  size_t dataOffset;
  uint64_t expected[3];
  int* error;
  int* nonFinite;  // onebit decode only: raised when a decoded value is not finite
  float* out;
};

// Every CTA compares the header with the expectation once. A mismatch decodes
// to NaN, so it raises the non-finite flag too.
__device__ bool headerMatches(const DecodeArgs& a) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    const auto* h = reinterpret_cast<const uint64_t*>(a.in);
    ok = h[0] == a.expected[0] && h[1] == a.expected[1] && h[2] == a.expected[2];
    if (!ok && a.error != nullptr) raiseFlag(a.error);
    if (!ok && a.nonFinite != nullptr) raiseFlag(a.nonFinite);
  }
  __syncthreads();
  return ok != 0;
}

__device__ __forceinline__ float nanValue() { return bitsFloat(kNanBits); }

// Writes (or adds) value(i) for every element, kUnroll elements per thread
// per step with every load of a step issued before its stores.
template <bool kAcc, typename Value>
__device__ __forceinline__ void decodeLoop(const DecodeArgs& a, Value value) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i0 = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i0 < a.count;
       i0 += kUnroll * stride) {
    float d[kUnroll];
    float prev[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const size_t i = i0 + k * stride;
      d[k] = 0.0f;
      prev[k] = 0.0f;
      if (i < a.count) {
        d[k] = value(i);
        if constexpr (kAcc) prev[k] = a.out[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const size_t i = i0 + k * stride;
      if (i < a.count) a.out[i] = kAcc ? __fadd_rn(prev[k], d[k]) : d[k];
    }
  }
}

// A onebit value is +-s, 0 or NaN: it is not finite exactly when its block's
// scale is not (or the header is wrong), so the optional non-finite flag is
// checked once per block, by the thread of the block's first element, instead
// of a pass over the decoded output.
template <bool kAcc>
__global__ void __launch_bounds__(kThreads) onebitDecodeKernel(DecodeArgs a) {
  const bool ok = headerMatches(a);
  const uint8_t* payload = a.in + kHeaderBytes;
  const auto* scales = reinterpret_cast<const float*>(payload);
  const auto* words = reinterpret_cast<const uint64_t*>(payload + a.dataOffset);
  const size_t firstMask = (size_t{1} << a.blockShift) - 1;
  decodeLoop<kAcc>(a, [&](size_t i) {
    if (!ok) return nanValue();
    const float s = scales[i >> a.blockShift];
    if (a.nonFinite != nullptr && (i & firstMask) == 0 && !isFinite(s)) raiseFlag(a.nonFinite);
    if (!isFinite(s)) return nanValue();
    if (s == 0.0f) return 0.0f;
    return ((words[i / 64] >> (i % 64)) & 1u) != 0 ? s : -s;
  });
}

// q of element i: its field, sign-extended (codes at or above 2^(bits-1) are
// negative; the code -L - 1, never written, decodes as itself).
template <typename Code>
__device__ __forceinline__ int intCodeAt(const uint8_t* data, size_t i) {
  if constexpr (Code::kBits == 8) {
    return static_cast<int8_t>(data[i]);
  } else {
    constexpr unsigned kSign = 1u << (Code::kBits - 1);
    const unsigned field =
        (data[i / Code::kPer] >> (Code::kBits * static_cast<int>(i % Code::kPer))) & Code::kMask;
    return static_cast<int>(field ^ kSign) - static_cast<int>(kSign);
  }
}

template <CodecId C, bool kAcc>
__global__ void __launch_bounds__(kThreads) intDecodeKernel(DecodeArgs a) {
  using Code = IntCode<C>;
  const bool ok = headerMatches(a);
  const uint8_t* payload = a.in + kHeaderBytes;
  const auto* scales = reinterpret_cast<const float*>(payload);
  const uint8_t* data = payload + a.dataOffset;
  decodeLoop<kAcc>(a, [&](size_t i) {
    if (!ok) return nanValue();
    const float s = scales[i >> a.blockShift];
    if (!isFinite(s)) return nanValue();
    return s != 0.0f ? __fmul_rn(static_cast<float>(intCodeAt<Code>(data, i)), s) : 0.0f;
  });
}

template <Fmt F, bool kAcc>
__global__ void __launch_bounds__(kThreads) elementwiseDecodeKernel(DecodeArgs a) {
  const bool ok = headerMatches(a);
  using Word = typename Format<F>::Word;
  const auto* in = reinterpret_cast<const Word*>(a.in + kHeaderBytes);
  decodeLoop<kAcc>(a, [&](size_t i) { return ok ? Format<F>::decode(in[i]) : nanValue(); });
}

// ---- serve: the server step of the two-phase allreduce, fused (onebit) ------

// The server's n pieces of one chunk, all encoded with the output's spec and
// count (so each must carry exactly the output's header), at pieces + j *
// stride in rank order, and the encoding of their sum or mean.
struct ServeArgs {
  EncodeArgs enc;  // input unused; the residual is the server's
  const uint8_t* pieces;
  size_t stride;
  int n;
  bool average;
  float divisor;  // n as a float, as divideKernel gets it
  int* error;
};

// Every CTA checks all n headers. A bad piece decodes to NaN in the unfused
// sequence, and NaN + anything is NaN (the only NaN decode makes is 0x7fc00000
// and the sums never meet inf - inf, decoded values being finite or NaN), so
// one bad piece makes every value of the chunk that NaN: a CTA-wide verdict
// gives the same bits as a per-piece one.
__device__ bool piecesMatch(const ServeArgs& a) {
  __shared__ int bad;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  for (int j = static_cast<int>(threadIdx.x); j < a.n; j += kThreads) {
    const auto* h = reinterpret_cast<const uint64_t*>(a.pieces + static_cast<size_t>(j) * a.stride);
    if (h[0] != a.enc.header[0] || h[1] != a.enc.header[1] || h[2] != a.enc.header[2]) {
      raiseFlag(&bad);
      if (a.error != nullptr) raiseFlag(a.error);
    }
  }
  __syncthreads();
  return bad == 0;
}

// The value the unfused server gives element i of block b: cudaDecode of piece
// 0, cudaDecodeAccumulate of pieces 1..n-1 (one __fadd_rn each, rank order),
// then divideKernel's __fdiv_rn for avg. Each decoded value is the decode
// kernel's, rule for rule.
__device__ __forceinline__ float servedValue(const ServeArgs& a, bool ok, size_t b, size_t i) {
  float v = 0.0f;
  for (int j = 0; j < a.n; ++j) {
    const uint8_t* payload = a.pieces + static_cast<size_t>(j) * a.stride + kHeaderBytes;
    float d;
    const float s = reinterpret_cast<const float*>(payload)[b];
    if (!ok || !isFinite(s)) {
      d = nanValue();
    } else if (s == 0.0f) {
      d = 0.0f;
    } else {
      const uint64_t w = reinterpret_cast<const uint64_t*>(payload + a.enc.dataOffset)[i / 64];
      d = ((w >> (i % 64)) & 1u) != 0 ? s : -s;
    }
    v = j == 0 ? d : __fadd_rn(v, d);
  }
  return a.average ? __fdiv_rn(v, a.divisor) : v;
}

// One warp per codec block: the onebit encode of z = served value + server
// residual, reading the n pieces (twice; the second walk hits in L1/L2)
// instead of an accumulator written and read n + 2 times.
template <bool kRms>
__global__ void __launch_bounds__(kThreads) onebitServeKernel(ServeArgs a) {
  const EncodeArgs& e = a.enc;
  if (blockIdx.x == 0 && threadIdx.x == 0) writePrologue(e);
  const bool ok = piecesMatch(a);  // before the early return: it synchronises the CTA
  const unsigned lane = threadIdx.x & 31u;
  const size_t b = static_cast<size_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (b >= e.blocks) return;  // warp-uniform
  const float* resIn;
  float* resOut;
  residualBuffers<true>(e, &resIn, &resOut);
  onebitEncodeBlock<true, kRms>(
      e, b, lane, resOut, [&](size_t i) { return __fadd_rn(servedValue(a, ok, b, i), resIn[i]); });
}

__global__ void commitKernel(int* control, unsigned long long* skipped) {
  if (control[1] != 0) {
    ++*skipped;
  } else {
    control[0] ^= 1;
  }
  control[1] = 0;
}

// ---- host side -------------------------------------------------------------

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bBytes && pb < pa + aBytes;
}

bool aligned(const void* p, size_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

unsigned gridFor(size_t items, size_t perCta, size_t cap = kMaxGrid) {
  size_t g = (items + perCta - 1) / perCta;
  if (g == 0) g = 1;  // CTA 0 still writes the header
  if (g > cap) g = cap;
  return static_cast<unsigned>(g);
}

// The integer codecs: the segment kernel up to 2048-element blocks, else one
// warp per block.
template <CodecId C, DType D, bool kRes>
void launchIntEncode(const EncodeArgs& a, cudaStream_t stream) {
  if (a.block <= static_cast<uint32_t>(kSegment)) {
    const unsigned segmentGrid =
        gridFor((a.count + kSegment - 1) / kSegment, kWarpsPerCta, kMaxWarpGrid);
    // log2 of the units (bytes) per codec block: block / kPer.
    const unsigned unitShift = static_cast<unsigned>(__builtin_ctz(a.block)) -
                               static_cast<unsigned>(__builtin_ctz(IntCode<C>::kPer));
    launchKernel(intEncodeSegmentKernel<C, D, kRes>, segmentGrid, kThreads, stream, a, unitShift);
  } else {
    launchKernel(intEncodeKernel<C, D, kRes>, gridFor(a.blocks, kWarpsPerCta, kMaxWarpGrid),
                 kThreads, stream, a);
  }
}

template <DType D, bool kRes>
void launchEncodeTyped(const Spec& spec, const EncodeArgs& a, cudaStream_t stream) {
  const unsigned warpGrid = gridFor(a.blocks, kWarpsPerCta, kMaxWarpGrid);
  const unsigned segmentGrid =
      gridFor((a.count + kSegment - 1) / kSegment, kWarpsPerCta, kMaxWarpGrid);
  const unsigned elemGrid = gridFor(a.count, static_cast<size_t>(kThreads) * kUnroll);
  switch (spec.codec) {
    case CodecId::kNone:
      launchKernel(elementwiseEncodeKernel<D, kRes, Fmt::kF32>, elemGrid, kThreads, stream, a);
      break;
    case CodecId::kFp16:
      launchKernel(elementwiseEncodeKernel<D, kRes, Fmt::kF16>, elemGrid, kThreads, stream, a);
      break;
    case CodecId::kBf16:
      launchKernel(elementwiseEncodeKernel<D, kRes, Fmt::kBf16>, elemGrid, kThreads, stream, a);
      break;
    case CodecId::kOnebit:
      if (a.block <= static_cast<uint32_t>(kSegment)) {
        const unsigned perShift = static_cast<unsigned>(__builtin_ctz(a.block)) - 5;  // /32
        if (spec.scale == Scale::kRms) {
          launchKernel(onebitEncodeSegmentKernel<D, kRes, true>, segmentGrid, kThreads, stream, a,
                       perShift);
        } else {
          launchKernel(onebitEncodeSegmentKernel<D, kRes, false>, segmentGrid, kThreads, stream, a,
                       perShift);
        }
      } else if (spec.scale == Scale::kRms) {
        launchKernel(onebitEncodeKernel<D, kRes, true>, warpGrid, kThreads, stream, a);
      } else {
        launchKernel(onebitEncodeKernel<D, kRes, false>, warpGrid, kThreads, stream, a);
      }
      break;
    case CodecId::kInt8: launchIntEncode<CodecId::kInt8, D, kRes>(a, stream); break;
    case CodecId::kInt2: launchIntEncode<CodecId::kInt2, D, kRes>(a, stream); break;
    case CodecId::kInt4: launchIntEncode<CodecId::kInt4, D, kRes>(a, stream); break;
  }
}

template <DType D>
void launchEncodeRes(const Spec& spec, const EncodeArgs& a, bool res, cudaStream_t stream) {
  if (res) {
    launchEncodeTyped<D, true>(spec, a, stream);
  } else {
    launchEncodeTyped<D, false>(spec, a, stream);
  }
}

template <bool kAcc>
void launchDecode(const Spec& spec, const DecodeArgs& a, cudaStream_t stream) {
  const unsigned grid = gridFor(a.count, static_cast<size_t>(kThreads) * kUnroll);
  switch (spec.codec) {
    case CodecId::kNone:
      launchKernel(elementwiseDecodeKernel<Fmt::kF32, kAcc>, grid, kThreads, stream, a);
      break;
    case CodecId::kFp16:
      launchKernel(elementwiseDecodeKernel<Fmt::kF16, kAcc>, grid, kThreads, stream, a);
      break;
    case CodecId::kBf16:
      launchKernel(elementwiseDecodeKernel<Fmt::kBf16, kAcc>, grid, kThreads, stream, a);
      break;
    case CodecId::kOnebit: launchKernel(onebitDecodeKernel<kAcc>, grid, kThreads, stream, a); break;
    case CodecId::kInt8:
      launchKernel(intDecodeKernel<CodecId::kInt8, kAcc>, grid, kThreads, stream, a);
      break;
    case CodecId::kInt2:
      launchKernel(intDecodeKernel<CodecId::kInt2, kAcc>, grid, kThreads, stream, a);
      break;
    case CodecId::kInt4:
      launchKernel(intDecodeKernel<CodecId::kInt4, kAcc>, grid, kThreads, stream, a);
      break;
  }
}

void headerWords(const Spec& spec, size_t count, uint64_t words[3]) {
  uint8_t bytes[kHeaderBytes];
  writeHeader(spec, count, bytes);
  std::memcpy(words, bytes, kHeaderBytes);
}

Status decodeInto(const Spec& expected, const void* dInput, size_t bytes, float* dOutput,
                  size_t count, cudaStream_t stream, int* dError, int* dNonFinite,
                  bool accumulate) {
  const char* what = accumulate ? "accumulator" : "output";
  SQUALL_REQUIRE(dNonFinite == nullptr || expected.codec == CodecId::kOnebit, Status::kUnsupported,
                 Subsys::kCuda,
                 "only the onebit decode reports non-finite values (from its scales); check the "
                 "decoded %s of a %s encoding separately",
                 what, codecName(expected.codec));
  Layout layout;
  SQUALL_TRY(layoutFor(expected, count, &layout));
  SQUALL_REQUIRE(bytes == layout.totalBytes, Status::kInvalidUsage, Subsys::kCuda,
                 "the encoded buffer is %zu bytes but %zu elements encoded with %s take "
                 "exactly %zu; pass the expected spec and count of this chunk",
                 bytes, count, codecName(expected.codec), layout.totalBytes);
  SQUALL_REQUIRE(dInput != nullptr, Status::kInvalidArgument, Subsys::kCuda,
                 "the encoded input pointer is NULL");
  SQUALL_REQUIRE(dOutput != nullptr || count == 0, Status::kInvalidArgument, Subsys::kCuda,
                 "the %s pointer is NULL but count is %zu", what, count);
  SQUALL_REQUIRE(aligned(dInput, 8) && aligned(dOutput, 4), Status::kInvalidArgument, Subsys::kCuda,
                 "the encoded input must be 8-byte aligned and the %s 4-byte aligned on the "
                 "device",
                 what);
  SQUALL_REQUIRE(count == 0 || !overlaps(dInput, bytes, dOutput, count * sizeof(float)),
                 Status::kInvalidUsage, Subsys::kCuda,
                 "the encoded input and the decoded %s overlap; decode into a separate buffer",
                 what);
  if (count == 0) return Status::kOk;
  DecodeArgs a{};
  a.in = static_cast<const uint8_t*>(dInput);
  a.count = count;
  a.blockShift =
      usesBlocks(expected.codec) ? static_cast<unsigned>(__builtin_ctz(expected.block)) : 0u;
  a.dataOffset = layout.dataOffset;
  headerWords(expected, count, a.expected);
  a.error = dError;
  a.nonFinite = dNonFinite;
  a.out = dOutput;
  if (accumulate) {
    launchDecode<true>(expected, a, stream);
  } else {
    launchDecode<false>(expected, a, stream);
  }
  SQUALL_CUDA_TRY(cudaGetLastError());
  return Status::kOk;
}

}  // namespace

Status cudaResidualCreate(size_t count, DeviceResidual** out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kCuda,
                 "the residual output pointer is NULL");
  size_t bytes = 0;
  SQUALL_REQUIRE(!__builtin_mul_overflow(count, sizeof(float), &bytes), Status::kInvalidArgument,
                 Subsys::kCuda, "a residual of %zu elements would need more than SIZE_MAX bytes",
                 count);
  auto* r = new (std::nothrow) DeviceResidual;
  SQUALL_REQUIRE(r != nullptr, Status::kOutOfMemory, Subsys::kCuda,
                 "out of memory allocating a residual object");
  r->count = count;
  cudaError_t err = cudaSuccess;
  for (float*& b : r->buf) {
    if (err == cudaSuccess) err = cudaMalloc(&b, bytes == 0 ? 4 : bytes);
  }
  void* control = nullptr;
  if (err == cudaSuccess) err = cudaMalloc(&control, 16);
  if (err == cudaSuccess) {
    r->control = static_cast<int*>(control);
    r->skipped = reinterpret_cast<unsigned long long*>(static_cast<uint8_t*>(control) + 8);
    for (float* b : r->buf) {
      if (err == cudaSuccess) err = cudaMemset(b, 0, bytes);
    }
    if (err == cudaSuccess) err = cudaMemset(control, 0, 16);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
  }
  if (err != cudaSuccess) {
    cudaResidualDestroy(r);
    return SQUALL_FAIL(
        err == cudaErrorMemoryAllocation ? Status::kOutOfMemory : Status::kSystemError,
        Subsys::kCuda,
        "allocating a device residual of %zu elements (2 x %zu bytes) failed: "
        "%s; free device memory or compress smaller buffers",
        count, bytes, cudaGetErrorString(err));
  }
  *out = r;
  return Status::kOk;
}

void cudaResidualDestroy(DeviceResidual* residual) {
  if (residual == nullptr) return;
  cudaFree(residual->buf[0]);
  cudaFree(residual->buf[1]);
  cudaFree(residual->control);  // the skipped counter shares this allocation
  delete residual;
}

Status cudaResidualReset(const DeviceResidual& residual, cudaStream_t stream) {
  for (float* b : residual.buf) {
    SQUALL_CUDA_TRY(cudaMemsetAsync(b, 0, residual.count * sizeof(float), stream));
  }
  SQUALL_CUDA_TRY(cudaMemsetAsync(residual.control, 0, 16, stream));
  return Status::kOk;
}

Status cudaResidualQuery(const DeviceResidual& residual, cudaStream_t stream, int* current,
                         unsigned long long* skipped) {
  uint8_t host[16];
  SQUALL_CUDA_TRY(cudaMemcpyAsync(host, residual.control, 16, cudaMemcpyDeviceToHost, stream));
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  if (current != nullptr) std::memcpy(current, host, sizeof(int));
  if (skipped != nullptr) std::memcpy(skipped, host + 8, sizeof(*skipped));
  return Status::kOk;
}

Status cudaResidualCurrent(const DeviceResidual& residual, cudaStream_t stream,
                           const float** current) {
  SQUALL_REQUIRE(current != nullptr, Status::kInvalidArgument, Subsys::kCuda,
                 "the current-buffer output pointer is NULL");
  int index = 0;
  SQUALL_TRY(cudaResidualQuery(residual, stream, &index, nullptr));
  *current = residual.buf[index & 1];
  return Status::kOk;
}

Status cudaEncodeChunk(const Spec& spec, const void* dInput, DType dtype, size_t count,
                       const DeviceResidual* residualOrNull, size_t residualOffset, void* dOutput,
                       size_t capacity, cudaStream_t stream, size_t* bytes) {
  SQUALL_REQUIRE(bytes != nullptr, Status::kInvalidArgument, Subsys::kCuda,
                 "the encoded-size output pointer is NULL");
  Layout layout;
  SQUALL_TRY(
      checkEncodeArgs(spec, dInput, dtype, count, dOutput, capacity, Subsys::kCuda, &layout));
  const size_t elemBytes = dtypeSize(dtype);
  SQUALL_REQUIRE(aligned(dOutput, 8) && aligned(dInput, elemBytes), Status::kInvalidArgument,
                 Subsys::kCuda,
                 "on the device the encoded output must be 8-byte aligned and the input "
                 "aligned to its %zu-byte element",
                 elemBytes);
  if (residualOrNull != nullptr) {
    SQUALL_REQUIRE(
        residualOffset <= residualOrNull->count && count <= residualOrNull->count - residualOffset,
        Status::kInvalidUsage, Subsys::kCuda,
        "elements [%zu, %zu + %zu) lie outside the residual of %zu elements", residualOffset,
        residualOffset, count, residualOrNull->count);
  }
  SQUALL_REQUIRE(
      layout.blocks / kWarpsPerCta < kMaxWarpGrid && count / kSegment / kWarpsPerCta < kMaxWarpGrid,
      Status::kUnsupported, Subsys::kCuda,
      "%zu elements in blocks of %u are more than one kernel launch covers; "
      "encode the buffer in chunks",
      count, spec.block);
  EncodeArgs a{};
  a.input = dInput;
  a.count = count;
  a.block = spec.block;
  a.blocks = layout.blocks;
  a.out = static_cast<uint8_t*>(dOutput);
  a.dataOffset = layout.dataOffset;
  a.dataEnd = layout.dataOffset + layout.dataBytes;
  a.payloadBytes = layout.payloadBytes;
  headerWords(spec, count, a.header);
  const bool res = residualOrNull != nullptr && count != 0;
  if (res) {
    a.buf0 = residualOrNull->buf[0] + residualOffset;
    a.buf1 = residualOrNull->buf[1] + residualOffset;
    a.control = residualOrNull->control;
  }
  switch (dtype) {
    case DType::kF32: launchEncodeRes<DType::kF32>(spec, a, res, stream); break;
    case DType::kF16: launchEncodeRes<DType::kF16>(spec, a, res, stream); break;
    case DType::kBf16: launchEncodeRes<DType::kBf16>(spec, a, res, stream); break;
  }
  SQUALL_CUDA_TRY(cudaGetLastError());
  *bytes = layout.totalBytes;
  return Status::kOk;
}

Status cudaResidualCommit(const DeviceResidual& residual, cudaStream_t stream) {
  launchKernel(commitKernel, 1, 1, stream, residual.control, residual.skipped);
  SQUALL_CUDA_TRY(cudaGetLastError());
  return Status::kOk;
}

Status cudaEncode(const Spec& spec, const void* dInput, DType dtype, size_t count,
                  const DeviceResidual* residualOrNull, void* dOutput, size_t capacity,
                  cudaStream_t stream, size_t* bytes) {
  if (residualOrNull != nullptr) {
    SQUALL_REQUIRE(residualOrNull->count == count, Status::kInvalidUsage, Subsys::kCuda,
                   "the residual was created for %zu elements but the input has %zu; use "
                   "one residual per buffer, of the buffer's size",
                   residualOrNull->count, count);
  }
  SQUALL_TRY(cudaEncodeChunk(spec, dInput, dtype, count, residualOrNull, 0, dOutput, capacity,
                             stream, bytes));
  if (residualOrNull != nullptr) SQUALL_TRY(cudaResidualCommit(*residualOrNull, stream));
  return Status::kOk;
}

Status cudaDecode(const Spec& expected, const void* dInput, size_t bytes, float* dOutput,
                  size_t count, cudaStream_t stream, int* dError, int* dNonFinite) {
  return decodeInto(expected, dInput, bytes, dOutput, count, stream, dError, dNonFinite, false);
}

Status cudaDecodeAccumulate(const Spec& expected, const void* dInput, size_t bytes,
                            float* dAccumulator, size_t count, cudaStream_t stream, int* dError) {
  return decodeInto(expected, dInput, bytes, dAccumulator, count, stream, dError, nullptr, true);
}

Status cudaServeChunk(const Spec& spec, const void* dPieces, size_t pieceStride, int pieces,
                      size_t pieceBytes, size_t count, bool average, const DeviceResidual& server,
                      size_t serverOffset, void* dOutput, size_t capacity, cudaStream_t stream,
                      size_t* bytes, int* dError) {
  SQUALL_REQUIRE(bytes != nullptr, Status::kInvalidArgument, Subsys::kCuda,
                 "the encoded-size output pointer is NULL");
  SQUALL_REQUIRE(spec.codec == CodecId::kOnebit, Status::kUnsupported, Subsys::kCuda,
                 "the fused server step is onebit only; for %s, decode, accumulate and encode "
                 "the pieces one call at a time",
                 codecName(spec.codec));
  Layout layout;
  SQUALL_TRY(layoutFor(spec, count, &layout));
  SQUALL_REQUIRE(pieces >= 1, Status::kInvalidArgument, Subsys::kCuda,
                 "the server step needs at least one piece, not %d", pieces);
  SQUALL_REQUIRE(pieceBytes == layout.totalBytes, Status::kInvalidUsage, Subsys::kCuda,
                 "each piece is %zu bytes but %zu elements encoded with %s take exactly %zu; "
                 "pass the expected spec and count of this chunk",
                 pieceBytes, count, codecName(spec.codec), layout.totalBytes);
  SQUALL_REQUIRE(pieces == 1 || pieceStride >= pieceBytes, Status::kInvalidUsage, Subsys::kCuda,
                 "pieces of %zu bytes %zu bytes apart overlap", pieceBytes, pieceStride);
  SQUALL_REQUIRE(dPieces != nullptr && dOutput != nullptr, Status::kInvalidArgument, Subsys::kCuda,
                 "the pieces or the output pointer is NULL");
  SQUALL_REQUIRE(capacity >= layout.totalBytes, Status::kInvalidArgument, Subsys::kCuda,
                 "the output holds %zu bytes but the encoding of %zu elements takes %zu", capacity,
                 count, layout.totalBytes);
  SQUALL_REQUIRE(aligned(dPieces, 8) && pieceStride % 8 == 0 && aligned(dOutput, 8),
                 Status::kInvalidArgument, Subsys::kCuda,
                 "the pieces, their stride and the output must be 8-byte aligned on the device");
  const size_t span = static_cast<size_t>(pieces - 1) * pieceStride + pieceBytes;
  SQUALL_REQUIRE(!overlaps(dPieces, span, dOutput, layout.totalBytes), Status::kInvalidUsage,
                 Subsys::kCuda, "the pieces and the output overlap; encode into a separate buffer");
  SQUALL_REQUIRE(serverOffset <= server.count && count <= server.count - serverOffset,
                 Status::kInvalidUsage, Subsys::kCuda,
                 "elements [%zu, %zu + %zu) lie outside the residual of %zu elements", serverOffset,
                 serverOffset, count, server.count);
  SQUALL_REQUIRE(layout.blocks / kWarpsPerCta < kMaxWarpGrid, Status::kUnsupported, Subsys::kCuda,
                 "%zu elements in blocks of %u are more than one kernel launch covers; "
                 "serve the chunk in parts",
                 count, spec.block);
  ServeArgs a{};
  a.enc.count = count;
  a.enc.block = spec.block;
  a.enc.blocks = layout.blocks;
  a.enc.out = static_cast<uint8_t*>(dOutput);
  a.enc.dataOffset = layout.dataOffset;
  a.enc.dataEnd = layout.dataOffset + layout.dataBytes;
  a.enc.payloadBytes = layout.payloadBytes;
  headerWords(spec, count, a.enc.header);  // also every piece's expected header
  a.enc.buf0 = server.buf[0] + serverOffset;
  a.enc.buf1 = server.buf[1] + serverOffset;
  a.enc.control = server.control;
  a.pieces = static_cast<const uint8_t*>(dPieces);
  a.stride = pieceStride;
  a.n = pieces;
  a.average = average;
  a.divisor = static_cast<float>(pieces);
  a.error = dError;
  const unsigned grid = gridFor(layout.blocks, kWarpsPerCta, kMaxWarpGrid);
  if (spec.scale == Scale::kRms) {
    launchKernel(onebitServeKernel<true>, grid, kThreads, stream, a);
  } else {
    launchKernel(onebitServeKernel<false>, grid, kThreads, stream, a);
  }
  SQUALL_CUDA_TRY(cudaGetLastError());
  *bytes = layout.totalBytes;
  return Status::kOk;
}

}  // namespace squall::codec
