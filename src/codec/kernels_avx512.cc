// AVX-512 codec kernels (F, BW, VL, DQ).
//
// Approach: the same operations as the scalar reference, in the same order,
// sixteen elements at a time (see kernels_avx2.cc for the AVX2 twin):
//   * onebit keeps the 32 canonical scale lanes (numeric.h, foldLanes) in two
//     __m512 accumulators (lanes 0-15 and 16-31) and folds them canonically;
//   * tails use masked loads and stores, which never touch memory outside the
//     mask; a masked-out lane loads 0.0 and adds +0.0 to a scale lane, which
//     changes nothing (a lane is never -0.0: it starts at +0.0 and only gains
//     |z| or z * z);
//   * each block is walked twice, the second walk recomputing z = x + e while
//     the block is still in L1/L2, so that memory sees a single pass;
//   * a 64-element bit word is four compare masks (encode) or four mask
//     blends (decode), so bits never leave the mask registers;
//   * when the caller asks (EncodeJob/DecodeJob::stream) and the fp32 output
//     is 64-byte aligned, whole words of residualOut (encode) or of the
//     output (plain decode) are written with streaming stores, and the kernel
//     ends with a store fence; the values are the same;
//   * int2, int4 and int8 find the block's max|z| in a first walk and write
//     codes and residuals in the second, 64 elements (four vectors) at a
//     time: z / s is a true division, rounded to nearest even, clamped, then
//     packed to bytes (packs + permute) and to nibbles or 2-bit fields
//     (maddubs, then a truncating narrow); a tail's codes are stored through
//     a byte mask; decode repeats each byte once per field, shifts the field
//     to the top of a lane and back, arithmetically;
//   * the other codecs use the scalar kernels.
// Everything here has internal linkage (see kernels_avx2.cc for why).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized (and, once inlined
// into enough instantiations, -Wuninitialized) on their own
// _mm*_undefined_* placeholders (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>

#include "src/codec/kernels.h"
#include "src/codec/numeric.h"

namespace squall::codec {
namespace {

constexpr uint32_t kNanBits = 0x7fc00000u;

size_t minSize(size_t a, size_t b) { return a < b ? a : b; }

float loadFloat(const uint8_t* base, size_t index) {
  float f;
  std::memcpy(&f, base + 4 * index, 4);
  return f;
}

// The mask of the first `count` lanes of chunk k (16 lanes each) of a run
// of `count` elements.
__mmask16 chunkMask(size_t count, int k) {
  const size_t first = 16 * static_cast<size_t>(k);
  if (count >= first + 16) return 0xffff;
  if (count <= first) return 0;
  return static_cast<__mmask16>((1u << (count - first)) - 1u);
}

// ---- reading the input as fp32 -------------------------------------------

// Sixteen input elements widened to fp32 (exactly); masked-out lanes read
// nothing and hold 0.0.
template <DType kDType>
struct Input;

template <>
struct Input<DType::kF32> {
  static __m512 load16(const uint8_t* p, size_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p + 4 * i);
  }
};

template <>
struct Input<DType::kF16> {
  static __m512 load16(const uint8_t* p, size_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + 2 * i));
  }
};

template <>
struct Input<DType::kBf16> {
  static __m512 load16(const uint8_t* p, size_t i, __mmask16 m) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p + 2 * i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
};

// z = x + e, or x alone without error feedback (adding 0.0 would turn -0.0
// into +0.0, so the reference does not, and neither do we).
template <DType kDType, bool kEf>
struct ZSource {
  const uint8_t* x;
  const float* e;

  __m512 load16(size_t i, __mmask16 m) const {
    const __m512 v = Input<kDType>::load16(x, i, m);
    if constexpr (kEf) return _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, e + i));
    return v;
  }
};

// ---- onebit encode -------------------------------------------------------

