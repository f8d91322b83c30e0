// AVX2 codec kernels (with F16C for half inputs).
//
// Approach: every kernel must produce the scalar reference's bytes exactly, so
// the vector code performs the same IEEE operations in the same order, eight
// elements at a time:
//   * onebit keeps the 32 canonical scale lanes (numeric.h, foldLanes) in four
//     __m256 accumulators (lanes 0-7, 8-15, 16-23, 24-31) and folds them in the
//     canonical order; a partial last chunk finishes in a scalar lane array;
//   * each block is walked twice, the second walk recomputing z = x + e while
//     the block is still in L1/L2, so that memory sees a single pass;
//   * a 64-element bit word is eight movemasks (encode) or eight variable
//     shifts that move each bit into a float's sign for blendv (decode);
//   * the last, partial word of a buffer is staged through a padded copy;
//   * when the caller asks (EncodeJob/DecodeJob::stream) and the fp32 output
//     is 64-byte aligned, whole words of residualOut (encode) or of the
//     output (plain decode) are written with streaming stores, and the kernel
//     ends with a store fence; the values are the same;
//   * int2, int4 and int8 find the block's max|z| in a first walk and write
//     codes and residuals in the second, 32 elements (four vectors) at a time:
//     z / s is a true division, rounded to nearest even, clamped, then packed
//     to bytes (packs + permute) and to nibbles or 2-bit fields (maddubs);
//     decode shifts each field to the top of a lane and back, arithmetically;
//   * the other codecs (none, fp16, bf16) use the scalar kernels.
// Everything here has internal linkage and avoids out-of-line helpers from
// shared headers: this file is compiled with -mavx2, and a shared inline
// function emitted here could be picked by the linker for scalar callers.
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

// ---- reading the input as fp32 -------------------------------------------

// Eight (vector) or one (scalar, for tails) input elements widened to fp32.
// The widening is exact, so both agree with the reference's loadElement.
template <DType kDType>
struct Input;

template <>
struct Input<DType::kF32> {
  static constexpr size_t kBytes = 4;
  static __m256 load8(const uint8_t* p, size_t i) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p + 4 * i));
  }
  static float load1(const uint8_t* p, size_t i) { return loadFloat(p, i); }
};

template <>
struct Input<DType::kF16> {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p, size_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
  }
  static float load1(const uint8_t* p, size_t i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return halfToFloat(h);
  }
};

template <>
struct Input<DType::kBf16> {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p, size_t i) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static float load1(const uint8_t* p, size_t i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return bf16ToFloat(h);
  }
};

// z = x + e, or x alone without error feedback (adding 0.0 would turn -0.0
// into +0.0, so the reference does not, and neither do we).
template <DType kDType, bool kEf>
struct ZSource {
  const uint8_t* x;
  const float* e;

  __m256 load8(size_t i) const {
    const __m256 v = Input<kDType>::load8(x, i);
    if constexpr (kEf) return _mm256_add_ps(v, _mm256_loadu_ps(e + i));
    return v;
  }
  float load1(size_t i) const {
    const float v = Input<kDType>::load1(x, i);
    if constexpr (kEf) return v + e[i];
    return v;
  }
};

// ---- onebit encode -------------------------------------------------------

