// The scalar reference implementation: the test oracle for every other
// implementation, written for clarity rather than speed. See wire.h for the
// format and numeric.h for the canonical order of the scale reductions.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/codec/kernels.h"
#include "src/codec/numeric.h"

namespace squall::codec {
namespace {

constexpr uint32_t kNanBits = 0x7fc00000u;

float loadElement(const void* input, DType dtype, size_t i) {
  const auto* bytes = static_cast<const uint8_t*>(input);
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, bytes + 4 * i, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      return halfToFloat(h);
    }
    case DType::kBf16: {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      return bf16ToFloat(h);
    }
  }
  return 0.0f;
}

// z = x + e, the value the codec transmits (x alone without error feedback).
float loadZ(const EncodeJob& job, size_t i) {
  float x = loadElement(job.input, job.dtype, i);
  return job.residualIn != nullptr ? x + job.residualIn[i] : x;
}

template <typename T>
T loadAt(const uint8_t* base, size_t index) {
  T v;
  std::memcpy(&v, base + sizeof(T) * index, sizeof(T));
  return v;
}

template <typename T>
void storeAt(uint8_t* base, size_t index, T v) {
  std::memcpy(base + sizeof(T) * index, &v, sizeof(T));
}

// ---- onebit ------------------------------------------------------------

float onebitScale(const EncodeJob& job, size_t start, size_t n) {
  float lanes[kLanes] = {};
  for (size_t i = 0; i < n; ++i) {
    const float z = loadZ(job, start + i);
    lanes[i % kLanes] += job.spec.scale == Scale::kRms ? z * z : absf(z);
  }
  const float sum = foldLanes(lanes);
  const float mean = sum / static_cast<float>(n);
  return job.spec.scale == Scale::kRms ? std::sqrt(mean) : mean;
}

bool onebitEncode(const EncodeJob& job) {
  uint8_t* scales = job.payload;
  uint8_t* words = job.payload + job.layout.dataOffset;
  const size_t block = job.spec.block;
  bool finite = true;
  for (size_t b = 0; b < job.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t n = std::min(block, job.count - start);
    const float s = canonicalScale(onebitScale(job, start, n));
    storeAt<float>(scales, b, s);
    finite = finite && isFinite(s);
    for (size_t w = start / 64; w * 64 < start + n; ++w) {
      uint64_t word = 0;
      const size_t end = std::min(start + n, w * 64 + 64);
      for (size_t i = w * 64; i < end; ++i) {
        const float z = loadZ(job, i);
        const bool bit = z >= 0.0f;
        word |= static_cast<uint64_t>(bit) << (i % 64);
        if (job.residualIn != nullptr) job.residualOut[i] = z - (bit ? s : -s);
      }
      storeAt<uint64_t>(words, w, word);
    }
  }
  return finite;
}

// The decoded value of element i of a block with scale s.
float onebitValue(float s, uint64_t word, size_t i) {
  if (!isFinite(s)) return bitsFloat(kNanBits);
  if (s == 0.0f) return 0.0f;
  return ((word >> (i % 64)) & 1u) != 0 ? s : -s;
}

template <bool kAccumulate>
void onebitDecode(const DecodeJob& job) {
  const uint8_t* scales = job.payload;
  const uint8_t* words = job.payload + job.layout.dataOffset;
  for (size_t i = 0; i < job.count; ++i) {
    const float s = loadAt<float>(scales, i / job.spec.block);
    const float d = onebitValue(s, loadAt<uint64_t>(words, i / 64), i);
    job.output[i] = kAccumulate ? job.output[i] + d : d;
  }
}

// ---- int2, int4, int8: block-scaled integers -----------------------------

// Element i's code: int8 stores q as a byte; int4 and int2 pack 8 / bits
// two's complement codes into each byte, element i at bit bits * (i % per).
template <CodecId kCodec>
struct IntCode {
  static constexpr int kBits = intBits(kCodec);
  static constexpr size_t kPerByte = 8 / kBits;
  static constexpr unsigned kMask = (1u << kBits) - 1u;
  static int read(const uint8_t* data, size_t i) {
    const unsigned field = (data[i / kPerByte] >> (kBits * (i % kPerByte))) & kMask;
    // Sign-extend the field: codes at or above 2^(bits-1) are negative.
    return static_cast<int>(field) - (field >= (kMask + 1) / 2 ? static_cast<int>(kMask) + 1 : 0);
  }
};