// What a scale lane accumulates: |z| (meanabs) or z * z (rms; a separate
// multiply and add, never an FMA).
template <Scale kScale>
__m512 term16(__m512 z) {
  if constexpr (kScale == Scale::kRms) return _mm512_mul_ps(z, z);
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(z), _mm512_set1_epi32(0x7fffffff)));
}

// foldLanes on lanes held as lo = lanes 0-15, hi = lanes 16-31.
float foldAccumulators(__m512 lo, __m512 hi) {
  const __m512 w16 = _mm512_add_ps(lo, hi);  // lanes 0-15 after w = 16
  const __m256 w8 = _mm256_add_ps(_mm512_castps512_ps256(w16), _mm512_extractf32x8_ps(w16, 1));
  const __m128 w4 = _mm_add_ps(_mm256_castps256_ps128(w8), _mm256_extractf128_ps(w8, 1));
  const __m128 w2 = _mm_add_ps(w4, _mm_movehl_ps(w4, w4));
  const __m128 w1 = _mm_add_ss(w2, _mm_shuffle_ps(w2, w2, 1));
  return _mm_cvtss_f32(w1);
}

// The sum of a block's terms in the canonical 32-lane order.
template <Scale kScale, typename Source>
float blockSum(const Source& src, size_t start, size_t n) {
  __m512 lo = _mm512_setzero_ps();
  __m512 hi = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    lo = _mm512_add_ps(lo, term16<kScale>(src.load16(start + i, 0xffff)));
    hi = _mm512_add_ps(hi, term16<kScale>(src.load16(start + i + 16, 0xffff)));
  }
  if (i < n) {  // the last block of a buffer may end mid-chunk
    const size_t rest = n - i;
    lo = _mm512_add_ps(lo, term16<kScale>(src.load16(start + i, chunkMask(rest, 0))));
    hi = _mm512_add_ps(hi, term16<kScale>(src.load16(start + i + 16, chunkMask(rest, 1))));
  }
  return foldAccumulators(lo, hi);
}

template <Scale kScale>
float scaleFromSum(float sum, size_t n) {
  const float mean = sum / static_cast<float>(n);
  if constexpr (kScale == Scale::kRms) return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(mean)));
  return mean;
}

// Signs of `count` (at most 64) elements from `first` as one word; with
// error feedback also writes residualOut = z - (bit ? s : -s), with
// streaming stores when kStream (whole words only: count is 64 and eOut + first
// is 64-byte aligned, see streamStores).
template <bool kEf, bool kStream, typename Source>
uint64_t encodeWord(const Source& src, size_t first, size_t count, __m512 s, __m512 negS,
                    float* eOut) {
  uint64_t word = 0;
  for (int k = 0; k < 4; ++k) {
    const size_t i = first + 16 * static_cast<size_t>(k);
    const __mmask16 m = chunkMask(count, k);
    const __m512 z = src.load16(i, m);
    const __mmask16 positive =
        _mm512_mask_cmp_ps_mask(m, z, _mm512_setzero_ps(), _CMP_GE_OQ);  // NaN: 0
    word |= static_cast<uint64_t>(positive) << (16 * k);
    if constexpr (kEf) {
      const __m512 e = _mm512_sub_ps(z, _mm512_mask_blend_ps(positive, negS, s));
      if constexpr (kStream) {
        _mm512_stream_ps(eOut + i, e);
      } else {
        _mm512_mask_storeu_ps(eOut + i, m, e);
      }
    }
  }
  return word;
}