// What a scale lane accumulates: |z| (meanabs) or z * z (rms; a separate
// multiply and add, never an FMA).
template <Scale kScale>
__m256 term8(__m256 z) {
  if constexpr (kScale == Scale::kRms) return _mm256_mul_ps(z, z);
  return _mm256_and_ps(z, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

template <Scale kScale>
float term1(float z) {
  if constexpr (kScale == Scale::kRms) return z * z;
  return absf(z);
}

// foldLanes on lanes held as acc[0..3] = lanes 0-7, 8-15, 16-23, 24-31.
float foldAccumulators(const __m256 acc[4]) {
  const __m256 w16lo = _mm256_add_ps(acc[0], acc[2]);  // lanes 0-7 after w = 16
  const __m256 w16hi = _mm256_add_ps(acc[1], acc[3]);  // lanes 8-15 after w = 16
  const __m256 w8 = _mm256_add_ps(w16lo, w16hi);       // lanes 0-7 after w = 8
  const __m128 w4 = _mm_add_ps(_mm256_castps256_ps128(w8), _mm256_extractf128_ps(w8, 1));
  const __m128 w2 = _mm_add_ps(w4, _mm_movehl_ps(w4, w4));
  const __m128 w1 = _mm_add_ss(w2, _mm_shuffle_ps(w2, w2, 1));
  return _mm_cvtss_f32(w1);
}

// The sum of a block's terms in the canonical 32-lane order.
template <Scale kScale, typename Source>
float blockSum(const Source& src, size_t start, size_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < 4; ++k)
      acc[k] =
          _mm256_add_ps(acc[k], term8<kScale>(src.load8(start + i + 8 * static_cast<size_t>(k))));
  }
  if (i == n) return foldAccumulators(acc);
  // The last block of a buffer may end mid-chunk: finish lane by lane.
  float lanes[kLanes];
  for (int k = 0; k < 4; ++k) _mm256_storeu_ps(lanes + 8 * static_cast<size_t>(k), acc[k]);
  for (size_t lane = 0; i < n; ++i, ++lane) lanes[lane] += term1<kScale>(src.load1(start + i));
  return foldLanes(lanes);
}

template <Scale kScale>
float scaleFromSum(float sum, size_t n) {
  const float mean = sum / static_cast<float>(n);
  if constexpr (kScale == Scale::kRms) return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(mean)));
  return mean;
}

// Signs of 64 elements from `first` as one word; with error feedback also
// writes residualOut = z - (bit ? s : -s), with streaming stores when
// kStream (eOut + first is then 64-byte aligned, see streamStores).
template <bool kEf, bool kStream = false, typename Source>
uint64_t encodeWord(const Source& src, size_t first, __m256 s, __m256 negS, float* eOut) {
  uint64_t word = 0;
  for (int k = 0; k < 8; ++k) {
    const size_t i = first + 8 * static_cast<size_t>(k);
    const __m256 z = src.load8(i);
    const __m256 positive = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_GE_OQ);  // NaN: 0
    word |= static_cast<uint64_t>(_mm256_movemask_ps(positive)) << (8 * k);
    if constexpr (kEf) {
      const __m256 e = _mm256_sub_ps(z, _mm256_blendv_ps(negS, s, positive));
      if constexpr (kStream) {
        _mm256_stream_ps(eOut + i, e);
      } else {
        _mm256_storeu_ps(eOut + i, e);
      }
    }
  }
  return word;
}

// The buffer's last word may be cut short. It is staged through a zero-padded
// 64-element copy so that the same vector operations run: a scalar version
// would invite the compiler to rewrite z - (-s) as z + s, which differs from
// the reference in the sign of a NaN.
template <DType kDType, bool kEf>
uint64_t encodePartialWord(const ZSource<kDType, kEf>& src, size_t first, size_t count, __m256 s,
                           __m256 negS, float* eOut) {
  constexpr size_t kBytes = Input<kDType>::kBytes;
  alignas(32) uint8_t x[64 * kBytes] = {};
  alignas(32) float e[64] = {};
  alignas(32) float eStaged[64];
  std::memcpy(x, src.x + first * kBytes, count * kBytes);
  if constexpr (kEf) std::memcpy(e, src.e + first, count * 4);
  const ZSource<kDType, kEf> staged{x, e};
  const uint64_t word = encodeWord<kEf>(staged, 0, s, negS, eStaged);
  if constexpr (kEf) std::memcpy(eOut + first, eStaged, count * 4);
  return word & ((uint64_t{1} << count) - 1);
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

    const __m256 sv = _mm256_set1_ps(s);
    const __m256 negSv = _mm256_set1_ps(-s);
    const size_t end = start + n;
    size_t i = start;
    for (; i + 64 <= end; i += 64) {
      const uint64_t word = encodeWord<kEf, kStream>(src, i, sv, negSv, eOut);
      std::memcpy(words + i / 8, &word, 8);
    }
    if (i < end) {
      const uint64_t word = encodePartialWord(src, i, end - i, sv, negSv, eOut);
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

// Element 8k + j of a 32-bit half word is bit 8k + j; shifting it left by
// 31 - (8k + j) puts it in the sign bit, which is what blendv tests.
__m256i signShifts(int k) {
  const int base = 31 - 8 * k;
  return _mm256_setr_epi32(base, base - 1, base - 2, base - 3, base - 4, base - 5, base - 6,
                           base - 7);
}

template <bool kAccumulate, bool kStream>
void decodeWord(uint64_t word, __m256 pos, __m256 neg, float* out) {
  const __m256i halves[2] = {_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(word))),
                             _mm256_set1_epi32(static_cast<int>(word >> 32))};
  for (int k = 0; k < 8; ++k) {
    const __m256i bitsInSign = _mm256_sllv_epi32(halves[k / 4], signShifts(k % 4));
    __m256 d = _mm256_blendv_ps(neg, pos, _mm256_castsi256_ps(bitsInSign));
    if constexpr (kAccumulate)
      d = _mm256_add_ps(_mm256_loadu_ps(out + 8 * static_cast<size_t>(k)), d);
    if constexpr (kStream) {
      _mm256_stream_ps(out + 8 * static_cast<size_t>(k), d);
    } else {
      _mm256_storeu_ps(out + 8 * static_cast<size_t>(k), d);
    }
  }
}

