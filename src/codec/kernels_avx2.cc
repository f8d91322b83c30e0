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
//   * the other codecs (none, fp16, bf16, int8) use the scalar kernels.
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

// ---- the table -----------------------------------------------------------

KernelTable buildTable() {
  KernelTable t = scalarKernels();
  t.name = "avx2";
  t.codecs[static_cast<int>(CodecId::kOnebit)] = {onebitEncodeAny, onebitDecode<false>,
                                                  onebitDecode<true>, onebitSum};
  return t;
}

}  // namespace

const KernelTable& avx2Kernels() {
  static const KernelTable table = buildTable();
  return table;
}

}  // namespace squall::codec
