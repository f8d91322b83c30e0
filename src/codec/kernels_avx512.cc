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

// ---- the table -----------------------------------------------------------

KernelTable buildTable() {
  KernelTable t = scalarKernels();
  t.name = "avx512";
  t.codecs[static_cast<int>(CodecId::kOnebit)] = {onebitEncodeAny, onebitDecode<false>,
                                                  onebitDecode<true>, onebitSum};
  return t;
}

}  // namespace

const KernelTable& avx512Kernels() {
  static const KernelTable table = buildTable();
  return table;
}

}  // namespace squall::codec