template <bool kAccumulate, bool kStream>
void onebitDecodeWith(const DecodeJob& job) {
  const uint8_t* scales = job.payload;
  const uint8_t* words = job.payload + job.layout.dataOffset;
  float* out = job.output;
  const size_t block = job.spec.block;
  for (size_t b = 0; b < job.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t end = start + minSize(block, job.count - start);
    const BlockValues v = blockValues(loadFloat(scales, b));
    const __m256 pos = _mm256_set1_ps(v.pos);
    const __m256 neg = _mm256_set1_ps(v.neg);
    size_t i = start;
    for (; i + 64 <= end; i += 64) {
      uint64_t word;
      std::memcpy(&word, words + i / 8, 8);
      decodeWord<kAccumulate, kStream>(word, pos, neg, out + i);
    }
    if (i < end) {
      uint64_t word;
      std::memcpy(&word, words + i / 8, 8);
      for (; i < end; ++i) {
        const float d = ((word >> (i % 64)) & 1u) != 0 ? v.pos : v.neg;
        out[i] = kAccumulate ? out[i] + d : d;
      }
    }
  }
  if constexpr (kStream) _mm_sfence();
}

template <bool kAccumulate>
void onebitDecode(const DecodeJob& job) {
  if (!kAccumulate && streamStores(job.stream, job.output)) {
    onebitDecodeWith<false, true>(job);
  } else {
    onebitDecodeWith<kAccumulate, false>(job);
  }
}

// ---- onebit sums of several encodings ---------------------------------------

// divideAll's arithmetic on a vector: the exact inverse's product for a power
// of two, else the division.
struct Divide {
  int divisor;
  bool byProduct;
  __m256 factor;