template <DType kDType, bool kEf, Scale kScale, bool kStream = false>
bool onebitEncode(const EncodeJob& job) {
  const ZSource<kDType, kEf> src{static_cast<const uint8_t*>(job.input), job.residualIn};
  float* eOut = job.residualOut;
  uint8_t* scales = job.payload;
  uint8_t* words = job.payload + job.layout.dataOffset;
  const size_t block = job.spec.block;
  bool finite = true;
  for (size_t b = 0; b < job.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t n = minSize(block, job.count - start);
    const float s = canonicalScale(scaleFromSum<kScale>(blockSum<kScale>(src, start, n), n));
    std::memcpy(scales + 4 * b, &s, 4);
    finite = finite && isFinite(s);

    const __m512 sv = _mm512_set1_ps(s);
    const __m512 negSv = _mm512_set1_ps(-s);
    const size_t end = start + n;
    // Full words get a constant count, so that their masks fold away.
    size_t i = start;
    for (; i + 64 <= end; i += 64) {
      const uint64_t word = encodeWord<kEf, kStream>(src, i, 64, sv, negSv, eOut);
      std::memcpy(words + i / 8, &word, 8);
    }
    if (i < end) {
      const uint64_t word = encodeWord<kEf, false>(src, i, end - i, sv, negSv, eOut);
      std::memcpy(words + i / 8, &word, 8);
    }
  }
  if constexpr (kStream) _mm_sfence();
  return finite;
}

template <DType kDType, Scale kScale>
bool onebitEncodeScaled(const EncodeJob& job) {
  if (job.residualIn == nullptr) return onebitEncode<kDType, false, kScale>(job);
  if (streamStores(job.stream, job.residualOut))
    return onebitEncode<kDType, true, kScale, true>(job);
  return onebitEncode<kDType, true, kScale>(job);
}

template <DType kDType>
bool onebitEncodeFor(const EncodeJob& job) {
  if (job.spec.scale == Scale::kRms) return onebitEncodeScaled<kDType, Scale::kRms>(job);
  return onebitEncodeScaled<kDType, Scale::kMeanAbs>(job);
}

bool onebitEncodeAny(const EncodeJob& job) {
  switch (job.dtype) {
    case DType::kF32: return onebitEncodeFor<DType::kF32>(job);
    case DType::kF16: return onebitEncodeFor<DType::kF16>(job);
    case DType::kBf16: return onebitEncodeFor<DType::kBf16>(job);
  }
  return false;
}

// ---- onebit decode -------------------------------------------------------

// The two values a block decodes to. A non-finite scale decodes to the
// canonical NaN and a zero scale to +0.0, whatever the bits say.
struct BlockValues {
  float pos;
  float neg;
};

BlockValues blockValues(float s) {
  if (!isFinite(s)) return {bitsFloat(kNanBits), bitsFloat(kNanBits)};
  if (s == 0.0f) return {0.0f, 0.0f};
  return {s, -s};
}

// Decodes `count` (at most 64) elements of one word into out[0, count);
// kStream as in encodeWord.
template <bool kAccumulate, bool kStream = false>
void decodeWord(uint64_t word, size_t count, __m512 pos, __m512 neg, float* out) {
  for (int k = 0; k < 4; ++k) {
    const __mmask16 m = chunkMask(count, k);
    float* o = out + 16 * static_cast<size_t>(k);
    __m512 d = _mm512_mask_blend_ps(static_cast<__mmask16>(word >> (16 * k)), neg, pos);
    if constexpr (kAccumulate) d = _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), d);
    if constexpr (kStream) {
      _mm512_stream_ps(o, d);
    } else {
      _mm512_mask_storeu_ps(o, m, d);
    }
  }
}

template <bool kAccumulate, bool kStream = false>
void onebitDecodeWith(const DecodeJob& job) {
  const uint8_t* scales = job.payload;
  const uint8_t* words = job.payload + job.layout.dataOffset;
  const size_t block = job.spec.block;
  for (size_t b = 0; b < job.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t end = start + minSize(block, job.count - start);
    const BlockValues v = blockValues(loadFloat(scales, b));
    const __m512 pos = _mm512_set1_ps(v.pos);
    const __m512 neg = _mm512_set1_ps(v.neg);
    size_t i = start;
    for (; i + 64 <= end; i += 64) {
      uint64_t word;
      std::memcpy(&word, words + i / 8, 8);
      decodeWord<kAccumulate, kStream>(word, 64, pos, neg, job.output + i);
    }
    if (i < end) {
      uint64_t word;
      std::memcpy(&word, words + i / 8, 8);
      decodeWord<kAccumulate>(word, end - i, pos, neg, job.output + i);
    }
  }
  if constexpr (kStream) _mm_sfence();
}