template <CodecId kCodec>
bool intEncode(const EncodeJob& job) {
  using Code = IntCode<kCodec>;
  constexpr float kLevels = static_cast<float>(intLevels(kCodec));
  uint8_t* scales = job.payload;
  uint8_t* data = job.payload + job.layout.dataOffset;
  const size_t block = job.spec.block;
  bool finite = true;
  for (size_t b = 0; b < job.layout.blocks; ++b) {
    const size_t start = b * block;
    const size_t n = std::min(block, job.count - start);
    float maxAbs = 0.0f;
    bool blockFinite = true;
    for (size_t i = start; i < start + n; ++i) {
      const float z = loadZ(job, i);
      blockFinite = blockFinite && isFinite(z);
      maxAbs = std::max(maxAbs, absf(z));
    }
    const float s = blockFinite ? maxAbs / kLevels : bitsFloat(kNanBits);
    storeAt<float>(scales, b, s);
    finite = finite && blockFinite;
    // A block starts at a multiple of 64 elements, so it starts a byte.
    unsigned byte = 0;
    for (size_t i = start; i < start + n; ++i) {
      const float z = loadZ(job, i);
      float r = 0.0f;
      if (blockFinite && s != 0.0f) r = std::clamp(roundEven(z / s), -kLevels, kLevels);
      const unsigned field = static_cast<unsigned>(static_cast<int>(r)) & Code::kMask;
      byte |= field << (Code::kBits * (i % Code::kPerByte));
      if ((i + 1) % Code::kPerByte == 0 || i + 1 == start + n) {
        data[i / Code::kPerByte] = static_cast<uint8_t>(byte);
        byte = 0;
      }
      if (job.residualIn != nullptr) job.residualOut[i] = z - r * s;
    }
  }
  return finite;
}

template <CodecId kCodec, bool kAccumulate>
void intDecode(const DecodeJob& job) {
  const uint8_t* scales = job.payload;
  const uint8_t* data = job.payload + job.layout.dataOffset;
  for (size_t i = 0; i < job.count; ++i) {
    const float s = loadAt<float>(scales, i / job.spec.block);
    float d = 0.0f;
    if (!isFinite(s))
      d = bitsFloat(kNanBits);
    else if (s != 0.0f)
      d = static_cast<float>(IntCode<kCodec>::read(data, i)) * s;
    job.output[i] = kAccumulate ? job.output[i] + d : d;
  }
}

template <CodecId kCodec>
constexpr CodecKernels intKernels() {
  return {intEncode<kCodec>, intDecode<kCodec, false>, intDecode<kCodec, true>};
}

// ---- none / fp16 / bf16: element-wise ----------------------------------

struct Fp32Format {
  using Word = float;
  static Word encode(float z) { return z; }
  static float decode(Word w) { return w; }
};
struct Fp16Format {
  using Word = uint16_t;
  static Word encode(float z) { return floatToHalf(z); }
  static float decode(Word w) { return halfToFloat(w); }
};
struct Bf16Format {
  using Word = uint16_t;
  static Word encode(float z) { return floatToBf16(z); }
  static float decode(Word w) { return bf16ToFloat(w); }
};

template <typename Format>
bool elementwiseEncode(const EncodeJob& job) {
  bool finite = true;
  for (size_t i = 0; i < job.count; ++i) {
    const float z = loadZ(job, i);
    const typename Format::Word w = Format::encode(z);
    storeAt(job.payload, i, w);
    const float d = Format::decode(w);
    finite = finite && isFinite(d);
    if (job.residualIn != nullptr) job.residualOut[i] = z - d;
  }
  return finite;
}

template <typename Format, bool kAccumulate>
void elementwiseDecode(const DecodeJob& job) {
  for (size_t i = 0; i < job.count; ++i) {
    const float d = Format::decode(loadAt<typename Format::Word>(job.payload, i));
    job.output[i] = kAccumulate ? job.output[i] + d : d;
  }
}

template <typename Format>
constexpr CodecKernels elementwiseKernels() {
  return {elementwiseEncode<Format>, elementwiseDecode<Format, false>,
          elementwiseDecode<Format, true>};
}

void widenBf16Scalar(const uint16_t* from, float* to, size_t n) { widenBf16Loop(from, to, n); }
void narrowBf16Scalar(const float* from, uint16_t* to, size_t n) { narrowBf16Loop(from, to, n); }

constexpr KernelTable kScalar = {
    "scalar",
    {
        elementwiseKernels<Fp32Format>(),                         // none
        {onebitEncode, onebitDecode<false>, onebitDecode<true>},  // onebit
        elementwiseKernels<Fp16Format>(),                         // fp16
        elementwiseKernels<Bf16Format>(),                         // bf16
        intKernels<CodecId::kInt8>(),                             // int8
        intKernels<CodecId::kInt2>(),                             // int2
        intKernels<CodecId::kInt4>(),                             // int4
    },
    widenBf16Scalar,
    narrowBf16Scalar,
};

}  // namespace

const KernelTable& scalarKernels() { return kScalar; }

}  // namespace squall::codec