  explicit Divide(int d)
      : divisor(d),
        byProduct(divideByProduct(d)),
        factor(_mm256_set1_ps(byProduct ? 1.0f / static_cast<float>(d) : static_cast<float>(d))) {}
  __m256 apply(__m256 v) const {
    return byProduct ? _mm256_mul_ps(v, factor) : _mm256_div_ps(v, factor);
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
  __m256 pos[kMaxSumEncodings], neg[kMaxSumEncodings];
  float posS[kMaxSumEncodings], negS[kMaxSumEncodings];
  for (size_t b = 0; b < first.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t end = start + minSize(block, first.count - start);
    for (size_t j = 0; j < n; ++j) {
      const BlockValues v = blockValues(loadFloat(jobs[j].payload, b));
      posS[j] = v.pos;
      negS[j] = v.neg;
      pos[j] = _mm256_set1_ps(v.pos);
      neg[j] = _mm256_set1_ps(v.neg);
    }
    size_t i = start;
    for (; i + 64 <= end; i += 64) {
      // Half a word (32 elements, four vectors) at a time keeps the sums in
      // registers.
      for (int half = 0; half < 2; ++half) {
        // The values of encoding j's quarter k of this half word.
        auto values = [&](size_t j, int k) {
          uint32_t bits;
          std::memcpy(&bits, jobs[j].payload + dataOffset + i / 8 + 4 * static_cast<size_t>(half),
                      4);
          const __m256i bitsInSign =
              _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), signShifts(k));
          return _mm256_blendv_ps(neg[j], pos[j], _mm256_castsi256_ps(bitsInSign));
        };
        __m256 sum[4];
        for (int k = 0; k < 4; ++k) sum[k] = values(0, k);
        for (size_t j = 1; j < n; ++j) {
          for (int k = 0; k < 4; ++k) sum[k] = _mm256_add_ps(sum[k], values(j, k));
        }
        float* o = out + i + 32 * static_cast<size_t>(half);
        for (int k = 0; k < 4; ++k) {
          const __m256 v = kDivide ? divide.apply(sum[k]) : sum[k];
          if constexpr (kStream) {
            _mm256_stream_ps(o + 8 * static_cast<size_t>(k), v);
          } else {
            _mm256_storeu_ps(o + 8 * static_cast<size_t>(k), v);
          }
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

// s = max|z| / L per block, q = clamp(roundEven(z / s), -L, L): the same IEEE
// operations as the reference (a true division, round-to-nearest-even, min
// and max), eight lanes at a time. The block's max|z| is an integer max of
// the magnitudes' bits, which orders finite magnitudes as floats do and puts
// an infinity or a NaN above every finite one, so one reduction gives both
// the scale and the finite test (the max is order-independent, so any lane
// order gives the reference's value).
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

template <typename Source>
uint32_t blockMaxBits(const Source& src, size_t start, size_t n) {
  const __m256i absMask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      const __m256i m = _mm256_and_si256(
          _mm256_castps_si256(src.load8(start + i + 8 * static_cast<size_t>(k))), absMask);
      acc[k] = _mm256_max_epu32(acc[k], m);
    }
  }
  for (; i + 8 <= n; i += 8)
    acc[0] = _mm256_max_epu32(acc[0],
                              _mm256_and_si256(_mm256_castps_si256(src.load8(start + i)), absMask));
  const __m256i m8 =
      _mm256_max_epu32(_mm256_max_epu32(acc[0], acc[1]), _mm256_max_epu32(acc[2], acc[3]));
  const __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(m8), _mm256_extracti128_si256(m8, 1));
  const __m128i m2 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
  const __m128i m1 = _mm_max_epu32(m2, _mm_shuffle_epi32(m2, 0xb1));
  uint32_t best = static_cast<uint32_t>(_mm_cvtsi128_si32(m1));
  for (; i < n; ++i) {  // the buffer's last block may end mid-vector
    const uint32_t bits = floatBits(src.load1(start + i)) & kAbsMask;
    best = bits > best ? bits : best;
  }
  return best;
}

// 32 codes q (int32, |q| <= 127, four vectors of eight in element order) as
// 32 bytes in element order.
__m256i codeBytes(const __m256i q[4]) {
  const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);  // per lane: q0 q1 quads
  const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
  const __m256i bytes = _mm256_packs_epi16(p01, p23);  // dword 4m + L: q[m] quad L
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Packs 32 codes into 32 * kBits / 8 bytes at `out`: the wire's two's
// complement fields, element i of the run at bit kBits * i.
template <int kBits>
void storeCodes(const __m256i q[4], uint8_t* out) {
  const __m256i codes = codeBytes(q);
  if constexpr (kBits == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), codes);
  } else if constexpr (kBits == 4) {
    // Each byte pair (even element low) becomes lo + 16 * hi in a word.
    const __m256i fields = _mm256_and_si256(codes, _mm256_set1_epi8(0x0f));
    const __m256i words = _mm256_maddubs_epi16(fields, _mm256_set1_epi16(0x1001));
    const __m256i packed = _mm256_packus_epi16(words, words);        // lane L: its 8 bytes twice
    const __m256i ordered = _mm256_permute4x64_epi64(packed, 0x08);  // qwords 0, 2
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(ordered));
  } else {
    static_assert(kBits == 2);
    const __m256i fields = _mm256_and_si256(codes, _mm256_set1_epi8(0x03));
    const __m256i pairs = _mm256_maddubs_epi16(fields, _mm256_set1_epi16(0x0401));  // a + 4b
    const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x00100001));  // + 16 (c + 4d)
    // Byte 0 of each dword, lane by lane, then the two lanes' four bytes.
    const __m256i gathered = _mm256_shuffle_epi8(
        quads, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4,
                                8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(gathered, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(ordered));
  }
}