template <bool kAccumulate>
void onebitDecode(const DecodeJob& job) {
  if (!kAccumulate && streamStores(job.stream, job.output)) {
    onebitDecodeWith<false, true>(job);
  } else {
    onebitDecodeWith<kAccumulate>(job);
  }
}

// ---- onebit sums of several encodings ---------------------------------------

// divideAll's arithmetic on a vector: the exact inverse's product for a power
// of two, else the division.
struct Divide {
  int divisor;
  bool byProduct;
  __m512 factor;

  explicit Divide(int d)
      : divisor(d),
        byProduct(divideByProduct(d)),
        factor(_mm512_set1_ps(byProduct ? 1.0f / static_cast<float>(d) : static_cast<float>(d))) {}
  __m512 apply(__m512 v) const {
    return byProduct ? _mm512_mul_ps(v, factor) : _mm512_div_ps(v, factor);
  }
  float apply(float v) const {
    return byProduct ? v * (1.0f / static_cast<float>(divisor)) : v / static_cast<float>(divisor);
  }
};

// The sum kernel (kernels.h, SumFn) for onebit: per 64-element word, the n
// encodings' values are blended from their bits and added in rank order in
// registers, divided, and stored once.
template <bool kDivide, bool kStream>
void onebitSumWith(const DecodeJob* jobs, size_t n, int divisor) {
  const DecodeJob& first = jobs[0];
  const size_t block = first.spec.block;
  const size_t dataOffset = first.layout.dataOffset;
  const Divide divide(kDivide ? divisor : 1);
  float* out = first.output;
  __m512 pos[kMaxSumEncodings], neg[kMaxSumEncodings];
  float posS[kMaxSumEncodings], negS[kMaxSumEncodings];
  for (size_t b = 0; b < first.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t end = start + minSize(block, first.count - start);
    for (size_t j = 0; j < n; ++j) {
      const BlockValues v = blockValues(loadFloat(jobs[j].payload, b));
      posS[j] = v.pos;
      negS[j] = v.neg;
      pos[j] = _mm512_set1_ps(v.pos);
      neg[j] = _mm512_set1_ps(v.neg);
    }
    size_t i = start;
    for (; i + 64 <= end; i += 64) {
      // The values of encoding j's quarter k of this word.
      auto values = [&](size_t j, int k) {
        uint64_t word;
        std::memcpy(&word, jobs[j].payload + dataOffset + i / 8, 8);
        return _mm512_mask_blend_ps(static_cast<__mmask16>(word >> (16 * k)), neg[j], pos[j]);
      };
      __m512 sum[4];
      for (int k = 0; k < 4; ++k) sum[k] = values(0, k);
      for (size_t j = 1; j < n; ++j) {
        for (int k = 0; k < 4; ++k) sum[k] = _mm512_add_ps(sum[k], values(j, k));
      }
      for (int k = 0; k < 4; ++k) {
        const __m512 v = kDivide ? divide.apply(sum[k]) : sum[k];
        if constexpr (kStream) {
          _mm512_stream_ps(out + i + 16 * static_cast<size_t>(k), v);
        } else {
          _mm512_storeu_ps(out + i + 16 * static_cast<size_t>(k), v);
        }
      }
    }
    for (; i < end; ++i) {  // the buffer's last word may be cut short
      float sum = 0.0f;
      for (size_t j = 0; j < n; ++j) {
        uint64_t word;
        std::memcpy(&word, jobs[j].payload + dataOffset + (i / 64) * 8, 8);
        const float d = ((word >> (i % 64)) & 1u) != 0 ? posS[j] : negS[j];
        sum = j == 0 ? d : sum + d;
      }
      out[i] = kDivide ? divide.apply(sum) : sum;
    }
  }
  if constexpr (kStream) _mm_sfence();
}