// 32 elements from `first`: their codes into out (32 * kBits / 8 bytes) and,
// with error feedback, residualOut = z - r * s (a product then a difference,
// as the reference). kLive is false for a block whose scale is zero or not
// finite: r = 0 there, and the residual is still z - 0 * s.
template <int kBits, bool kLive, bool kEf, bool kStream, typename Source>
void encodeRun32(const Source& src, size_t first, __m256 s, float* eOut, uint8_t* out) {
  constexpr float kLevels = static_cast<float>((1 << (kBits - 1)) - 1);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    const size_t i = first + 8 * static_cast<size_t>(k);
    const __m256 z = src.load8(i);
    __m256 r = _mm256_setzero_ps();
    if constexpr (kLive) {
      r = _mm256_round_ps(_mm256_div_ps(z, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-kLevels)), _mm256_set1_ps(kLevels));
    }
    q[k] = _mm256_cvttps_epi32(r);
    if constexpr (kEf) {
      const __m256 e = _mm256_sub_ps(z, _mm256_mul_ps(r, s));
      if constexpr (kStream) {
        _mm256_stream_ps(eOut + i, e);
      } else {
        _mm256_storeu_ps(eOut + i, e);
      }
    }
  }
  storeCodes<kBits>(q, out);
}

// The buffer's last run of fewer than 32 elements, staged through a
// zero-padded copy so that the same vector operations run; only its own
// residuals and code bytes are written back.
template <int kBits, bool kLive, DType kDType, bool kEf>
void encodePartialRun(const ZSource<kDType, kEf>& src, size_t first, size_t count, __m256 s,
                      float* eOut, uint8_t* out) {
  constexpr size_t kBytes = Input<kDType>::kBytes;
  alignas(32) uint8_t x[32 * kBytes] = {};
  alignas(32) float e[32] = {};
  alignas(32) float eStaged[32];
  alignas(32) uint8_t codes[32];
  std::memcpy(x, src.x + first * kBytes, count * kBytes);
  if constexpr (kEf) std::memcpy(e, src.e + first, count * 4);
  const ZSource<kDType, kEf> staged{x, e};
  encodeRun32<kBits, kLive, kEf, false>(staged, 0, s, eStaged, codes);
  if constexpr (kEf) std::memcpy(eOut + first, eStaged, count * 4);
  std::memcpy(out, codes, (count * kBits + 7) / 8);
}

// With streaming residual stores, the second walk of a block reads only
// the caches; asking for the next block's x and e one run at a time then
// keeps memory busy meanwhile (into L2: the current block stays in L1).
// With cached stores the residual's read-for-ownership competes for the
// same line fills, and measured slower with the prefetch than without.
template <DType kDType, bool kEf>
void prefetchNextBlock(const ZSource<kDType, kEf>& src, size_t i) {
  constexpr size_t kBytes = Input<kDType>::kBytes;
  // Integer addresses: the last run's lines may lie past the buffer, which a
  // prefetch may touch but pointer arithmetic may not name (hence the casts
  // from integers, which a prefetch's address does not need optimised).
  constexpr size_t kElements = 32;  // one block of the vector loop
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

template <int kBits, bool kLive, DType kDType, bool kEf, bool kStream>
void encodeBlock(const ZSource<kDType, kEf>& src, size_t start, size_t end, size_t ahead, float s,
                 float* eOut, uint8_t* data) {
  const __m256 sv = _mm256_set1_ps(s);
  size_t i = start;
  for (; i + 32 <= end; i += 32) {
    if constexpr (kStream)
      if (ahead != 0) prefetchNextBlock(src, i + ahead);
    encodeRun32<kBits, kLive, kEf, kStream>(src, i, sv, eOut, data + i * kBits / 8);
  }
  if (i < end) encodePartialRun<kBits, kLive>(src, i, end - i, sv, eOut, data + i * kBits / 8);
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
      encodeBlock<kBits, true, kDType, kEf, kStream>(src, start, end, ahead, s, job.residualOut,
                                                     data);
    } else {
      encodeBlock<kBits, false, kDType, kEf, kStream>(src, start, end, ahead, s, job.residualOut,
                                                      data);
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

// Eight codes from element `i` (a multiple of 8 from a block start, so a
// whole number of bytes in), sign-extended to int32: each field is shifted
// to the top of its lane, then arithmetically back down.
template <int kBits>
__m256i loadCodes8(const uint8_t* data, size_t i) {
  if constexpr (kBits == 8) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(data + i)));
  } else if constexpr (kBits == 4) {
    uint32_t w;
    std::memcpy(&w, data + i / 2, 4);
    const __m256i top = _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                          _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0));
    return _mm256_srai_epi32(top, 28);
  } else {
    static_assert(kBits == 2);
    uint16_t w;
    std::memcpy(&w, data + i / 4, 2);
    const __m256i top = _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                          _mm256_setr_epi32(30, 28, 26, 24, 22, 20, 18, 16));
    return _mm256_srai_epi32(top, 30);
  }
}