void onebitSum(const DecodeJob* jobs, size_t n, int divisor) {
  const bool stream = streamStores(jobs[0].stream, jobs[0].output);
  if (divisor > 1) {
    stream ? onebitSumWith<true, true>(jobs, n, divisor)
           : onebitSumWith<true, false>(jobs, n, divisor);
  } else {
    stream ? onebitSumWith<false, true>(jobs, n, divisor)
           : onebitSumWith<false, false>(jobs, n, divisor);
  }
}

// ---- int2, int4, int8: block-scaled integers -------------------------------

// s = max|z| / L per block, q = clamp(roundEven(z / s), -L, L), with the
// reference's IEEE operations (a true division, round-to-nearest-even, min
// and max), sixteen lanes at a time. max|z| is an integer max of the
// magnitudes' bits: it orders finite magnitudes as floats do and puts an
// infinity or a NaN above all of them, so one reduction gives the scale and
// the finite test; masked-out lanes load 0.0, which changes neither.
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

template <typename Source>
uint32_t blockMaxBits(const Source& src, size_t start, size_t n) {
  const __m512i absMask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int k = 0; k < 4; ++k) {
      const __m512 z = src.load16(start + i + 16 * static_cast<size_t>(k), 0xffff);
      acc[k] = _mm512_max_epu32(acc[k], _mm512_and_si512(_mm512_castps_si512(z), absMask));
    }
  }
  if (i < n) {  // the buffer's last block may end mid-run
    const size_t rest = n - i;
    for (int k = 0; k < 4; ++k) {
      const __m512 z = src.load16(start + i + 16 * static_cast<size_t>(k), chunkMask(rest, k));
      acc[k] = _mm512_max_epu32(acc[k], _mm512_and_si512(_mm512_castps_si512(z), absMask));
    }
  }
  const __m512i m =
      _mm512_max_epu32(_mm512_max_epu32(acc[0], acc[1]), _mm512_max_epu32(acc[2], acc[3]));
  return _mm512_reduce_max_epu32(m);
}

// The mask of the first `bytes` bytes of a vector.
template <typename Mask>
Mask byteMask(size_t bytes) {
  constexpr size_t kWidth = sizeof(Mask) * 8;
  return bytes >= kWidth ? static_cast<Mask>(~Mask{0}) : static_cast<Mask>((Mask{1} << bytes) - 1u);
}

// Packs 64 codes q (int32, |q| <= 127, four vectors of sixteen in element
// order) into 64 * kBits / 8 bytes at `out`, the wire's two's complement
// fields (element i of the run at bit kBits * i); only the first `bytes`
// are written.
template <int kBits>
void storeCodes(const __m512i q[4], uint8_t* out, size_t bytes) {
  const __m512i p01 = _mm512_packs_epi32(q[0], q[1]);  // per lane: q0 q1 quads
  const __m512i p23 = _mm512_packs_epi32(q[2], q[3]);
  const __m512i lanes = _mm512_packs_epi16(p01, p23);  // dword 4L + m: q[m] quad L
  const __m512i codes = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), lanes);
  if constexpr (kBits == 8) {
    _mm512_mask_storeu_epi8(out, byteMask<__mmask64>(bytes), codes);
  } else if constexpr (kBits == 4) {
    // Each byte pair (even element low) becomes lo + 16 * hi in a word.
    const __m512i fields = _mm512_and_si512(codes, _mm512_set1_epi8(0x0f));
    const __m512i words = _mm512_maddubs_epi16(fields, _mm512_set1_epi16(0x1001));
    _mm256_mask_storeu_epi8(out, byteMask<__mmask32>(bytes), _mm512_cvtepi16_epi8(words));
  } else {
    static_assert(kBits == 2);
    const __m512i fields = _mm512_and_si512(codes, _mm512_set1_epi8(0x03));
    const __m512i pairs = _mm512_maddubs_epi16(fields, _mm512_set1_epi16(0x0401));  // a + 4b
    const __m512i quads = _mm512_madd_epi16(pairs, _mm512_set1_epi32(0x00100001));  // + 16 (c + 4d)
    _mm_mask_storeu_epi8(out, byteMask<__mmask16>(bytes), _mm512_cvtepi32_epi8(quads));
  }
}