// Element i's code, for the tails (as the reference's IntCode::read).
template <int kBits>
int readCode(const uint8_t* data, size_t i) {
  constexpr size_t kPerByte = 8 / kBits;
  constexpr unsigned kMask = (1u << kBits) - 1u;
  const unsigned field = (data[i / kPerByte] >> (kBits * (i % kPerByte))) & kMask;
  return static_cast<int>(field) - (field >= (kMask + 1) / 2 ? static_cast<int>(kMask) + 1 : 0);
}

template <bool kAccumulate, bool kStream>
void storeDecoded(float* o, __m256 d) {
  if constexpr (kAccumulate) d = _mm256_add_ps(_mm256_loadu_ps(o), d);
  if constexpr (kStream) {
    _mm256_stream_ps(o, d);
  } else {
    _mm256_storeu_ps(o, d);
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
    const bool live = isFinite(s) && s != 0.0f;
    const float fill = isFinite(s) ? 0.0f : bitsFloat(kNanBits);
    const __m256 sv = _mm256_set1_ps(s);
    const __m256 fillv = _mm256_set1_ps(fill);
    size_t i = start;
    if (live) {
      for (; i + 32 <= end; i += 32) {
        for (int k = 0; k < 4; ++k) {
          const size_t at = i + 8 * static_cast<size_t>(k);
          const __m256 d = _mm256_mul_ps(_mm256_cvtepi32_ps(loadCodes8<kBits>(data, at)), sv);
          storeDecoded<kAccumulate, kStream>(out + at, d);
        }
      }
      for (; i + 8 <= end; i += 8)
        storeDecoded<kAccumulate, kStream>(
            out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(loadCodes8<kBits>(data, i)), sv));
      for (; i < end; ++i) {
        const float d = static_cast<float>(readCode<kBits>(data, i)) * s;
        out[i] = kAccumulate ? out[i] + d : d;
      }
    } else {
      for (; i + 8 <= end; i += 8) storeDecoded<kAccumulate, kStream>(out + i, fillv);
      for (; i < end; ++i) out[i] = kAccumulate ? out[i] + fill : fill;
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
void widenBf16Avx2(const uint16_t* from, float* to, size_t n) { widenBf16Loop(from, to, n); }
void narrowBf16Avx2(const float* from, uint16_t* to, size_t n) { narrowBf16Loop(from, to, n); }

KernelTable buildTable() {
  KernelTable t = scalarKernels();
  t.name = "avx2";
  t.widenBf16 = widenBf16Avx2;
  t.narrowToBf16 = narrowBf16Avx2;
  t.codecs[static_cast<int>(CodecId::kOnebit)] = {onebitEncodeAny, onebitDecode<false>,
                                                  onebitDecode<true>, onebitSum};
  t.codecs[static_cast<int>(CodecId::kInt8)] = intKernels<CodecId::kInt8>();
  t.codecs[static_cast<int>(CodecId::kInt4)] = intKernels<CodecId::kInt4>();
  t.codecs[static_cast<int>(CodecId::kInt2)] = intKernels<CodecId::kInt2>();
  return t;
}

}  // namespace

const KernelTable& avx2Kernels() {
  static const KernelTable table = buildTable();
  return table;
}

}  // namespace squall::codec