// `count` (at most 64) elements from `first`: their codes into out and, with
// error feedback, residualOut = z - r * s (a product then a difference, as
// the reference), streamed when kStream (whole runs only, eOut + first
// 64-byte aligned). kLive is false for a block whose scale is zero or not
// finite: r = 0 there, and the residual is still z - 0 * s.
template <int kBits, bool kLive, bool kEf, bool kStream, typename Source>
void encodeRun64(const Source& src, size_t first, size_t count, __m512 s, float* eOut,
                 uint8_t* out) {
  constexpr float kLevels = static_cast<float>((1 << (kBits - 1)) - 1);
  __m512i q[4];
  for (int k = 0; k < 4; ++k) {
    const size_t i = first + 16 * static_cast<size_t>(k);
    const __mmask16 m = chunkMask(count, k);
    const __m512 z = src.load16(i, m);
    __m512 r = _mm512_setzero_ps();
    if constexpr (kLive) {
      r = _mm512_roundscale_ps(_mm512_div_ps(z, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-kLevels)), _mm512_set1_ps(kLevels));
    }
    q[k] = _mm512_cvttps_epi32(r);
    if constexpr (kEf) {
      const __m512 e = _mm512_sub_ps(z, _mm512_mul_ps(r, s));
      if constexpr (kStream) {
        _mm512_stream_ps(eOut + i, e);
      } else {
        _mm512_mask_storeu_ps(eOut + i, m, e);
      }
    }
  }
  storeCodes<kBits>(q, out, (count * kBits + 7) / 8);
}

// With streaming residual stores, the second walk of a block reads only
// the caches; asking for the next block's x and e one run at a time then
// keeps memory busy meanwhile (into L2: the current block stays in L1).
// With cached stores the residual's read-for-ownership competes for the
// same line fills (measured slower on AVX2, kernels_avx2.cc).
template <DType kDType, bool kEf>
void prefetchNextBlock(const ZSource<kDType, kEf>& src, size_t i) {
  constexpr size_t kBytes = (kDType == DType::kF32 ? 4 : 2);
  // Integer addresses: the last run's lines may lie past the buffer, which a
  // prefetch may touch but pointer arithmetic may not name (hence the casts
  // from integers, which a prefetch's address does not need optimised).
  constexpr size_t kElements = 64;  // one block of the vector loop
  const uintptr_t x = reinterpret_cast<uintptr_t>(src.x) + i * kBytes;
  for (size_t line = 0; line < kElements * kBytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(x + line),  // NOLINT(performance-no-int-to-ptr)
                 _MM_HINT_T1);
  if constexpr (kEf) {
    const uintptr_t e = reinterpret_cast<uintptr_t>(src.e) + i * 4;
    for (size_t line = 0; line < kElements * 4; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(e + line),  // NOLINT(performance-no-int-to-ptr)
                   _MM_HINT_T1);
  }
}

template <int kBits, bool kLive, bool kEf, bool kStream, typename Source>
void encodeBlock(const Source& src, size_t start, size_t end, size_t ahead, float s, float* eOut,
                 uint8_t* data) {
  const __m512 sv = _mm512_set1_ps(s);
  size_t i = start;
  // Whole runs get a constant count, so that their masks fold away.
  for (; i + 64 <= end; i += 64) {
    if constexpr (kStream)
      if (ahead != 0) prefetchNextBlock(src, i + ahead);
    encodeRun64<kBits, kLive, kEf, kStream>(src, i, 64, sv, eOut, data + i * kBits / 8);
  }
  if (i < end)
    encodeRun64<kBits, kLive, kEf, false>(src, i, end - i, sv, eOut, data + i * kBits / 8);
}

template <CodecId kCodec, DType kDType, bool kEf, bool kStream = false>
bool intEncode(const EncodeJob& job) {
  constexpr int kBits = intBits(kCodec);
  constexpr float kLevels = static_cast<float>(intLevels(kCodec));
  const ZSource<kDType, kEf> src{static_cast<const uint8_t*>(job.input), job.residualIn};
  uint8_t* scales = job.payload;
  uint8_t* data = job.payload + job.layout.dataOffset;
  const size_t block = job.spec.block;
  bool finite = true;
  for (size_t b = 0; b < job.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t end = start + minSize(block, job.count - start);
    const uint32_t maxBits = blockMaxBits(src, start, end - start);
    const size_t ahead = b + 1 < job.layout.blocks ? block : 0;  // to the next block, if any
    const bool blockFinite = maxBits < kInfBits;
    const float s = blockFinite ? bitsFloat(maxBits) / kLevels : bitsFloat(kNanBits);
    std::memcpy(scales + 4 * b, &s, 4);
    finite = finite && blockFinite;
    if (blockFinite && s != 0.0f) {
      encodeBlock<kBits, true, kEf, kStream>(src, start, end, ahead, s, job.residualOut, data);
    } else {
      encodeBlock<kBits, false, kEf, kStream>(src, start, end, ahead, s, job.residualOut, data);
    }
  }
  if constexpr (kStream) _mm_sfence();
  return finite;
}

template <CodecId kCodec, DType kDType>
bool intEncodeFor(const EncodeJob& job) {
  if (job.residualIn == nullptr) return intEncode<kCodec, kDType, false>(job);
  if (streamStores(job.stream, job.residualOut)) return intEncode<kCodec, kDType, true, true>(job);
  return intEncode<kCodec, kDType, true>(job);
}

template <CodecId kCodec>
bool intEncodeAny(const EncodeJob& job) {
  switch (job.dtype) {
    case DType::kF32: return intEncodeFor<kCodec, DType::kF32>(job);
    case DType::kF16: return intEncodeFor<kCodec, DType::kF16>(job);
    case DType::kBf16: return intEncodeFor<kCodec, DType::kBf16>(job);
  }
  return false;
}

// Sixteen codes from element `i` (a multiple of 16 from a block start, so a
// whole number of bytes in), sign-extended to int32; `count` (at most 16)
// says how many elements' bytes may be read. Each byte is repeated once per
// field it holds, and each lane shifts its field to the top, then
// arithmetically back down.
template <int kBits>
__m512i loadCodes16(const uint8_t* data, size_t i, size_t count) {
  const uint8_t* p = data + i * kBits / 8;
  const __mmask16 m = byteMask<__mmask16>((count * kBits + 7) / 8);
  const __m128i bytes = _mm_maskz_loadu_epi8(m, p);
  if constexpr (kBits == 8) {
    return _mm512_cvtepi8_epi32(bytes);
  } else if constexpr (kBits == 4) {
    const __m128i spread =
        _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
    const __m512i top = _mm512_sllv_epi32(
        _mm512_cvtepu8_epi32(spread),
        _mm512_setr_epi32(28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24));
    return _mm512_srai_epi32(top, 28);
  } else {
    static_assert(kBits == 2);
    const __m128i spread =
        _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m512i top = _mm512_sllv_epi32(
        _mm512_cvtepu8_epi32(spread),
        _mm512_setr_epi32(30, 28, 26, 24, 30, 28, 26, 24, 30, 28, 26, 24, 30, 28, 26, 24));
    return _mm512_srai_epi32(top, 30);
  }
}

// Stores `count` (at most 16) decoded values d at o, adding them to what is
// there when kAccumulate; kStream as in encodeRun64 (count is then 16).
template <bool kAccumulate, bool kStream>
void storeDecoded(float* o, size_t count, __m512 d) {
  const __mmask16 m = chunkMask(count, 0);
  if constexpr (kAccumulate) d = _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), d);
  if constexpr (kStream) {
    _mm512_stream_ps(o, d);
  } else {
    _mm512_mask_storeu_ps(o, m, d);
  }
}

// value = q * s; a block whose scale is not finite decodes to the canonical
// NaN, one whose scale is zero to +0.0, whatever its codes.
template <CodecId kCodec, bool kAccumulate, bool kStream>
void intDecodeWith(const DecodeJob& job) {
  constexpr int kBits = intBits(kCodec);
  const uint8_t* scales = job.payload;
  const uint8_t* data = job.payload + job.layout.dataOffset;
  float* out = job.output;
  const size_t block = job.spec.block;
  for (size_t b = 0; b < job.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t end = start + minSize(block, job.count - start);
    const float s = loadFloat(scales, b);
    const __m512 sv = _mm512_set1_ps(s);
    size_t i = start;
    if (isFinite(s) && s != 0.0f) {
      for (; i + 64 <= end; i += 64) {
        for (int k = 0; k < 4; ++k) {
          const size_t at = i + 16 * static_cast<size_t>(k);
          const __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(loadCodes16<kBits>(data, at, 16)), sv);
          storeDecoded<kAccumulate, kStream>(out + at, 16, d);
        }
      }
      for (; i < end; i += 16) {
        const size_t n = minSize(16, end - i);
        const __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(loadCodes16<kBits>(data, i, n)), sv);
        storeDecoded<kAccumulate, false>(out + i, n, d);
      }
    } else {
      const __m512 fill = _mm512_set1_ps(isFinite(s) ? 0.0f : bitsFloat(kNanBits));
      for (; i + 16 <= end; i += 16) storeDecoded<kAccumulate, kStream>(out + i, 16, fill);
      if (i < end) storeDecoded<kAccumulate, false>(out + i, end - i, fill);
    }
  }
  if constexpr (kStream) _mm_sfence();
}

template <CodecId kCodec, bool kAccumulate>
void intDecode(const DecodeJob& job) {
  if (!kAccumulate && streamStores(job.stream, job.output)) {
    intDecodeWith<kCodec, false, true>(job);
  } else {
    intDecodeWith<kCodec, kAccumulate, false>(job);
  }
}

template <CodecId kCodec>
CodecKernels intKernels() {
  return {intEncodeAny<kCodec>, intDecode<kCodec, false>, intDecode<kCodec, true>, nullptr};
}

// ---- the table -----------------------------------------------------------

// Vectorised by the compiler with this file's instructions.
void widenBf16Avx512(const uint16_t* from, float* to, size_t n) { widenBf16Loop(from, to, n); }
void narrowBf16Avx512(const float* from, uint16_t* to, size_t n) { narrowBf16Loop(from, to, n); }

KernelTable buildTable() {
  KernelTable t = scalarKernels();
  t.name = "avx512";
  t.widenBf16 = widenBf16Avx512;
  t.narrowToBf16 = narrowBf16Avx512;
  t.codecs[static_cast<int>(CodecId::kOnebit)] = {onebitEncodeAny, onebitDecode<false>,
                                                  onebitDecode<true>, onebitSum};
  t.codecs[static_cast<int>(CodecId::kInt8)] = intKernels<CodecId::kInt8>();
  t.codecs[static_cast<int>(CodecId::kInt4)] = intKernels<CodecId::kInt4>();
  t.codecs[static_cast<int>(CodecId::kInt2)] = intKernels<CodecId::kInt2>();
  return t;
}

}  // namespace

const KernelTable& avx512Kernels() {
  static const KernelTable table = buildTable();
  return table;
}

}  // namespace squall::codec
